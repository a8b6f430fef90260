"""The sweep's journal, ``points.jsonl``: a header line with the settings every point depends on (resuming with
others is refused), then one line per point, appended and flushed as it is measured. A line cut short by
a kill is dropped on reading (and cut from the file), so that point is measured again.
"""

import json
import os
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Tuple

from ..engine.errors import ConfigError
from ..engine.metrics import json_text
from ..engine.outputs import write_atomic

JOURNAL_NAME = "points.jsonl"
FORMAT = "weightformer bench points, version 1"

Key = Tuple[str, int, int, str]  # model, resolution, batch, measurement


class JournalMismatch(ConfigError):
    """A journal to resume from was measured with other settings (or is not a journal at all)."""


def _differences(old: Dict[str, Any], new: Dict[str, Any], prefix: str = "") -> Iterator[str]:
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if isinstance(a, dict) and isinstance(b, dict):
            yield from _differences(a, b, f"{prefix}{name}.")
        elif a != b:
            yield f"{prefix}{name} {a!r} there, {b!r} now"


def _is_point(record: Any) -> bool:
    """Whether ``record`` has the shape of a point line: its key (four plain values) and its row or FLOPs."""
    key = record.get("key") if isinstance(record, dict) else None
    return isinstance(key, list) and len(key) == 4 and all(isinstance(k, (str, int)) for k in key) \
        and isinstance(record.get("row", record.get("flops")), dict)


class Journal:
    """Append-only record of a sweep's points; ``entries``: key -> record."""

    def __init__(self, path: Path, settings: Dict[str, Any], resume: bool = False):
        self.path = Path(path)
        self.settings = settings
        self.entries: Dict[Key, Dict[str, Any]] = {}
        self.discarded = 0  # points of an earlier run thrown away because this one starts afresh
        if resume and self.path.exists():
            self._load()
        else:
            if self.path.exists():
                self.discarded = max(0, len(self.path.read_bytes().splitlines()) - 1)
            header = {"format": FORMAT, "settings": settings}
            write_atomic(self.path, (json_text(header) + "\n").encode())

    def _load(self) -> None:
        data = self.path.read_bytes()
        good = 0  # bytes up to the end of the last complete, readable line
        lines = data.split(b"\n")
        for number, line in enumerate(lines[:-1]):  # the piece after the last newline is never complete
            try:
                record = json.loads(line)
            except ValueError:
                if number == len(lines) - 2:
                    break  # a line cut short by a kill: drop it, its point is measured again
                raise JournalMismatch(f"{self.path} line {number + 1} is not JSON; move the file away to start afresh")
            if number == 0:
                self._check_header(record)
            elif not _is_point(record):
                raise JournalMismatch(f"{self.path} line {number + 1} is not a point of a journal; move the file away "
                                      f"to start afresh")
            else:
                self.entries[tuple(record["key"])] = record
            good += len(line) + 1
        if good == 0:
            raise JournalMismatch(f"{self.path} has no header line; move the file away to start afresh")
        if good < len(data):
            with open(self.path, "r+b") as f:
                f.truncate(good)

    def _check_header(self, header: Any) -> None:
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise JournalMismatch(
                f"{self.path} is not a journal of weightformer bench; move it away or use another --out"
            )
        changed = list(_differences(header.get("settings", {}), self.settings))
        if changed:
            raise JournalMismatch(
                f"cannot resume from {self.path}: its points were measured with other settings "
                f"({'; '.join(changed)}); rerun with the same settings, or without --resume to start afresh"
            )

    def get(self, key: Key) -> Optional[Dict[str, Any]]:
        return self.entries.get(key)

    def append(self, key: Key, record: Dict[str, Any]) -> None:
        entry = {"key": list(key), **record}
        line = (json_text(entry) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            written = os.write(fd, line)
            while written < len(line):  # a short write (rare on local files): finish the line
                written += os.write(fd, line[written:])
            os.fsync(fd)
        finally:
            os.close(fd)
        self.entries[key] = entry
