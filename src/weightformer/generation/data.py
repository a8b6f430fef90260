"""Training images for diffusion: the bundled MNIST (28 px, or zero-padded to a larger --img-size) or an ImageFolder tree
(resized and centre-cropped), as tensors in [-1, 1], with seeded per-epoch flips."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torch.utils.data import Dataset
from torchvision.transforms import functional as TF

from ..data import open_dataset
from ..data.builtin import BUILTIN_DATASETS
from ..engine.errors import ConfigError

__all__ = ["DiffusionImages", "ImageGeometry", "image_geometry", "open_images", "to_model_space", "to_uint8"]

MNIST_PADDED = 32  # 28 px digits padded by 2 px a side, so that patches of 2, 4 and 8 tile them


@dataclass(frozen=True)
class ImageGeometry:
    """Model inputs: ``size`` px square, ``pad`` px of zero border around ``size - 2·pad`` px originals (MNIST)."""

    size: int
    pad: int
    channels: int


def image_geometry(data: str, img_size: int | None) -> ImageGeometry:
    """MNIST: its 28 px padded to ``img_size`` if that is larger (to 32 if None); folders: ``img_size`` (default 256), RGB."""
    spec = BUILTIN_DATASETS.get(data)
    if spec is not None:
        if img_size is not None and img_size < spec.img_size:
            raise ConfigError(f"--img-size {img_size} is smaller than {data}'s {spec.img_size} px images, which are "
                              f"padded, never cropped or shrunk; pass --img-size {spec.img_size} or more")
        size = max(img_size or MNIST_PADDED, spec.img_size)
        return ImageGeometry(size, (size - spec.img_size) // 2, spec.in_chans)
    return ImageGeometry(img_size or 256, 0, 3)


def to_model_space(img: Image.Image, geometry: ImageGeometry) -> Tensor:
    """A PIL image -> (C, S, S) in [-1, 1]: padded (MNIST) or resized on its short side and centre-cropped."""
    if geometry.pad:
        x = TF.pil_to_tensor(img)
        x = torch.nn.functional.pad(x, [geometry.pad] * 4)
    else:
        img = TF.center_crop(TF.resize(img, geometry.size, interpolation=TF.InterpolationMode.BICUBIC), geometry.size)
        x = TF.pil_to_tensor(img.convert("RGB") if geometry.channels == 3 else img)
    return x.float() / 127.5 - 1.0


def to_uint8(x: Tensor, pad: int = 0) -> np.ndarray:
    """Model-space images (B, C, S, S) in [-1, 1] -> uint8 (B, H, W, C), the padding cropped off."""
    if pad:
        x = x[:, :, pad:-pad, pad:-pad]
    return ((x.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()


class DiffusionImages(Dataset):
    """(image (C, S, S) in [-1, 1], label) of a split, flipped with probability ``hflip`` by (seed, epoch, index)."""

    def __init__(self, base: Dataset, geometry: ImageGeometry, hflip: float = 0.0, seed: int = 0):
        self.base, self.geometry, self.hflip, self.seed, self.epoch = base, geometry, hflip, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        img, label = self.base[index]
        x = to_model_space(img, self.geometry)
        if self.hflip and np.random.default_rng((self.seed, self.epoch, index)).random() < self.hflip:
            x = x.flip(-1)
        return x, int(label)


def open_images(data: str, geometry: ImageGeometry, hflip: float, seed: int, verify: bool = True,
                warn: bool = True) -> tuple[Any, dict[str, DiffusionImages]]:
    """The data set's info (classes) and its train and val splits as :class:`DiffusionImages` (val never flipped)."""
    info, splits = open_dataset(data, verify=verify, warn=warn)
    return info, {"train": DiffusionImages(splits["train"], geometry, hflip, seed),
                  "val": DiffusionImages(splits["val"], geometry)}
