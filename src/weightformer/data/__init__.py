"""Data for training and evaluation: bundled data sets, ImageFolder trees, webdataset shards, Hugging Face data
sets, timm transforms, sampling. The names are imported from their submodules on first use, so that importing
the package imports no torch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Optional

from ..lazy import lazy_exports
from .errors import DataError

if TYPE_CHECKING:
    from torch.utils.data import Dataset

# name -> the submodule that defines it
_EXPORTS = {
    "BUILTIN_DATASETS": "builtin", "ArrayImageDataset": "arrays", "BuiltinNameWarning": "builtin",
    "BuiltinSpec": "builtin", "load_builtin": "builtin",
    "ImageFolderDataset": "folder", "SkippedImagesWarning": "folder", "load_image_folder": "folder",
    "ResumableSampler": "sampler", "ShardStream": "shards", "HFImageDataset": "hf",
    "pack_dataset": "pack", "verify_shards": "pack",
    "SeededTransformDataset": "transforms", "build_transforms": "transforms", "precompute": "transforms",
    "seeded_rng": "transforms",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "BUILTIN_DATASETS",
    "ArrayImageDataset",
    "BuiltinNameWarning",
    "BuiltinSpec",
    "DataError",
    "DataInfo",
    "HFImageDataset",
    "ImageFolderDataset",
    "ResumableSampler",
    "SeededTransformDataset",
    "ShardStream",
    "SkippedImagesWarning",
    "build_transforms",
    "builtin_info",
    "load_builtin",
    "load_image_folder",
    "open_dataset",
    "pack_dataset",
    "precompute",
    "seeded_rng",
    "train_split_images",
    "verify_shards",
]


@dataclass(frozen=True)
class DataInfo:
    """What a model and its transforms need to know about a data set."""

    name: str  # a built-in name, or the absolute path of an ImageFolder tree
    num_classes: int
    in_chans: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    classes: tuple[str, ...]
    skipped: tuple[str, ...] = ()  # unreadable files left out


def open_dataset(data: str, splits: tuple[str, ...] = ("train", "val"), verify: bool = True,
                 warn: bool = True, in_chans: int = 3, split_names: Optional[Mapping[str, str]] = None,
                 columns: tuple[str, str] = ("image", "label")) -> tuple[DataInfo, dict[str, Dataset]]:
    """Open ``data`` without transforms: its :class:`DataInfo` and ``{split: dataset}``. ``data`` is a built-in
    name such as ``"mnist"``, or a folder holding an ImageFolder tree, webdataset tar shards (a
    :class:`~.shards.ShardStream` per split) or a Hugging Face data set (``columns``: its image and label
    columns); ``split_names`` maps ``splits`` to the folders, shard patterns or Hugging Face splits (default:
    the same names). Images are read as RGB, or for ``in_chans`` 1 as grayscale; a built-in set's are its own."""
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

    from .builtin import BUILTIN_DATASETS, load_builtin
    from .folder import LUMA, load_image_folder

    if data in BUILTIN_DATASETS:
        spec, builtin_splits = load_builtin(data, warn=warn)
        return builtin_info(data), {split: builtin_splits[split] for split in splits}
    names = {role: (split_names or {}).get(role, role) for role in splits}
    root = Path(data).expanduser()
    opened: dict[str, Dataset]
    if root.is_dir() and is_shard_split(root, names[splits[0]]):
        from .shards import open_shards

        classes, opened = open_shards(root, names, verify=verify, warn=warn, in_chans=in_chans)
        name, skipped = str(root.resolve()), ()
    elif root.is_dir() and _is_hf_data(root):
        from .hf import open_hf

        classes, skipped, opened = open_hf(root, names, *columns, verify=verify, warn=warn, in_chans=in_chans)
        name = str(root.resolve())
    else:
        folder, folder_splits = load_image_folder(data, splits=tuple(names.values()), verify=verify, warn=warn,
                                                  in_chans=in_chans)
        name, classes, skipped = folder.root, folder.classes, folder.skipped
        opened = {role: folder_splits[names[role]] for role in splits}
    mean, std = tuple(IMAGENET_DEFAULT_MEAN), tuple(IMAGENET_DEFAULT_STD)
    if in_chans == 1:  # the luma of ImageNet's per-channel values
        mean, std = (sum(w * m for w, m in zip(LUMA, mean)),), (sum(w * v for w, v in zip(LUMA, std)),)
    info = DataInfo(name=name, num_classes=len(classes), in_chans=len(mean), mean=mean, std=std,
                    classes=tuple(classes), skipped=tuple(skipped))
    return info, opened


def train_split_images(data: str, split: str = "train", columns: tuple[str, str] = ("image", "label"),
                       verify: bool = True) -> Optional[tuple[str, int, list[tuple[int, int]]]]:
    """For tar shards or a Hugging Face data set in folder ``data``: what holds the training images (for a run's
    first line), how many it holds, and the (width, height) of its first readable ones, up to 32: what a recipe
    is chosen by. None for other data. ``columns``: a Hugging Face data set's image and label columns;
    ``verify`` as the run will open the data (shards: one scan serves both)."""
    root = Path(data).expanduser()
    if root.is_dir() and is_shard_split(root, split):
        from . import shards

        samples, files, sizes = shards.split_summary(root, split, verify, 32)
        return f"{root / split} ({files} shards)", samples, sizes
    if root.is_dir() and _is_hf_data(root):
        from . import hf

        _, _, opened = hf.open_hf(root, {"train": split}, *columns, verify=False, warn=False)
        return f"the {split} split of {root}", len(opened["train"]), hf.image_sizes(root, split, columns[0], 32)
    return None


def is_shard_split(root: Path, split: str) -> bool:
    from .shards import is_shard_split

    return is_shard_split(root, split)


def _is_hf_data(root: Path) -> bool:
    from .hf import is_hf_data

    return is_hf_data(root)


def builtin_info(data: str) -> DataInfo:
    """The :class:`DataInfo` of a built-in data set, from its spec alone (nothing generated or read)."""
    from .builtin import BUILTIN_DATASETS

    spec = BUILTIN_DATASETS[data]
    return DataInfo(name=data, num_classes=spec.num_classes, in_chans=spec.in_chans, mean=spec.mean, std=spec.std,
                    classes=tuple(str(i) for i in range(spec.num_classes)))
