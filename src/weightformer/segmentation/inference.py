"""Test-time inference, (B, 3, H, W) images -> float32 logits (B, K, H, W): the whole image in one pass, or
overlapping crops (mmseg's ``slide`` mode); :func:`infer_each` predicts each image of a padded batch alone.

A WeightFormer's dynamic weights pool the whole input, so padding changes every output. So an image's logits
depend on that image only: whole inference takes it at its own size (the pyramid pads it to a multiple of 32),
and sliding windows are all exactly the crop, the canvas training crops are padded to."""

from __future__ import annotations

from typing import Iterator, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..engine.device import autocast
from .config import INFERENCE_MODES

__all__ = ["INFERENCE_MODES", "infer", "infer_each", "slide_inference", "whole_inference", "window_starts"]


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
    """mmseg's ``slide_inference`` on one canvas: logits averaged over ``crop`` windows every ``stride`` px,
    covering each pixel. A side shorter than the crop is zero-padded (bottom, right) to it once, so that every
    window is exactly the crop; the logits are cut back to the images' size."""
    (crop_h, crop_w), (stride_h, stride_w) = ((v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))
                                              for v in (crop, stride))
    if min(crop_h, crop_w, stride_h, stride_w) <= 0:
        raise ValueError(f"crop {crop} and stride {stride} must be positive")
    if stride_h > crop_h or stride_w > crop_w:
        raise ValueError(f"stride {stride} is larger than crop {crop}: the windows would leave pixels out")
    height, width = images.shape[-2:]
    canvas = F.pad(images, (0, max(crop_w - width, 0), 0, max(crop_h - height, 0)))  # (B, 3, >= crop_h, >= crop_w)
    total = None  # (B, K, H', W') sum of window logits, allocated once K is known
    count = torch.zeros(canvas.shape[-2:], device=images.device)  # windows covering each pixel
    for top in window_starts(canvas.shape[-2], crop_h, stride_h):
        for left in window_starts(canvas.shape[-1], crop_w, stride_w):
            logits = whole_inference(model, canvas[..., top : top + crop_h, left : left + crop_w])  # (B, K, crop)
            if total is None:
                total = logits.new_zeros(*logits.shape[:2], *canvas.shape[-2:])
            total[..., top : top + crop_h, left : left + crop_w] += logits
            count[top : top + crop_h, left : left + crop_w] += 1
    return (total / count)[..., :height, :width]


def infer(model: nn.Module, images: Tensor, mode: str = "whole", crop: int = 512, stride: int = 341) -> Tensor:
    """:func:`whole_inference` or :func:`slide_inference` by ``mode`` (one of :data:`INFERENCE_MODES`)."""
    if mode not in INFERENCE_MODES:
        raise ValueError(f"inference mode {mode!r} is not one of {', '.join(INFERENCE_MODES)}")
    return whole_inference(model, images) if mode == "whole" else slide_inference(model, images, crop, stride)


def infer_each(model: nn.Module, images: Tensor, sizes: Sequence[Sequence[int]], mode: str = "whole",
               crop: int = 512, stride: int = 341, amp: str = "none") -> Iterator[Tensor]:
    """(1, K, h, w) float32 logits of each image of a zero-padded batch (B, 3, H, W), cut to its (h, w) of
    ``sizes`` and predicted alone: the same whatever else is in the batch and however it is padded."""
    for image, (height, width) in zip(images, sizes):
        with autocast(images.device, amp):
            logits = infer(model, image[None, :, : int(height), : int(width)], mode, crop, stride)
        yield logits  # outside autocast: the caller's work on it runs as it would without
