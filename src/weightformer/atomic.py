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
    a fsynced ``.<name>.<random>.tmp`` in its folder, renamed over it; the temporary is removed on any failure.
    A write that fails for want of space, of the file-size limit or of a shorter name raises
    :class:`weightformer.engine.errors.ResourceError` naming ``path`` and the cause, the old file untouched."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:200]}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            if callable(content):
                content(f)
            else:
                f.write(content.encode() if isinstance(content, str) else content)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    except BaseException as exc:
        from .engine.errors import resource_error

        found = resource_error(exc, path, tmp) if isinstance(exc, Exception) else None  # before tmp goes
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if found is not None:
            raise found from exc
        raise
    if os.name == "posix":  # the rename itself on disk
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
