"""Hugging Face data sets on local disk: a ``DatasetDict`` written by ``save_to_disk``, or a folder of parquet or
arrow files (``datasets.load_dataset`` infers the splits from their names, and converts parquet into its cache,
``HF_DATASETS_CACHE``). Arrow data is memory-mapped and read by index, so it is a map-style data set: sharded,
shuffled and resumed exactly as an ImageFolder is. timm's ``ReaderHfds`` opens hub names through
``load_dataset`` only, not ``save_to_disk`` folders, so the reading is here (timm's image-bytes decoding)."""

from __future__ import annotations

import io
import os
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
from torch.utils.data import Dataset

from .errors import DataError
from .folder import DECODE_ERRORS, MAX_CLASSES, SkippedImagesWarning, gray_loader, rgb_loader, shown_names

__all__ = ["HFImageDataset", "is_hf_data", "open_hf"]

DATA_FILES = (".parquet", ".arrow")
OTHER_NAMES = {"val": "validation", "validation": "val"}  # the two names a validation split goes by


def is_hf_data(root: Path) -> bool:
    """Whether ``root`` holds a saved ``DatasetDict``, or parquet/arrow files in it or its subfolders (``data/``,
    ``train/``, ...; not deeper). A tree with class folders inside its subfolders is an ImageFolder, whatever
    parquet file lies beside it (a feature table, an export)."""
    if (root / "dataset_dict.json").is_file():
        return True
    if not root.is_dir():
        return False
    folders = [f for f in _listing(root, folders=True) if not Path(f).name.startswith(".")]  # .cache/, .git/
    if any(not Path(f).name.startswith(".") for folder in folders for f in _listing(folder, folders=True)):
        return False  # split/class/ folders: an ImageFolder tree
    return any(name.endswith(DATA_FILES) for folder in [root, *folders] for name in _listing(folder))


def _listing(folder: str | Path, folders: bool = False) -> list[str]:
    """The names in ``folder`` (its subfolders' paths with ``folders``); none if it cannot be listed (the
    folder reader then says why)."""
    try:
        with os.scandir(folder) as entries:
            return [entry.path if folders else entry.name for entry in entries if entry.is_dir() or not folders]
    except OSError:
        return []


def _load(root: Path) -> Any:
    import datasets

    if (root / "dataset_dict.json").is_file():
        try:
            return datasets.load_from_disk(str(root))
        except (OSError, ValueError, KeyError) as exc:  # a file of it missing or damaged
            raise DataError(f"cannot open the saved data set in {root} ({type(exc).__name__}: {exc}); save it again "
                            f"with save_to_disk") from None
    if (root / "state.json").is_file():
        raise DataError(f"{root} holds one saved split, not a DatasetDict; save a DatasetDict with train and "
                        f"validation splits (DatasetDict({{'train': ..., 'validation': ...}}).save_to_disk)")
    try:
        return datasets.load_dataset(str(root.resolve()))  # a relative "parquet" or "arrow" names a builder
    except (ValueError, FileNotFoundError, datasets.exceptions.DatasetGenerationError) as exc:
        raise DataError(f"cannot open the parquet/arrow files in {root} ({str(exc).splitlines()[0]}); name them "
                        f"by split (train-*.parquet, validation-*.parquet, or train/ and validation/ folders)") from None


class HFImageDataset(Dataset):
    """(image, label) of the rows ``rows`` of a Hugging Face data set whose ``image_column`` is undecoded."""

    def __init__(self, data: Any, rows: np.ndarray, labels: np.ndarray, image_column: str, where: str,
                 loader: Callable[[Any], Any] = rgb_loader):
        self.data, self.rows, self.labels, self.image_column, self.where = data, rows, labels, image_column, where
        self.loader = loader

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        row = int(self.rows[index])
        image = self.data[row][self.image_column]
        try:
            img = self.loader(io.BytesIO(image["bytes"]) if image.get("bytes") else image["path"])
        except (DECODE_ERRORS + (TypeError,)) as exc:
            raise DataError(f"cannot read the image of row {row} of {self.where} ({type(exc).__name__}: {exc}); "
                            f"replace it, or turn image verification back on (verify_images=true) to leave "
                            f"unreadable images out") from exc
        return img, int(self.labels[index])


