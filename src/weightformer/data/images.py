"""Image files named on a command line: the one expander of paths and the one reader, for every
task's ``predict``."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from PIL import Image

from .errors import DataError
from .folder import DECODE_ERRORS, IMG_EXTENSIONS, list_images, rgb_loader

__all__ = ["image_paths", "read_image"]


def image_paths(paths: Sequence[str | Path]) -> list[Path]:
    """The files named, a folder standing for every image file under it (sorted, recursively);
    :class:`DataError` for a path that does not exist or a folder without images."""
    files: list[Path] = []
    for name in paths:
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
