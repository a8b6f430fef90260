"""The run folder (``RUN_FILES``): checked before any work starts; a new run into one that holds a run is
refused unless it resumes (``--resume``) or starts anew (``--overwrite``), which moves the old run's files
into ``previous-<time>/`` inside the folder rather than deleting them. A run folder belongs to one process
(:func:`hold_run_folder`)."""

from __future__ import annotations

import os
import sys
import time
import warnings
from contextlib import contextmanager
from itertools import takewhile
from pathlib import Path
from typing import Iterator, Optional

from .errors import ConfigError, resource_error

try:
    import fcntl
except ImportError:  # no flock (Windows): runs are not guarded against a second process
    fcntl = None

__all__ = ["LOCK_FILE", "RUN_FILES", "check_run_folder", "check_writable_file", "check_writable_folder",
           "hold_run_folder", "start_run_folder", "unused_path"]

RUN_FILES = ("config.yaml", "metrics.jsonl", "last.pt", "best.pt", "curves.png")
LOCK_FILE = ".lock"  # held by the run's process; "<pid>\n<start time>\n<command>" in it


@contextmanager
def hold_run_folder(folder: Path, flag: str = "--output") -> Iterator[None]:
    """The block owns ``folder`` (made if needed): an exclusive ``flock`` on its :data:`LOCK_FILE`, which the
    kernel releases when the process ends however it ends; a ConfigError naming the process that holds it.
    Where no lock can be had (no ``fcntl``, a file system without locks), the block runs unguarded."""
    check_writable_folder(folder, flag)
    path = folder / LOCK_FILE
    fd = _locked(path, folder, flag) if fcntl is not None else None
    if fd is None:
        yield
        return
    program = Path(sys.argv[0]).parent.name if sys.argv[0].endswith("__main__.py") else Path(sys.argv[0]).name
    command = " ".join([program, *list(takewhile(lambda a: not a.startswith("-"), sys.argv[1:]))[:2]])
    try:
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n{time.strftime('%Y-%m-%d %H:%M')}\n{command}\n".encode())
        except OSError as exc:  # a full disk: reported with the file's name
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        yield
    finally:  # the lock file goes with the block, however it ends
        path.unlink(missing_ok=True)
        os.close(fd)


def _locked(path: Path, folder: Path, flag: str) -> Optional[int]:
    """An open descriptor of ``path`` holding its exclusive lock, or None where the file system has no locks."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # held by another process
            holder = os.pread(fd, 4096, 0).decode(errors="replace").split("\n", 2)
            os.close(fd)
            who = f"process {holder[0]} ({holder[2].strip()}, started {holder[1]})" if len(holder) == 3 else \
                "another process"
            raise ConfigError(f"{folder} is in use by {who}; wait for it to end or choose another {flag}") from None
        except OSError as exc:  # ENOLCK, EOPNOTSUPP: some network file systems
            os.close(fd)
            warnings.warn(f"{folder} cannot be locked ({exc.strerror}); nothing keeps a second run out of it")
            return None
        try:  # the file locked is still the one at ``path`` (not one a finishing holder just removed)
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def check_writable_folder(folder: Path, flag: str) -> None:
    """Create ``folder`` if needed and prove a file can be written in it, or raise ConfigError."""
    if folder.is_symlink() and not folder.exists():
        raise ConfigError(f"{flag} {folder} is a symbolic link to {os.readlink(folder)}, which does not exist; "
                          f"make its target folder, or pass another path")
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{flag} {folder} is a file, not a folder; pass a folder path")
    for parent in folder.parents:
        if parent.exists() and not parent.is_dir():
            raise ConfigError(f"{flag} {folder}: {parent} is a file, not a folder; give a folder path")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:  # a full disk is the machine's (ResourceError), a folder of someone else's the user's
        raise resource_error(exc) or ConfigError(f"cannot write to {flag} {folder} ({exc.strerror or exc}); pass a "
                                                 f"folder you can write to") from exc


def check_writable_file(path: Path, flag: str) -> None:
    """Before the work: ``path`` can be written (its folder exists or can be made, it is not a folder)."""
    if path.is_dir():
        raise ConfigError(f"{flag} {path} is a folder; pass a file path such as {path / 'results.json'}")
    check_writable_folder(path.parent if str(path.parent) else Path("."), f"the folder of {flag}")
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(f"cannot write to {flag} {path} (permission denied); pass another path")


def unused_path(folder: Path, name: str) -> Path:
    """``folder/name``, or ``folder/name-N`` with the first N not taken."""
    path, suffix = folder / name, 1
    while os.path.lexists(path):
        path, suffix = folder / f"{name}-{suffix}", suffix + 1
    return path


def _previous_run_files(folder: Path) -> list[Path]:
    return [folder / name for name in RUN_FILES if (folder / name).exists()]


def check_run_folder(folder: Path, resuming: bool, overwrite: bool) -> None:
    """Before any work: ``folder`` is writable, and holds no other run unless ``resuming`` or ``overwrite``."""
    check_writable_folder(folder, "--output")
    old = _previous_run_files(folder)
    if old and not resuming and not overwrite:
        raise ConfigError(f"--output {folder} already holds a run ({', '.join(p.name for p in old)}); continue it "
                          f"with --resume auto, start anew with --overwrite (its files are kept in "
                          f"{folder}/previous-<time>/), or pass another --output")


def start_run_folder(folder: Path, resuming: bool, overwrite: bool) -> list[str]:
    """Make ``folder`` ready for the run's first write (checked again; an old run's files moved to
    ``previous-<time>/``; the temporary files of a save that was killed removed) and return notes to print."""
    check_run_folder(folder, resuming, overwrite)
    notes = []
    old = _previous_run_files(folder)
    if old and not resuming:
        backup = unused_path(folder, time.strftime("previous-%Y%m%d-%H%M%S"))
        backup.mkdir()
        for path in old:
            path.rename(backup / path.name)
        notes.append(f"--overwrite: the previous run's files ({', '.join(p.name for p in old)}) moved to {backup}")
    leftovers = sorted(folder.glob(".*.pt.*.tmp"))
    for path in leftovers:
        path.unlink()
    if leftovers:
        notes.append(f"removed {len(leftovers)} unfinished checkpoint file(s) left by an interrupted save "
                     f"({', '.join(p.name for p in leftovers)})")
    return notes