def _readable(image: dict) -> bool:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(image["bytes"]) if image.get("bytes") else image["path"]) as img:
            img.verify()
        return True
    except Exception:  # PIL raises many types, as the folder scan says
        return False


def open_hf(root: Path, splits: dict[str, str], image_column: str = "image", label_column: str = "label",
            verify: bool = True, warn: bool = True,
            in_chans: int = 3) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, HFImageDataset]]:
    """Class names, the rows left out ("split:row (why)") and ``{role: data set}`` for the splits named
    ``splits`` (role -> split; ``val`` and ``validation`` stand for each other). Rows without a label (or with a
    negative or absurdly large one) are left out, and with ``verify`` rows whose image PIL cannot open, in one warning line."""
    import datasets

    found = _load(root)
    opened, skipped, label_names = {}, [], None
    for role, split in splits.items():
        name = split if split in found else OTHER_NAMES.get(split, split)
        if name not in found:
            raise DataError(f"{root} has no {split} split (it has {', '.join(found)}); name the split with "
                            f"--{role}-split")
        data = found[name]
        missing = [c for c in (image_column, label_column) if c not in data.column_names]
        if missing:
            raise DataError(f"the {name} split of {root} has no {missing[0]} column (it has "
                            f"{', '.join(data.column_names)}); name its columns with --image-column and --label-column")
        feature = data.features[label_column]
        if not isinstance(feature, datasets.ClassLabel) and not str(getattr(feature, "dtype", "")).startswith(
                ("int", "uint")):
            raise DataError(f"the {label_column} column of the {name} split of {root} holds {feature}, not class "
                            f"indices; name a column of whole numbers with --label-column")
        if isinstance(feature, datasets.ClassLabel) and label_names is None:
            label_names = tuple(feature.names)
        try:
            data = data.cast_column(image_column, datasets.Image(decode=False))
        except (ValueError, TypeError, NotImplementedError):  # pyarrow's cast errors derive from these
            raise DataError(f"the {image_column} column of the {name} split of {root} holds {data.features[image_column]}"
                            f", not images; name the image column with --image-column") from None
        labels = np.array([-1 if v is None else v for v in data[label_column]], np.int64)
        keep = (labels >= 0) & (labels < MAX_CLASSES)
        why = {int(row): "no label" for row in np.flatnonzero(~keep)}
        if verify:
            for first in range(0, len(data), 256):
                for offset, image in enumerate(data[first : first + 256][image_column]):
                    if keep[first + offset] and not (image and _readable(image)):
                        keep[first + offset] = False
                        why[first + offset] = "unreadable image"
        skipped.extend(f"{name}:{row} ({reason})" for row, reason in sorted(why.items()))
        rows = np.flatnonzero(keep)
        if not len(rows):
            raise DataError(f"the {name} split of {root} has no rows with a label and a readable image")
        opened[role] = HFImageDataset(data, rows, labels[rows], image_column, f"the {name} split of {root}",
                                      loader=gray_loader if in_chans == 1 else rgb_loader)
    if skipped and warn:
        warnings.warn(f"left {len(skipped)} row(s) of {root} out: {shown_names(skipped)}; fix them to use them", SkippedImagesWarning,
                      stacklevel=3)
    num_classes = max(int(d.labels.max()) for d in opened.values()) + 1
    classes = label_names if label_names and len(label_names) >= num_classes else tuple(map(str, range(num_classes)))
    return classes, tuple(skipped), opened


def image_sizes(root: Path, split: str, image_column: str, limit: int) -> list[tuple[int, int]]:
    """(width, height) of the first ``limit`` readable images of ``split`` (for the recipe choice)."""
    from PIL import Image

    import datasets

    found = _load(root)
    data = found[split if split in found else OTHER_NAMES.get(split, split)]
    data = data.cast_column(image_column, datasets.Image(decode=False))
    sizes = []
    for image in data[:limit][image_column]:
        try:
            with Image.open(io.BytesIO(image["bytes"]) if image.get("bytes") else image["path"]) as img:
                sizes.append(img.size)
        except DECODE_ERRORS:
            continue
    return sizes
