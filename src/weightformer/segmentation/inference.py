"""Test-time inference, (B, 3, H, W) images -> float32 logits (B, K, H, W): the whole image in one pass, or
overlapping crops (mmseg's ``slide`` mode)."""

from __future__ import annotations

from typing import Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import INFERENCE_MODES

__all__ = ["INFERENCE_MODES", "slide_inference", "whole_inference", "window_starts"]


def whole_inference(model: nn.Module, images: Tensor) -> Tensor:
    """``model(images)`` as float32, resized (bilinear) to the images' size if the model returns fewer pixels."""
    logits = model(images)  # (B, K, h, w)
    if logits.shape[-2:] != images.shape[-2:]:
        logits = F.interpolate(logits, size=images.shape[-2:], mode="bilinear", align_corners=False)
    return logits.float()


def window_starts(size: int, crop: int, stride: int) -> list[int]:
    """Window offsets along one side: every ``stride``, the last flush with the end, ceil((size - crop) / stride)
    + 1 of them (mmseg's); one at 0 for a side shorter than the crop."""
    count = max(size - crop + stride - 1, 0) // stride + 1
    return [max(min(i * stride, size - crop), 0) for i in range(count)]


def slide_inference(model: nn.Module, images: Tensor, crop: Union[int, tuple[int, int]] = 512,
                    stride: Union[int, tuple[int, int]] = 341) -> Tensor:
    """mmseg's ``slide_inference``: logits averaged over the ``crop`` windows, every ``stride`` px, covering each
    pixel; along a side shorter than the crop the window is the whole side, unpadded."""
    (crop_h, crop_w), (stride_h, stride_w) = ((v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))
                                              for v in (crop, stride))
    if min(crop_h, crop_w, stride_h, stride_w) <= 0:
        raise ValueError(f"crop {crop} and stride {stride} must be positive")
    if stride_h > crop_h or stride_w > crop_w:
        raise ValueError(f"stride {stride} is larger than crop {crop}: the windows would leave pixels out")
    height, width = images.shape[-2:]
    window_h, window_w = min(crop_h, height), min(crop_w, width)
    total = None  # (B, K, H, W) sum of window logits, allocated once K is known
    count = torch.zeros(height, width, device=images.device)  # windows covering each pixel
    for top in window_starts(height, crop_h, stride_h):
        for left in window_starts(width, crop_w, stride_w):
            window = images[..., top : top + window_h, left : left + window_w]
            logits = whole_inference(model, window)  # (B, K, window_h, window_w)
            if total is None:
                total = logits.new_zeros(*logits.shape[:2], height, width)
            total[..., top : top + window_h, left : left + window_w] += logits
            count[top : top + window_h, left : left + window_w] += 1
    return total / count
