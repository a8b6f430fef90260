"""One policy for every command that writes: into a temporary sibling renamed into place at the end (one
file: :func:`write_atomic`); never over an existing output unasked; with ``--overwrite`` the old output moved
aside (``<name>.previous-<time>``), never deleted; and never onto one of the command's inputs, ``--overwrite``
or not. A path that is a symbolic link counts as existing, whether or not its target does. A write that fails
for want of space, of the file-size limit or of a shorter name is a :class:`~.errors.ResourceError`."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import ContextManager

from ..atomic import write_atomic
from .errors import ConfigError, resource_error
from .run_dir import check_writable_file, check_writable_folder, unused_path

__all__ = ["check_not_an_input", "check_output", "claim_outputs", "move_aside", "output_file", "output_folder",
           "removed_if_failed", "write_atomic"]


def check_output(path: Path, overwrite: bool, folder: bool, flag: str = "--out",
                 inputs: "Sequence[str | os.PathLike | None]" = ()) -> None:
    """Before the work: ``path`` is none of ``inputs`` (:func:`check_not_an_input`), can be written, and holds
    nothing unless ``overwrite`` (then it is moved aside)."""
    path = Path(path)
    check_not_an_input(path, inputs, flag)
    if os.path.lexists(path) and not overwrite and (not path.is_dir() or any(path.iterdir())):
        link = f" (a symbolic link to {os.readlink(path)})" if path.is_symlink() else ""
        raise ConfigError(f"{flag} {path} already exists{link}; pass --overwrite to move it aside (never deleted), "
                          f"or another {flag}")
    if folder:
        if os.path.lexists(path) and not path.is_dir():
            raise ConfigError(f"{flag} {path} is a file; the hf format writes a folder, pass a folder path")
        check_writable_folder(path.parent if str(path.parent) else Path("."), f"the folder of {flag}")
    else:
        check_writable_file(path, flag)


def check_not_an_input(paths: "Path | Sequence[Path]", inputs: "Sequence[str | os.PathLike | None]",
                       flag: str = "--out") -> None:
    """ConfigError if an output of ``paths`` is one of ``inputs`` (through a link too) or holds one (a folder
    around a checkpoint)."""
    targets = {Path(p).resolve(): Path(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths)}
    files = {(s.st_dev, s.st_ino): p for t, p in targets.items() if (s := _stat(t)) is not None}  # hard links
    for given in (g for g in inputs if g is not None):
        source = Path(given).resolve()
        found = targets.get(source) or next((targets[t] for t in source.parents if t in targets), None)
        if found is None and files and (stat := _stat(source)) is not None:
            found = files.get((stat.st_dev, stat.st_ino))
        if found is not None:
            raise ConfigError(f"{flag} {found} would write over the command's input {given}; pass another {flag}")


def _stat(path: Path) -> "os.stat_result | None":
    try:
        return path.stat()
    except OSError:
        return None


def move_aside(path: Path) -> Path:
    """Rename an existing ``path`` to ``<name>.previous-<time>`` beside it (never deleting it); returns the new name."""
    aside = unused_path(path.parent, f"{path.name}.previous-{time.strftime('%Y%m%d-%H%M%S')}")
    os.replace(path, aside)
    return aside


@contextmanager
def output_file(path: Path, overwrite: bool = False, folder: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` (``folder``: a temporary folder); when the block succeeds, it takes
    the place of ``path``, an old one moved aside (:func:`move_aside`) only then. A file has ``path``'s own name,
    in a temporary folder: some writers record the name (torch.export's .pt2 archive names its root after it)."""
    path = Path(path)
    check_output(path, overwrite, folder=folder)
    tmp = None
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name[:200]}.", dir=path.parent))
        staged = tmp if folder else tmp / path.name
        yield staged
        if os.path.lexists(path):
            move_aside(path)
        os.replace(staged, path)
    except Exception as exc:
        found = resource_error(exc, path, tmp)  # before the temporary goes: the sizes at the failure
        if found is not None:
            raise found from exc
        raise
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def output_folder(path: Path, overwrite: bool = False) -> ContextManager[Path]:
    """:func:`output_file` of a folder."""
    return output_file(path, overwrite, folder=True)


def claim_outputs(paths: Sequence[Path], overwrite: bool, command: str, flag: str = "--out",
                  inputs: "Sequence[str | os.PathLike]" = (), hint: str = "") -> list[Path]:
    """Before the work of a command that writes named files into a folder: none of ``paths`` is one of ``inputs``,
    and none exists unless ``overwrite``; those there are moved aside (:func:`move_aside`) and their new names
    returned. Other files in the folder are never touched. ``hint`` ends the refusal's message."""
    check_not_an_input(paths, inputs, flag)
    taken = [Path(p) for p in paths if os.path.lexists(p)]
    if not taken:
        return []
    if not overwrite:
        shown = ", ".join(p.name for p in taken[:3]) + (f" and {len(taken) - 3} more" if len(taken) > 3 else "")
        them = "it" if len(taken) == 1 else "them"
        raise ConfigError(f"{flag} {taken[0].parent} already holds {shown}, which {command} writes; pass --overwrite "
                          f"to move {them} aside (never deleted), or another {flag}{hint}")
    return [move_aside(path) for path in taken]


@contextmanager
def removed_if_failed(folder: Path) -> Iterator[None]:
    """A block that makes ``folder`` (and its missing parents) and then works: if it fails or is stopped,
    the folders it made are removed again while they are empty, so a failed command leaves no empty folder."""
    folder = Path(folder)
    made = [p for p in (folder, *folder.parents) if not os.path.lexists(p)]  # deepest first
    try:
        yield
    except BaseException:
        for path in made:
            try:
                path.rmdir()
            except OSError:  # not empty (results written), or not made after all
                break
        raise
