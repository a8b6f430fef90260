"""Data for training and evaluation: bundled data sets, ImageFolder trees, timm transforms, sampling. The names
are imported from their submodules on first use, so that importing the package imports no torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..lazy import lazy_exports
from .errors import DataError

if TYPE_CHECKING:
    from torch.utils.data import Dataset

# name -> the submodule that defines it
_EXPORTS = {
    "BUILTIN_DATASETS": "builtin", "ArrayImageDataset": "arrays", "BuiltinNameWarning": "builtin",
    "BuiltinSpec": "builtin", "load_builtin": "builtin",
    "ImageFolderDataset": "folder", "SkippedImagesWarning": "folder", "load_image_folder": "folder",
    "pack_dataset": "pack", "verify_shards": "pack",
    "ResumableSampler": "sampler",
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
    "ImageFolderDataset",
    "ResumableSampler",
    "SeededTransformDataset",
    "SkippedImagesWarning",
    "build_transforms",
    "builtin_info",
    "load_builtin",
    "load_image_folder",
    "open_dataset",
    "pack_dataset",
    "precompute",
    "seeded_rng",
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
                 warn: bool = True, in_chans: int = 3) -> tuple[DataInfo, dict[str, Dataset]]:
    """Open ``data`` (a built-in name such as ``"mnist"`` or an ImageFolder path) without transforms: its
    :class:`DataInfo` and ``{split: dataset}``. A folder's images are read as RGB, or for ``in_chans`` 1 as
    grayscale; a built-in set's channels are its own."""
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

    from .builtin import BUILTIN_DATASETS, load_builtin
    from .folder import LUMA, load_image_folder

    if data in BUILTIN_DATASETS:
        spec, builtin_splits = load_builtin(data, warn=warn)
        return builtin_info(data), {split: builtin_splits[split] for split in splits}
    folder, folder_splits = load_image_folder(data, splits=splits, verify=verify, warn=warn, in_chans=in_chans)
    mean, std = tuple(IMAGENET_DEFAULT_MEAN), tuple(IMAGENET_DEFAULT_STD)
    if in_chans == 1:  # the luma of ImageNet's per-channel values
        mean, std = (sum(w * m for w, m in zip(LUMA, mean)),), (sum(w * v for w, v in zip(LUMA, std)),)
    info = DataInfo(name=folder.root, num_classes=folder.num_classes, in_chans=len(mean), mean=mean, std=std,
                    classes=folder.classes, skipped=folder.skipped)
    return info, dict(folder_splits)


def builtin_info(data: str) -> DataInfo:
    """The :class:`DataInfo` of a built-in data set, from its spec alone (nothing generated or read)."""
    from .builtin import BUILTIN_DATASETS

    spec = BUILTIN_DATASETS[data]
    return DataInfo(name=data, num_classes=spec.num_classes, in_chans=spec.in_chans, mean=spec.mean, std=spec.std,
                    classes=tuple(str(i) for i in range(spec.num_classes)))
