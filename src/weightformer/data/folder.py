"""ImageFolder trees in ImageNet layout (``train/<class>/*.jpg``, ``val/<class>/*.jpg``).

Files that cannot be opened as images are skipped when the tree is scanned, counted, and reported
in one warning with their paths. A file that opens but fails to decode later (a truncated JPEG)
is replaced by the next readable sample, with a warning, so a long run does not die on one file.
"""

from __future__ import annotations

import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from PIL import Image
from torch.utils.data import Dataset
from torchvision.datasets.folder import IMG_EXTENSIONS

from .errors import DataError

__all__ = ["FolderSpec", "ImageFolderDataset", "SkippedImagesWarning", "load_image_folder", "scan_split"]

SPLITS = ("train", "val")


class SkippedImagesWarning(UserWarning):
    """Some image files could not be read and were left out of the data set."""


@dataclass(frozen=True)
class FolderSpec:
    """What a scanned ImageFolder tree holds."""

    root: str
    classes: tuple[str, ...]
    skipped: tuple[str, ...]  # paths of unreadable files, both splits

    @property
    def num_classes(self) -> int:
        return len(self.classes)


def _is_readable_image(path: str) -> bool:
    """Open the header (and, for PNG/GIF, check the chunk CRCs) without decoding the pixels."""
    try:
        with Image.open(path) as img:
            img.verify()
        return True
    except Exception:  # PIL raises many types (OSError, SyntaxError, ValueError, struct.error, ...)
        return False


def rgb_loader(path: str) -> Image.Image:
    """Read an image file as RGB."""
    with open(path, "rb") as f:
        return Image.open(f).convert("RGB")


def scan_split(split_dir: Path, verify: bool = True) -> tuple[list[str], list[tuple[str, int]], list[str]]:
    """List one split: (class names, [(path, class index)], unreadable paths).

    Classes are the sorted subfolder names; files are kept if their extension is an image one
    (``.jpg``, ``.png``, ...) and, with ``verify``, if PIL can open them.
    """
    if not split_dir.is_dir():
        raise DataError(
            f"{split_dir} is not a folder; --data needs an ImageFolder tree with train/ and val/ "
            f"holding one subfolder per class"
        )
    classes = sorted(entry.name for entry in os.scandir(split_dir) if entry.is_dir() and not entry.name.startswith("."))
    if not classes:
        raise DataError(f"{split_dir} has no class subfolders; put each class's images in {split_dir}/<class>/")
    candidates: list[tuple[str, int]] = []
    for index, name in enumerate(classes):
        for dirpath, _, filenames in sorted(os.walk(split_dir / name, followlinks=True)):
            for filename in sorted(filenames):
                if filename.lower().endswith(IMG_EXTENSIONS):
                    candidates.append((os.path.join(dirpath, filename), index))
    if verify and candidates:
        with ThreadPoolExecutor(max_workers=min(32, 4 * (os.cpu_count() or 1))) as pool:
            readable = list(pool.map(_is_readable_image, (path for path, _ in candidates), chunksize=64))
    else:
        readable = [True] * len(candidates)
    samples = [sample for sample, ok in zip(candidates, readable) if ok]
    skipped = [path for (path, _), ok in zip(candidates, readable) if not ok]
    if not samples:
        raise DataError(
            f"{split_dir} holds no readable images (extensions {', '.join(IMG_EXTENSIONS)}); check the path"
        )
    return classes, samples, skipped


class ImageFolderDataset(Dataset):
    """(image, class index) pairs from a scanned split, through an optional transform."""

    def __init__(
        self,
        samples: list[tuple[str, int]],
        transform: Optional[Callable] = None,
        loader: Callable[[str], Any] = rgb_loader,
    ):
        self.samples = samples
        self.transform = transform
        self.loader = loader

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        for offset in range(len(self.samples)):
            path, target = self.samples[(index + offset) % len(self.samples)]
            try:
                img = self.loader(path)
            except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
                warnings.warn(f"skipped unreadable image {path} ({exc}); using the next one", SkippedImagesWarning)
                continue
            if self.transform is not None:
                img = self.transform(img)
            return img, target
        raise DataError("no image in the data set could be read")


def load_image_folder(
    root: str | os.PathLike,
    splits: tuple[str, ...] = SPLITS,
    verify: bool = True,
    warn: bool = True,
) -> tuple[FolderSpec, dict[str, ImageFolderDataset]]:
    """Scan ``root/<split>`` for each split: the tree's spec and ``{split: dataset}``.

    Raises :class:`DataError` for a missing or empty tree or when the splits' classes differ.
    With ``warn``, unreadable files are reported in one :class:`SkippedImagesWarning`.
    """
    root_path = Path(root).expanduser()
    if not root_path.exists():
        raise DataError(
            f"data directory {root_path} does not exist; pass --data an ImageFolder tree "
            f"(train/ and val/ with one subfolder per class) or a built-in data set name such as mnist"
        )
    if not root_path.is_dir():
        raise DataError(f"--data {root_path} is a file, not a folder; pass the folder that holds train/ and val/")
    scanned = {split: scan_split(root_path / split, verify) for split in splits}
    first, *others = splits
    for other in others:
        a, b = scanned[first][0], scanned[other][0]
        if a != b:
            only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
            raise DataError(
                f"{first}/ and {other}/ in {root_path} have different classes (only in {first}/: {only_a or 'none'}; "
                f"only in {other}/: {only_b or 'none'}); give both splits the same class subfolders"
            )
    skipped = [path for split in splits for path in scanned[split][2]]
    if skipped and warn:
        listing = "\n  ".join(skipped)
        warnings.warn(
            f"skipped {len(skipped)} unreadable image file(s) in {root_path}; training continues without them:\n  {listing}",
            SkippedImagesWarning,
            stacklevel=2,
        )
    spec = FolderSpec(root=str(root_path.resolve()), classes=tuple(scanned[first][0]), skipped=tuple(skipped))
    return spec, {split: ImageFolderDataset(scanned[split][1]) for split in splits}
