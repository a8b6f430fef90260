"""Training augmentations of detection samples, each ``(image, target) -> (image, target)``, applied seeded by
:class:`SeededJitterDataset`."""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F
from timm.data import IMAGENET_DEFAULT_MEAN
from torch import Tensor

from ..data.transforms import SeededTransformDataset, sample_seed, seeded_rng
from .data import INSTANCE_KEYS, Target

__all__ = ["LargeScaleJitter", "RandomFlip", "SeededJitterDataset", "horizontal_flip"]


def horizontal_flip(image: Tensor, target: Target) -> tuple[Tensor, Target]:
    """The image, its masks and its boxes mirrored left to right."""
    width = image.shape[-1]
    target = dict(target)
    target["masks"] = target["masks"].flip(-1)
    target["boxes"] = torch.stack([width - target["boxes"][:, 2], target["boxes"][:, 1],
                                   width - target["boxes"][:, 0], target["boxes"][:, 3]], dim=1)
    return image.flip(-1), target


class RandomFlip:
    """Flip with probability ``flip`` (the 1× schedule's pipeline: the model's own transform resizes)."""

    def __init__(self, flip: float = 0.5):
        self.flip = flip

    def __call__(self, image: Tensor, target: Target) -> tuple[Tensor, Target]:
        return horizontal_flip(image, target) if random.random() < self.flip else (image, dict(target))


class LargeScaleJitter:
    """Large-scale jitter (Ghiasi et al., 2021), ViTDet's training augmentation: flip with probability ``flip``,
    resize to fit a square of side ``s * size``, ``s ~ U(scale_range)``, take a random ``size``² crop, pad to
    ``size``² with the ImageNet mean (zero once normalised); instances left with no box area are dropped.
    Draws from Python's ``random`` (``weightformer.data.seeded_rng`` fixes a sample)."""

    def __init__(self, size: int = 1024, scale_range: tuple[float, float] = (0.1, 2.0), flip: float = 0.5):
        self.size, self.scale_range, self.flip = size, scale_range, flip

    def __call__(self, image: Tensor, target: Target) -> tuple[Tensor, Target]:
        target = dict(target)
        height, width = image.shape[-2:]
        if random.random() < self.flip:
            image, target = horizontal_flip(image, target)
        scale = random.uniform(*self.scale_range) * self.size / max(height, width)
        new_h, new_w = max(1, round(height * scale)), max(1, round(width * scale))
        image = F.interpolate(image[None], size=(new_h, new_w), mode="bilinear", align_corners=False)[0]
        masks = target["masks"]  # (N, H, W); interpolate rejects N = 0
        masks = (F.interpolate(masks[None], size=(new_h, new_w), mode="nearest")[0] if len(masks)
                 else masks.new_zeros((0, new_h, new_w)))
        boxes = target["boxes"] * torch.tensor([new_w / width, new_h / height] * 2)
        top = random.randint(0, max(0, new_h - self.size))
        left = random.randint(0, max(0, new_w - self.size))
        image = image[:, top:top + self.size, left:left + self.size]
        masks = masks[:, top:top + self.size, left:left + self.size]
        crop_h, crop_w = image.shape[-2:]
        boxes = boxes - torch.tensor([left, top, left, top], dtype=boxes.dtype)
        boxes[:, 0::2] = boxes[:, 0::2].clamp(0, crop_w)
        boxes[:, 1::2] = boxes[:, 1::2].clamp(0, crop_h)
        pad = (0, self.size - crop_w, 0, self.size - crop_h)
        mean = torch.tensor(IMAGENET_DEFAULT_MEAN, dtype=image.dtype)[:, None, None]
        image = F.pad(image - mean, pad) + mean
        masks = F.pad(masks, pad)
        keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
        target.update(boxes=boxes, masks=masks)
        target.update({k: target[k][keep] for k in INSTANCE_KEYS})
        return image, target


class SeededJitterDataset(SeededTransformDataset):
    """``transform(*base[i])`` with the randomness fixed by (seed, epoch, i), as
    :class:`~weightformer.data.SeededTransformDataset` does for an image alone."""

    def __getitem__(self, index: int) -> tuple[Tensor, Target]:
        image, target = self.base[index]
        with seeded_rng(sample_seed(self.seed, self.epoch, index)):
            return self.transform(image, target)
