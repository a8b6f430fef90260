"""timm transforms, with random state fixed by (seed, epoch, sample index) alone, so that augmentation does not
depend on the workers or on where a run resumed (exact resume)."""

from __future__ import annotations

import random
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping, Optional

import numpy as np
import torch
from PIL import Image, ImageOps
from timm.data import create_transform, resolve_data_config
from torch.utils.data import Dataset, TensorDataset

__all__ = ["SeededTransformDataset", "build_transforms", "seeded_transform", "eval_data_config", "precompute", "sample_seed", "seeded_rng"]


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A seed in [0, 2**63) for one sample's augmentation, fixed by (run seed, epoch, index) alone."""
    return int(np.random.SeedSequence([seed, epoch, index]).generate_state(1, np.uint64)[0]) % 2**63


@contextmanager
def seeded_rng(seed: int) -> Iterator[None]:
    """Seed Python's, NumPy's and torch's CPU generators for the block, then restore their states."""
    py_state, np_state, torch_state = random.getstate(), np.random.get_state(), torch.get_rng_state()
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.default_generator.manual_seed(seed)
    try:
        yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.set_rng_state(torch_state)


class SeededTransformDataset(Dataset):
    """``transform(base[i])``; with a ``seed``, the transform's randomness is fixed by (seed, epoch, i)."""

    def __init__(self, base: Dataset, transform: Callable, seed: Optional[int] = None):
        self.base, self.transform, self.seed, self.epoch = base, transform, seed, 0

    def set_epoch(self, epoch: int) -> None:
        """Draw the next samples' augmentations from epoch ``epoch``'s stream."""
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> tuple[Any, int]:
        img, target = self.base[index]
        if self.seed is None:
            return self.transform(img), target
        with seeded_rng(sample_seed(self.seed, self.epoch, index)):
            return self.transform(img), target


def seeded_transform(split: Dataset, transform: Callable, seed: Optional[int] = None) -> Dataset:
    """``split`` with ``transform``, its randomness fixed by (seed, epoch, sample): a stream transforms (and with a
    seed, shuffles) itself; a map-style split is wrapped in a :class:`SeededTransformDataset`."""
    if hasattr(split, "transformed"):
        return split.transformed(transform, seed)
    return SeededTransformDataset(split, transform, seed=seed)


def precompute(dataset: Dataset) -> TensorDataset:
    """Apply a deterministic transform to every sample once: (N, C, H, W) images and (N,) labels in memory."""
    images, labels = zip(*(dataset[i] for i in range(len(dataset))))  # type: ignore[arg-type]
    return TensorDataset(torch.stack(images), torch.tensor(labels, dtype=torch.long))


def eval_data_config(pretrained_cfg: Optional[Mapping[str, Any]], *, in_chans: int = 3,
                     img_size: Optional[int] = None, interpolation: Optional[str] = None,
                     crop_pct: Optional[float] = None, crop_mode: Optional[str] = None,
                     mean: Optional[tuple[float, ...]] = None, std: Optional[tuple[float, ...]] = None
                     ) -> dict[str, Any]:
    """The evaluation preprocessing resolved as ``timm/validate.py`` does: values given here, then the model's
    ``pretrained_cfg``, then timm's defaults (``input_size``, ``interpolation``, ``mean``, ``std``, ``crop_*``)."""
    given = dict(in_chans=in_chans, img_size=img_size, interpolation=interpolation, crop_pct=crop_pct,
                 crop_mode=crop_mode, mean=mean, std=std)
    args = {key: value for key, value in given.items() if value is not None}
    return resolve_data_config(args, pretrained_cfg=dict(pretrained_cfg or {}) or None, use_test_size=True)


def build_transforms(img_size: int, mean: tuple[float, ...], std: tuple[float, ...], *,
                     train_scale: tuple[float, float] = (0.08, 1.0), hflip: float = 0.5, color_jitter: float = 0.4,
                     auto_augment: Optional[str] = None, reprob: float = 0.0, interpolation: str = "bicubic",
                     crop_pct: float = 0.875, crop_mode: str = "center", no_aug: bool = False
                     ) -> tuple[Callable, Callable]:
    """timm's ImageNet (train, val) transforms, ending in normalised tensors; ``no_aug``: train = val."""
    val = create_transform(img_size, is_training=False, interpolation=interpolation, mean=mean, std=std,
                           crop_pct=crop_pct, crop_mode=crop_mode)
    if no_aug:
        return val, val
    train = create_transform(img_size, is_training=True, scale=tuple(train_scale), hflip=hflip,
                             color_jitter=color_jitter, auto_augment=auto_augment, interpolation=interpolation,
                             mean=mean, std=std, re_prob=reprob, re_mode="pixel", re_count=1)
    _keep_posterize_in_range(train)
    return train, val


def _posterize(img: Image.Image, bits_to_keep: int, **_: Any) -> Image.Image:
    """timm's posterize for every bit count: ``PosterizeIncreasing`` (in ``rand-m9-mstd0.5-inc1``) maps the top
    magnitude to 0 bits, which Pillow 13 refuses; 0 bits give a black image."""
    if bits_to_keep >= 8:
        return img
    if bits_to_keep <= 0:
        return Image.new(img.mode, img.size)  # every bit masked away: black
    return ImageOps.posterize(img, bits_to_keep)


def _keep_posterize_in_range(transform: Callable) -> None:
    """Swap :func:`_posterize` into the posterize ops of any RandAugment/AutoAugment in ``transform``."""
    for step in getattr(transform, "transforms", ()):
        for op in getattr(step, "ops", ()):  # RandAugment's and AugMix's AugmentOps
            if getattr(op, "name", "").startswith("Posterize"):
                op.aug_fn = _posterize
        for sub_policy in getattr(step, "policy", ()):  # AutoAugment's sub-policies of AugmentOps
            for op in sub_policy:
                if getattr(op, "name", "").startswith("Posterize"):
                    op.aug_fn = _posterize
