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

__all__ = ["LargeScaleJitter", "RandomFlip", "SeededJitterDataset", "horizontal_flip", "masks_to_boxes",
           "resize_image"]


def resize_image(image: Tensor, size: tuple[int, int]) -> Tensor:
    """(C, H, W) -> (C, *size), bilinear and antialiased: PIL's ``BILINEAR`` resize, which detectron2 uses."""
    return F.interpolate(image[None], size=size, mode="bilinear", align_corners=False, antialias=True)[0]


def masks_to_boxes(masks: Tensor) -> Tensor:
    """(N, H, W) masks -> (N, 4) xyxy boxes around their pixels (x2 = last column + 1, as detectron2's
    ``BitMasks.get_bounding_boxes``); an empty mask's box has x1 > x2."""
    spans, masks = [], masks.bool()
    for hit in (masks.any(1), masks.any(2)):  # (N, W) columns, (N, H) rows holding a pixel of the mask
        index = torch.arange(hit.shape[1], dtype=torch.float32)
        spans += [torch.where(hit, index, float(hit.shape[1])).amin(1), torch.where(hit, index + 1, 0.0).amax(1)]
    x1, x2, y1, y2 = spans
    return torch.stack([x1, y1, x2, y2], 1)


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
    resize to fit a square of side ``s * size``, ``s ~ U(scale_range)`` (:func:`resize_image`; masks nearest),
    take a random ``size``² crop, pad to ``size``² with the ImageNet mean (zero once normalised). Boxes are those
    of the cropped masks (detectron2's ``recompute_boxes``); instances left with no box area are dropped.
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
        image = resize_image(image, (new_h, new_w))
        masks = target["masks"]  # (N, H, W); interpolate rejects N = 0
        masks = (F.interpolate(masks[None], size=(new_h, new_w), mode="nearest")[0] if len(masks)
                 else masks.new_zeros((0, new_h, new_w)))
        top = random.randint(0, max(0, new_h - self.size))
        left = random.randint(0, max(0, new_w - self.size))
        image = image[:, top:top + self.size, left:left + self.size]
        masks = masks[:, top:top + self.size, left:left + self.size]
        crop_h, crop_w = image.shape[-2:]
        boxes = masks_to_boxes(masks)
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
