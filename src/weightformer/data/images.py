"""Image files: paths named on a command line expanded, read (every task's ``predict``), and a folder's image sizes
from their headers (for the recipes that size a run to a user's images)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from PIL import Image

from .errors import DataError
from .folder import DECODE_ERRORS, IMG_EXTENSIONS, list_images, rgb_loader

__all__ = ["image_paths", "image_sizes", "read_image"]


def image_paths(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """The files named (one path, or several), a folder standing for every image file under it (sorted,
    recursively); :class:`DataError` for a path that does not exist or a folder without images."""
    files: list[Path] = []
    for name in [paths] if isinstance(paths, (str, os.PathLike)) else paths:
        path = Path(name).expanduser()
        if path.is_dir():
            found = list_images(path, path)
            if not found:
                raise DataError(f"folder {path} holds no images ({', '.join(IMG_EXTENSIONS)})")
            files.extend(Path(p) for p in found)
        elif path.exists():
            files.append(path)
        else:
            raise DataError(f"{path} does not exist; pass image files or folders of them")
    return files


def read_image(path: str | Path) -> Image.Image:
    """An image file as 8-bit RGB, decoded now, or a one-line DataError naming the file."""
    try:
        image = rgb_loader(str(path))
        image.load()
        return image
    except DECODE_ERRORS as exc:
        raise DataError(f"cannot read image {path} ({type(exc).__name__}: {exc}); replace or remove it") from None


def image_sizes(folder: str | Path, limit: int, extensions: Sequence[str] = IMG_EXTENSIONS) -> list[tuple[int, int]]:
    """The (width, height) of the first ``limit`` readable images under ``folder`` (in name order), from their
    headers; unreadable files are passed over."""
    suffixes = tuple(e.lower() for e in extensions)
    sizes: list[tuple[int, int]] = []
    for dirpath, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(n for n in names if n.lower().endswith(suffixes)):
            try:
                with Image.open(os.path.join(dirpath, name)) as image:
                    sizes.append(image.size)
            except DECODE_ERRORS:
                continue
            if len(sizes) == limit:
                return sizes
    return sizes
