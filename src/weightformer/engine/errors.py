"""Error types the CLI reports as one line, without a traceback: a user's mistakes (``USER_ERRORS``, exit 2)
and what the machine could not give (:class:`ResourceError`, out of memory; exit 1)."""

from __future__ import annotations

import errno
import os
import re
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

from ..checkpoint import CheckpointError
from ..data.errors import DataError

__all__ = ["ConfigError", "NonFiniteError", "ResourceError", "TrainingDivergedError", "USER_ERRORS", "brief",
           "is_out_of_memory", "is_signature_error", "model_arguments_checked", "permission_error",
           "resource_error"]


class ConfigError(ValueError):
    """A setting, flag or config file that cannot be used as given."""


class NonFiniteError(RuntimeError):
    """A model's outputs or loss that are not finite numbers: no result is reported (one line, exit 1)."""


class TrainingDivergedError(NonFiniteError):
    """The loss became NaN or infinite: the run stops before the update, keeping its last good checkpoint."""


class ResourceError(OSError):
    """What the machine cannot give: a file that could not be written for want of space, of the file-size limit,
    of a shorter name or of a writable file system (one line naming the file and the cause), or a setting that
    needs more memory than there is; never the user's mistake nor a bug."""

    def __str__(self) -> str:
        return str(self.args[0])


USER_ERRORS: tuple[type[Exception], ...] = (ConfigError, DataError, CheckpointError)

_CAUSES = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
           errno.EFBIG: "file too large", errno.ENAMETOOLONG: "file name too long",
           errno.EROFS: "read-only file system"}
_OS_ERROR = re.compile(r"\(os error (\d+)\)")  # how Rust's io::Error (safetensors) names an errno


def _chain(exc: Optional[BaseException]) -> Iterator[BaseException]:
    """``exc`` and the exceptions behind it (each one's cause, else its context), each once."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _resource_os_error(exc: BaseException) -> tuple[Optional[int], Optional[str]]:
    """The resource errno that ``exc`` or an exception behind it carries, and the file it names (torch.save's
    "unexpected pos" error has the file's OSError as its context; safetensors says "(os error 28)")."""
    for link in _chain(exc):
        if isinstance(link, OSError) and link.errno in _CAUSES:
            return link.errno, link.filename
        found = _OS_ERROR.search(str(link))
        if found and int(found.group(1)) in _CAUSES:
            return int(found.group(1)), None
    return None, None


def _statvfs(folder: Path) -> Optional[os.statvfs_result]:
    """The file system of ``folder``, or of its nearest existing parent."""
    while not os.path.isdir(folder) and folder != folder.parent:  # (isdir is False for a name too long)
        folder = folder.parent
    try:
        return os.statvfs(folder)
    except OSError:
        return None


def _file_size_limit() -> Optional[int]:
    import resource

    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if limit == resource.RLIM_INFINITY else limit


def resource_error(exc: BaseException, path: "str | os.PathLike | None" = None,
                   staged: "str | os.PathLike | None" = None) -> Optional[ResourceError]:
    """The :class:`ResourceError` behind ``exc``, found from the errno it carries or, for a failed write of
    ``path`` through the temporary ``staged`` (a file or a folder) whose writer hid the errno, from the file
    system (no bytes free) and the file-size limit (a staged file that reached it); None for another cause."""
    code, named = _resource_os_error(exc)
    given = path or named
    path = Path(given or ".")
    fs, limit = _statvfs(path.parent) if given else None, _file_size_limit()
    free = None if fs is None else fs.f_bavail * fs.f_frsize
    if code is None and staged is not None and free == 0:
        code = errno.ENOSPC
    elif code is None and staged is not None and limit is not None:
        files = [Path(staged)] if Path(staged).is_file() else Path(staged).rglob("*")
        code = errno.EFBIG if any(f.is_file() and f.stat().st_size >= limit for f in files) else None
    if code is None:
        return None
    detail = {errno.ENOSPC: f"{free} bytes free" if free is not None else "",
              errno.EDQUOT: f"{free} bytes free" if free is not None else "",
              errno.EFBIG: f"ulimit -f allows {limit} bytes a file" if limit is not None else "",
              errno.ENAMETOOLONG: f"a name of {max(map(len, path.parts), default=0)} characters; this file system "
                                  f"allows {fs.f_namemax if fs else 255}"}.get(code, "")
    what = "a write failed" if not given else f"cannot {'use' if code == errno.ENAMETOOLONG else 'write'} {path}"
    error = ResourceError(f"{what}: {_CAUSES[code]}{f' ({detail})' if detail else ''}")
    error.errno, error.filename = code, str(path)
    return error


def permission_error(exc: BaseException) -> Optional[ConfigError]:
    """The user's error behind ``exc`` when it, or an exception behind it, is a file the user may not read or
    write (EACCES, EPERM): a path of someone else's, chosen by a flag, not the machine's failing."""
    for link in _chain(exc):
        if isinstance(link, OSError) and link.errno in (errno.EACCES, errno.EPERM):
            where = f"cannot use {link.filename}" if link.filename else "a file could not be used"
            return ConfigError(f"{where}: {link.strerror or 'permission denied'}; pass a path you may read and "
                               f"write, or change its permissions")
    return None


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is out of memory from any allocator: torch's (CUDA), the CPU allocator's ("can't allocate
    memory"), or Python's MemoryError (PIL, NumPy)."""
    if isinstance(exc, MemoryError):
        return True
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def brief(value: Any, limit: int = 200) -> str:
    """``repr(value)`` for a message, cut to ``limit`` characters with an ellipsis: a user's value never
    crowds out the rest of the line."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 1]}…"

# The TypeError Python raises when a call's keywords do not fit the signature (not one from inside the model).
_SIGNATURE_ERROR = re.compile(r"unexpected keyword argument|multiple values for (keyword )?argument")


def is_signature_error(exc: TypeError) -> bool:
    """Whether ``exc`` says a call's keywords do not fit the callee (bad ``--model-kwargs``), not a bug inside it."""
    return bool(_SIGNATURE_ERROR.search(str(exc)))


@contextmanager
def model_arguments_checked(what: str, kwargs: Mapping[str, Any], hint: str = "") -> Iterator[None]:
    """Build a model inside this block: a builder's refusal of the user's model kwargs (a keyword it does not
    take, a value it refuses) becomes one ConfigError naming ``what`` and the kwargs, ``hint`` (what the kwargs
    may hold) after it; any other TypeError is a bug and keeps its traceback."""
    try:
        yield
    except TypeError as exc:
        if not is_signature_error(exc):
            raise
        raise ConfigError(f"{what} does not take the model arguments {brief(dict(kwargs))}: {exc}; check --model-kwargs"
                          f"{hint}") from exc
    except (ValueError, AssertionError) as exc:  # timm checks some arguments with asserts (num_heads | embed_dim)
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
        raise ConfigError(f"cannot build {what} with model arguments {brief(dict(kwargs))}: {detail}; check "
                          f"--model-kwargs{hint}") from exc
