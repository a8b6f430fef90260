"""Writing a file in one step: a reader, or a process killed mid-write, sees the old file or the new one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable, Union

__all__ = ["write_atomic"]

Content = Union[bytes, str, Callable[[BinaryIO], object]]


def _file_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


FILE_MODE = _file_mode()  # what open() gives a new file; mkstemp's own is 0o600


def write_atomic(path: str | os.PathLike, content: Content) -> None:
    """Replace ``path`` with ``content`` (bytes, a UTF-8 str, or a callable writing into the open binary file) via
    a fsynced ``.<name>.<random>.tmp`` in its folder, renamed over it; the temporary is removed on any failure."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(content):
                content(f)
            else:
                f.write(content.encode() if isinstance(content, str) else content)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if os.name == "posix":  # the rename itself on disk
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
