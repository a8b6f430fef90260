"""Test-time inference: the whole image in one pass, or overlapping crops (mmseg's ``slide`` mode).

Both take a batch (B, 3, H, W) and return float32 logits (B, K, H, W) at the batch's size. A model
trained on 512x512 crops sees crops of that size at test time with sliding windows; whole-image
inference sees the resized image at once.
"""

from __future__ import annotations

from typing import Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["INFERENCE_MODES", "slide_inference", "whole_inference", "window_starts"]

INFERENCE_MODES = ("whole", "slide")  # --inference


def _pair(value: Union[int, tuple[int, int]]) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


def whole_inference(model: nn.Module, images: Tensor) -> Tensor:
    """``model(images)`` as float32, resized (bilinear) to the images' size if the model returns fewer pixels."""
    logits = model(images)  # (B, K, h, w)
    if logits.shape[-2:] != images.shape[-2:]:
        logits = F.interpolate(logits, size=images.shape[-2:], mode="bilinear", align_corners=False)
    return logits.float()


def window_starts(size: int, crop: int, stride: int) -> list[int]:
    """Offsets of the windows along one side: every ``stride``, the last one flush with the end.

    ``size`` is at least ``crop`` (smaller images are padded first). The count is mmseg's,
    ceil((size - crop) / stride) + 1, so the windows cover every pixel.
    """
    count = (size - crop + stride - 1) // stride + 1
    return [min(i * stride, size - crop) for i in range(count)]


def slide_inference(
    model: nn.Module,
    images: Tensor,
    crop: Union[int, tuple[int, int]] = 512,
    stride: Union[int, tuple[int, int]] = 341,
) -> Tensor:
    """Logits averaged over overlapping ``crop`` windows placed every ``stride`` pixels.

    Each window's logits are added where it lies and every pixel is divided by the number of
    windows that cover it. An image smaller than the crop is zero-padded at the bottom and right
    to the crop's size (as training batches are padded) and the padding is cut off the result.
    The number of classes is read from the model's output.
    """
    (crop_h, crop_w), (stride_h, stride_w) = _pair(crop), _pair(stride)
    if min(crop_h, crop_w, stride_h, stride_w) <= 0:
        raise ValueError(f"crop {crop} and stride {stride} must be positive")
    if stride_h > crop_h or stride_w > crop_w:
        raise ValueError(f"stride {stride} is larger than crop {crop}: the windows would leave pixels out")
    height, width = images.shape[-2:]
    padded = F.pad(images, (0, max(crop_w - width, 0), 0, max(crop_h - height, 0)))  # (B, 3, H', W')
    padded_h, padded_w = padded.shape[-2:]
    total = None  # (B, K, H', W') sum of window logits, allocated once K is known
    count = torch.zeros(padded_h, padded_w, device=images.device)  # windows covering each pixel
    for top in window_starts(padded_h, crop_h, stride_h):
        for left in window_starts(padded_w, crop_w, stride_w):
            window = padded[..., top : top + crop_h, left : left + crop_w]
            logits = whole_inference(model, window)  # (B, K, crop_h, crop_w)
            if total is None:
                total = logits.new_zeros(*logits.shape[:2], padded_h, padded_w)
            total[..., top : top + crop_h, left : left + crop_w] += logits
            count[top : top + crop_h, left : left + crop_w] += 1
    return (total / count)[..., :height, :width]
