"""Progress of a long loop outside training: a tqdm bar on a terminal, and off one a plain line at most every
:data:`PLAIN_LINE_SECONDS` and at the end, as timm's ``train.py`` logs."""

from __future__ import annotations

import sys
import time
from typing import Any, Iterable, Iterator, Optional, TextIO

from tqdm import tqdm

__all__ = ["PLAIN_LINE_SECONDS", "progress"]

PLAIN_LINE_SECONDS = 30.0  # off a terminal: at most one line this often


class _PlainLines:
    """tqdm's ``update``/``close`` for a stream that is no terminal: a line at most every interval."""

    def __init__(self, iterable: Optional[Iterable[Any]], total: Optional[int], desc: str, unit: str, stream: TextIO,
                 interval: float):
        self.iterable, self.desc, self.unit, self.stream, self.interval = iterable, desc, unit, stream, interval
        self.total = total if total is not None else (len(iterable) if hasattr(iterable, "__len__") else None)
        self.count, self.lines, self.printed, self.closed = 0, 0, -1, False
        self.start = self.last = time.perf_counter()

    def __iter__(self) -> Iterator[Any]:
        try:
            for item in self.iterable or ():
                yield item
                self.update(1)
        finally:
            self.close()

    def update(self, n: int = 1) -> None:
        self.count += n
        now = time.perf_counter()
        if now - self.last >= self.interval:
            self.last = now
            self._line(now)

    def _line(self, now: float) -> None:
        of = f"/{self.total}" if self.total is not None else ""
        rate = self.count / max(now - self.start, 1e-9)
        self.stream.write(f"{self.desc}: {self.count}{of} {self.unit} ({rate:.1f} {self.unit}/s)\n")
        self.stream.flush()
        self.lines += 1
        self.printed = self.count

    def close(self) -> None:
        """The last count, if the loop was long enough to print any line (a short one stays silent)."""
        if self.lines and not self.closed and self.printed != self.count:
            self._line(time.perf_counter())
        self.closed = True

    def __enter__(self) -> "_PlainLines":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def progress(iterable: Optional[Iterable[Any]] = None, *, total: Optional[int] = None, desc: str = "",
             unit: str = "it", enabled: bool = True, stream: Optional[TextIO] = None,
             interval: float = PLAIN_LINE_SECONDS, delay: float = 0.0) -> Any:
    """Wrap ``iterable`` (or count ``update(n)`` calls up to ``total``), as tqdm, with progress on ``stream``
    (stderr): a bar on a terminal (after ``delay`` s), plain lines off one, nothing unless ``enabled``."""
    stream = stream if stream is not None else sys.stderr
    if not enabled:
        return tqdm(iterable, total=total, disable=True)
    if stream.isatty():
        return tqdm(iterable, total=total, desc=desc, unit=unit, leave=False, dynamic_ncols=True, file=stream,
                    delay=delay)
    return _PlainLines(iterable, total, desc, unit, stream, interval)
