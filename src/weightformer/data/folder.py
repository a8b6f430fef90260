"""ImageFolder trees in ImageNet layout (``train/<class>/*.jpg``, ``val/<class>/*.jpg``).

Scanning follows symlinks but refuses loops; with ``verify``, unreadable files are left out, reported in one
warning line and kept on :attr:`FolderSpec.skipped`. A file that fails to load later raises :class:`DataError`
naming it: no other image is served in its place.
"""

from __future__ import annotations

import os
import struct
import warnings
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Optional, Sequence

import numpy as np
from PIL import Image
from torch.utils.data import Dataset
from torchvision.datasets.folder import IMG_EXTENSIONS

from ..progress import progress as progress_lines
from .errors import DataError

__all__ = ["LUMA", "FolderSpec", "ImageFolderDataset", "SkippedImagesWarning", "gray_loader", "list_images",
           "load_image_folder", "scan_split"]

SPLITS = ("train", "val")
# Pillow's modes for 16-bit samples: 16-bit grayscale PNG and TIFF open as I;16, 16-bit PGM as I.
SIXTEEN_BIT_MODES = frozenset({"I;16", "I;16L", "I;16B", "I;16N", "I"})
# What PIL raises for a file it cannot decode (OSError covers a missing file and UnidentifiedImageError).
DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, struct.error, Image.DecompressionBombError)
LUMA = (0.299, 0.587, 0.114)  # PIL's RGB -> "L" weights (ITU-R 601-2 luma)
SKIPPED_SHOWN = 3  # unreadable paths named in the warning line; all of them are on FolderSpec.skipped
MAX_CLASSES = 2**20  # a shard's or a data set's label at or above it is taken for a damaged one, left out
VERIFY_CHUNK = 256  # files per verification task
PROGRESS_DELAY_S = 1.0  # progress bars appear only for scans that take longer than this


class SkippedImagesWarning(UserWarning):
    """Some image files could not be read and were left out of the data set."""


@dataclass(frozen=True)
class FolderSpec:
    """What a scanned ImageFolder tree holds."""

    root: str
    classes: tuple[str, ...]
    skipped: tuple[str, ...]  # paths of unreadable files left out, in split order

    @property
    def num_classes(self) -> int:
        return len(self.classes)


def shown_names(names: Sequence[str]) -> str:
    """The first :data:`SKIPPED_SHOWN` of ``names`` for a problem's one line: "a, b, c and 4 more"."""
    more = len(names) - SKIPPED_SHOWN
    return ", ".join(names[:SKIPPED_SHOWN]) + (f" and {more} more" if more > 0 else "")


def _is_readable_image(path: str) -> bool:
    """Open the header (and, for PNG/GIF, check the chunk CRCs) without decoding the pixels."""
    try:
        with Image.open(path) as img:
            img.verify()
        return True
    except Exception:  # PIL raises many types (OSError, SyntaxError, ValueError, struct.error, ...)
        return False


