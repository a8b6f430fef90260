"""The options every bench command shares, defined once: ``weightformer bench``, ``bench dense`` and
``bench dit`` parse numbers, the device and the output folder the same way.

- A bad flag is one ``error:`` line on stderr and exit status 2 (:func:`one_line_error`).
- Numbers are finite and in range (:func:`number`): ``nan``, ``inf`` and out-of-range values are refused
  while parsing, before any work.
- ``--device`` is checked by :func:`check_device` (the engine's ``pick_device``): cpu, cuda, cuda:N or
  auto (the default: cuda where a GPU is visible, else cpu); cuda without a GPU is one line.
- ``--out`` and ``--overwrite``: :func:`add_overwrite_argument` here, the rule itself in
  :func:`weightformer.bench.report.claim_out_dir`.

Nothing here imports torch until a device is checked, so that a bench command's ``--help`` and a bad
flag answer at once.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any, Callable, List, Optional

__all__ = ["DEVICE_HELP", "add_overwrite_argument", "check_device", "check_number", "from_text", "number",
           "one_line_error", "parse_float", "parse_int", "strings"]

# The help of every bench command's --device, whose default is "auto".
DEVICE_HELP = "cpu, cuda, cuda:N or auto (default: auto, i.e. cuda where a GPU is visible, else cpu)"


def one_line_error(parser: argparse.ArgumentParser) -> Callable[[str], None]:
    """``parser.error`` for the bench: a user's mistake is one ``error:`` line on stderr and exit status 2."""

    def error(message: str) -> None:
        print(f"error: {message} (see {parser.prog} --help)", file=sys.stderr)
        sys.exit(2)

    return error


def from_text(parse: Callable[[str], Any], what: str) -> Callable[[str], Any]:
    """An argparse type: ``parse(text)``, turning its ValueError into argparse's one-line error."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error) or f"bad {what}: {text!r}") from None

    convert.__name__ = what  # argparse names the type in some messages
    return convert


def _parse(text: str, kind: Callable[[str], Any], what: str) -> Any:
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"expected {what}, got {text!r}") from None


def parse_int(text: str) -> int:
    return _parse(text, int, "an integer")


def parse_float(text: str) -> float:
    return _parse(text, float, "a number")


def strings(text: str) -> List[str]:
    """The non-empty, stripped parts of a comma-separated list."""
    return [part.strip() for part in text.split(",") if part.strip()]


def check_number(what: str, value: float, minimum: float, inclusive: bool = True,
                 maximum: Optional[float] = None) -> None:
    """Raise ``ValueError`` unless ``value`` is finite, at least (or above) ``minimum`` and at most ``maximum``."""
    ok = math.isfinite(value) and (value >= minimum if inclusive else value > minimum)
    if maximum is not None:
        ok = ok and value <= maximum
    if not ok:
        bound = f"{'>=' if inclusive else '>'} {minimum:g}" + (f" and <= {maximum:g}" if maximum is not None else "")
        raise ValueError(f"{what} must be a number {bound}, got {value!r}")


def number(minimum: float, inclusive: bool = True, integer: bool = False, maximum: Optional[float] = None,
           what: str = "the value") -> Callable[[str], Any]:
    """An argparse type: an integer (or a finite float) in range, else argparse's one-line error."""

    def parse(text: str) -> Any:
        value = parse_int(text) if integer else parse_float(text)
        check_number(what, value, minimum, inclusive, maximum)
        return value

    return from_text(parse, "an integer" if integer else "a number")


def check_device(device: str) -> str:
    """``device`` as the bench records it (``auto`` becomes cuda or cpu), checked by the engine's
    :func:`~weightformer.engine.device.pick_device`: a ``ConfigError`` (a ValueError) for a name that is
    no device, cuda without a GPU, or a GPU index this machine lacks."""
    from ..engine.device import pick_device

    picked = pick_device(str(device))
    return picked.type if device == "auto" else str(device)


def add_overwrite_argument(parser: argparse.ArgumentParser, names: str) -> None:
    """``--overwrite``: the rule of :func:`weightformer.bench.report.claim_out_dir`, in the help."""
    parser.add_argument("--overwrite", action="store_true",
                        help=f"move the {names} already in --out aside (<name>.previous-<time>, never deleted) "
                             f"instead of refusing to start")
