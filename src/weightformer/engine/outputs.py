"""One policy for every command that writes: into a temporary sibling renamed into place at the end (one
file: :func:`write_atomic`); never over an existing output unasked; with ``--overwrite`` the old output moved
aside (``<name>.previous-<time>``), never deleted; and never onto one of the command's inputs."""

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
from .errors import ConfigError
from .run_dir import check_writable_file, check_writable_folder, unused_path

__all__ = ["check_not_an_input", "check_output", "claim_outputs", "move_aside", "output_file", "output_folder",
           "removed_if_failed", "write_atomic"]


def check_output(path: Path, overwrite: bool, folder: bool, flag: str = "--out") -> None:
    """Before the work: ``path`` can be written, and holds nothing unless ``overwrite``."""
    if path.exists() and not overwrite and (not path.is_dir() or any(path.iterdir())):
        raise ConfigError(f"{flag} {path} already exists; pass --overwrite to replace it, or another {flag}")
    if folder:
        if path.exists() and not path.is_dir():
            raise ConfigError(f"{flag} {path} is a file; the hf format writes a folder, pass a folder path")
        check_writable_folder(path.parent if str(path.parent) else Path("."), f"the folder of {flag}")
    else:
        check_writable_file(path, flag)


def check_not_an_input(path: Path, inputs: "list[str | os.PathLike | None]", flag: str = "--out") -> None:
    """ConfigError if the output ``path`` is one of ``inputs`` or holds one (a folder around a checkpoint)."""
    target = Path(path).resolve()
    for given in (g for g in inputs if g is not None):
        source = Path(given).resolve()
        if source == target or target in source.parents:
            raise ConfigError(f"{flag} {path} would write over the command's input {given}; pass another {flag}")


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
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    staged = tmp if folder else tmp / path.name
    try:
        yield staged
        if path.exists():
            move_aside(path)
        os.replace(staged, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def output_folder(path: Path, overwrite: bool = False) -> ContextManager[Path]:
    """:func:`output_file` of a folder."""
    return output_file(path, overwrite, folder=True)


def claim_outputs(paths: Sequence[Path], overwrite: bool, command: str, flag: str = "--out",
                  inputs: "Sequence[str | os.PathLike]" = (), hint: str = "") -> list[Path]:
    """Before the work of a command that writes named files into a folder: none of ``paths`` is one of ``inputs``,
    and none exists unless ``overwrite``; those there are moved aside (:func:`move_aside`) and their new names
    returned. Other files in the folder are never touched. ``hint`` ends the refusal's message."""
    for path in paths:
        check_not_an_input(path, list(inputs), flag)
    taken = [Path(p) for p in paths if Path(p).exists()]
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
    made = [p for p in (folder, *folder.parents) if not p.exists()]  # deepest first
    try:
        yield
    except BaseException:
        for path in made:
            try:
                path.rmdir()
            except OSError:  # not empty (results written), or not made after all
                break
        raise