def rgb_loader(path: str | BinaryIO) -> Image.Image:
    """Read an image file (a path, or an open binary file) as 8-bit RGB; 16-bit grayscale is scaled to 8 bits
    (x / 257), not clipped."""
    with open(path, "rb") if isinstance(path, str) else nullcontext(path) as f:
        img = Image.open(f)
        if img.mode in SIXTEEN_BIT_MODES:
            pixels = np.clip(np.asarray(img), 0, 65535).astype(np.uint32)
            img = Image.fromarray(((pixels + 128) // 257).astype(np.uint8))  # round(x / 257): 65535 -> 255
        return img.convert("RGB")


def gray_loader(path: str | BinaryIO) -> Image.Image:
    """An image file as 8-bit grayscale: PIL's "L" (ITU-R 601-2 luma) of :func:`rgb_loader`'s RGB, as ``predict``
    reads images for a 1-channel model."""
    return rgb_loader(path).convert("L")


def _entries(folder: str | os.PathLike, split_dir: Path) -> list[os.DirEntry]:
    """The entries of ``folder``, sorted by name; a folder that cannot be listed is a :class:`DataError`."""
    try:
        with os.scandir(folder) as it:
            return sorted(it, key=lambda entry: entry.name)
    except OSError as exc:
        raise DataError(
            f"cannot list {folder} ({exc.strerror or exc}); make it readable or remove it from {split_dir.parent}"
        ) from None


def list_images(class_dir: Path, split_dir: Path) -> list[str]:
    """Image files under ``class_dir``, sorted by folder then name, following symlinks; a link to a folder on the
    way down to it is a loop and a :class:`DataError` (two links to one folder elsewhere are both followed)."""
    found: list[tuple[str, list[str]]] = []

    def walk(dirpath: str, chain: list[str]) -> None:  # chain: real paths of the folders on the way down
        entries = _entries(dirpath, split_dir)
        found.append((dirpath, [e.name for e in entries if not e.is_dir() and e.name.lower().endswith(IMG_EXTENSIONS)]))
        for entry in entries:
            if not entry.is_dir():
                continue
            if entry.is_symlink():
                target = os.path.realpath(entry.path)
                if any(os.path.join(real, "").startswith(os.path.join(target, "")) for real in chain):
                    raise DataError(f"symlink loop in {split_dir}: {entry.path} -> {target} leads back to a folder it "
                                    f"is in; remove the link or point it at a folder outside the path to it")
            else:
                target = os.path.join(chain[-1], entry.name)
            walk(entry.path, chain + [target])

    walk(str(class_dir), [os.path.realpath(class_dir)])
    return [os.path.join(dirpath, name) for dirpath, names in sorted(found) for name in names]


def scan_split(split_dir: Path, verify: bool = True,
               progress: bool = False) -> tuple[list[str], list[tuple[str, int]], list[str]]:
    """List one split: (class names, [(path, class index)], unreadable paths). Classes are the sorted subfolders;
    files are kept by image extension and, with ``verify``, if PIL opens them; every class must keep one."""
    if not split_dir.is_dir():
        root = split_dir.parent
        if root.name in SPLITS and (root.parent / split_dir.name).is_dir():
            fix = f"--data {root} is the {root.name}/ split itself: pass its parent {root.parent}"
        else:
            fix = ("--data needs an ImageFolder tree with train/ and val/ holding one subfolder per class, tar shards "
                   "in train/ and val/, or a Hugging Face data set")
        kind = "a file, not a folder" if split_dir.exists() else "not a folder"
        raise DataError(f"{split_dir} is {kind}; {fix}")
    entries = _entries(split_dir, split_dir)
    classes = [entry.name for entry in entries if entry.is_dir() and not entry.name.startswith(".")]
    if not classes:
        raise DataError(f"{split_dir} has no class subfolders; put each class's images in {split_dir}/<class>/")
    per_class: list[list[str]] = []
    with progress_lines(total=len(classes), desc=f"listing {split_dir.name}/", unit="class", enabled=progress,
                        delay=PROGRESS_DELAY_S) as bar:
        for name in classes:
            per_class.append(list_images(split_dir / name, split_dir))
            bar.update(1)
    candidates = [(path, index) for index, paths in enumerate(per_class) for path in paths]
    paths = [path for path, _ in candidates]
    readable = [True] * len(candidates)
    if verify and candidates:
        chunks = [paths[i : i + VERIFY_CHUNK] for i in range(0, len(paths), VERIFY_CHUNK)]
        readable = []
        with ThreadPoolExecutor(max_workers=min(32, 4 * (os.cpu_count() or 1))) as pool, progress_lines(
            total=len(paths), desc=f"checking {split_dir.name}/ images", unit="img", enabled=progress,
            delay=PROGRESS_DELAY_S
        ) as bar:
            for flags in pool.map(lambda chunk: [_is_readable_image(path) for path in chunk], chunks):
                readable.extend(flags)
                bar.update(len(flags))
    samples = [sample for sample, ok in zip(candidates, readable) if ok]
    skipped = [path for path, ok in zip(paths, readable) if not ok]
    kept = np.bincount([index for _, index in samples], minlength=len(classes))
    empty = [name for name, count in zip(classes, kept) if count == 0]
    if empty:
        names = ", ".join(empty[:SKIPPED_SHOWN]) + (", ..." if len(empty) > SKIPPED_SHOWN else "")
        others = f" ({len(empty)} class folders have none: {names})" if len(empty) > 1 else ""
        unreadable = f"; {len(skipped)} unreadable file(s) in {split_dir} were left out" if skipped else ""
        raise DataError(f"{split_dir / empty[0]} holds no readable images{others}{unreadable}; put images in it "
                        f"(extensions {', '.join(IMG_EXTENSIONS)}) or remove the class folder from train/ and val/")
    return classes, samples, skipped


class ImageFolderDataset(Dataset):
    """(image, class index) pairs from a scanned split; ``verified`` (the scan opened every file) only changes
    the advice given when a file fails to load."""

    def __init__(self, samples: list[tuple[str, int]], transform: Optional[Callable] = None,
                 loader: Callable[[str], Any] = rgb_loader, verified: bool = True):
        self.samples, self.transform, self.loader, self.verified = samples, transform, loader, verified

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        path, target = self.samples[index]
        try:
            img = self.loader(path)
        except DECODE_ERRORS as exc:
            if self.verified:
                fix = "it opened when the data was scanned, so it is damaged past its header or changed since"
                fix += ": replace or remove it"
            else:
                fix = "remove it, or turn image verification back on (verify_images=true) to leave unreadable files out"
            raise DataError(f"cannot read image {path} ({type(exc).__name__}: {exc}); {fix}") from exc
        if self.transform is not None:
            img = self.transform(img)
        return img, target


def load_image_folder(root: str | os.PathLike, splits: tuple[str, ...] = SPLITS, verify: bool = True,
                      warn: bool = True, in_chans: int = 3) -> tuple[FolderSpec, dict[str, ImageFolderDataset]]:
    """Scan ``root/<split>`` for each split: the tree's spec and ``{split: dataset}``, whose images are RGB, or
    grayscale for ``in_chans`` 1. ``warn`` (the reporting rank): one :class:`SkippedImagesWarning` line for
    unreadable files, and progress for a long scan."""
    root_path = Path(root).expanduser()
    if not root_path.exists():
        raise DataError(f"data directory {root_path} does not exist; pass --data an ImageFolder tree "
                        f"(train/ and val/ with one subfolder per class) or a built-in data set name such as mnist")
    if not root_path.is_dir():
        raise DataError(f"--data {root_path} is a file, not a folder; pass the folder that holds train/ and val/")
    scanned = {split: scan_split(root_path / split, verify, progress=warn) for split in splits}
    first, *others = splits
    for other in others:
        a, b = scanned[first][0], scanned[other][0]
        if a != b:
            only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
            raise DataError(f"{first}/ and {other}/ in {root_path} have different classes (only in {first}/: "
                            f"{only_a or 'none'}; only in {other}/: {only_b or 'none'}); give both splits the same "
                            "class subfolders")
    skipped = [path for split in splits for path in scanned[split][2]]
    if skipped and warn:
        counts = ", ".join(f"{len(scanned[split][2])} in {split}/" for split in splits if scanned[split][2])
        warnings.warn(f"skipped {len(skipped)} unreadable image file(s) in {root_path} ({counts}), left out of the "
                      f"data: {shown_names(skipped)}; replace them to use them", SkippedImagesWarning, stacklevel=2)
    spec = FolderSpec(root=str(root_path.resolve()), classes=tuple(scanned[first][0]), skipped=tuple(skipped))
    loader = gray_loader if in_chans == 1 else rgb_loader
    return spec, {split: ImageFolderDataset(scanned[split][1], loader=loader, verified=verify) for split in splits}
