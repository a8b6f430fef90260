"""Writing a command's output without losing a file, one policy for every command that writes: into a
temporary sibling, renamed into place at the end; never over an existing output unasked; with
``--overwrite`` the old output is moved aside (``<name>.previous-<time>``), never deleted; and never
onto one of the command's inputs."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import ConfigError
from .run_dir import check_writable_file, check_writable_folder

__all__ = ["check_not_an_input", "check_output", "move_aside", "output_file", "output_folder"]


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
    for given in inputs:
        if given is None:
            continue
        source = Path(given).resolve()
        if source == target or target in source.parents:
            raise ConfigError(f"{flag} {path} would write over the command's input {given}; pass another {flag}")


def move_aside(path: Path) -> Path:
    """Rename an existing ``path`` to ``<name>.previous-<time>`` beside it (never deleting it); returns the new name."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = path.with_name(f"{path.name}.previous-{stamp}")
    suffix = 1
    while aside.exists():
        aside = path.with_name(f"{path.name}.previous-{stamp}-{suffix}")
        suffix += 1
    os.replace(path, aside)
    return aside


@contextmanager
def output_file(path: Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block succeeds, rename it to ``path`` (an old
    ``path`` moved aside: :func:`move_aside`).

    The temporary file has ``path``'s own name, inside a temporary folder: some writers record the
    name (torch.export's .pt2 archive names its root folder after it).
    """
    path = Path(path)
    check_output(path, overwrite, folder=False)
    folder = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        yield folder / path.name
        if path.exists():
            move_aside(path)
        os.replace(folder / path.name, path)
    finally:
        shutil.rmtree(folder)


@contextmanager
def output_folder(path: Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary folder beside ``path``; when the block succeeds, it takes the place of ``path``
    (an old ``path``, only after the new one is complete, is moved aside: :func:`move_aside`)."""
    path = Path(path)
    check_output(path, overwrite, folder=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        yield tmp
        if path.exists():
            move_aside(path)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
