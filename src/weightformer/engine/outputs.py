"""Writing a command's output without losing a file: into a temporary sibling, renamed over the target at
the end, and never over an existing output unless asked (exports, prediction files)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import ConfigError
from .run_dir import check_writable_file, check_writable_folder

__all__ = ["check_output", "output_file", "output_folder"]


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


@contextmanager
def output_file(path: Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block succeeds, rename it to ``path``.

    The temporary file has ``path``'s own name, inside a temporary folder: some writers record the
    name (torch.export's .pt2 archive names its root folder after it).
    """
    path = Path(path)
    check_output(path, overwrite, folder=False)
    folder = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        yield folder / path.name
        os.replace(folder / path.name, path)
    finally:
        shutil.rmtree(folder)


@contextmanager
def output_folder(path: Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary folder beside ``path``; when the block succeeds, it takes the place of ``path``
    (an old ``path`` is removed only after the new one is complete)."""
    path = Path(path)
    check_output(path, overwrite, folder=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        yield tmp
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old.", dir=path.parent))
            os.replace(path, old / path.name)
            os.replace(tmp, path)
            shutil.rmtree(old)
        else:
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
