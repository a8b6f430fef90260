"""BEiT's and Vim's ViT UperNet neck: four blocks spread over a plain backbone's depth, at strides 4 to 32.

Unlike ViTDet's simple pyramid (:mod:`.pyramid`), BEiT (microsoft/unilm) and Vim (hustvl/Vim) read four blocks,
``out_indices`` (5, 11, 17, 23 of Vim's 24), and resample each to its own stride at the backbone's width C:

    block out_indices[0] -> ConvT 2x2 -> BatchNorm -> GELU -> ConvT 2x2   stride 4
    block out_indices[1] -> ConvT 2x2                                    stride 8
    block out_indices[2] -> identity                                      stride 16
    block out_indices[3] -> max-pool 2x2                                  stride 32

UperNet's lateral convs come next; the transposed convs keep PyTorch's init, as in both references. The blocks
are read without the final norm, which stays in the backbone (a classifier's weights load as they are) and is
frozen; so the last index must be the last block. Sides are zero-padded to multiples of 32, as in the simple
pyramid.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Dict, Optional, Sequence

from torch import Tensor, nn

from .pyramid import pad_to_multiple, plain_backbone_width

__all__ = ["MultiBlockPyramid", "spread_indices"]

STRIDES = (4, 8, 16, 32)  # one level per block read


def spread_indices(depth: int) -> list[int]:
    """Four block indices over ``depth`` blocks, the last and every (depth // 4)-th before it:
    24 -> [5, 11, 17, 23] (Vim's), 17 -> [4, 8, 12, 16], 12 -> [2, 5, 8, 11] (mmseg's ViT), 4 -> [0, 1, 2, 3]."""
    if depth < len(STRIDES):
        raise ValueError(f"the multi-block pyramid reads {len(STRIDES)} different blocks, and the backbone has "
                         f"{depth}; use a deeper backbone or the simple-pyramid protocol")
    step = depth // len(STRIDES)
    return [depth - 1 - step * (len(STRIDES) - 1 - k) for k in range(len(STRIDES))]


def _resample(stride: int, dim: int) -> nn.Module:
    """The module that brings a stride-16 map of ``dim`` channels to ``stride``, at the same width."""
    if stride == 4:
        return nn.Sequential(nn.ConvTranspose2d(dim, dim, 2, stride=2), nn.BatchNorm2d(dim), nn.GELU(),
                             nn.ConvTranspose2d(dim, dim, 2, stride=2))
    if stride == 8:
        return nn.ConvTranspose2d(dim, dim, 2, stride=2)
    if stride == 16:
        return nn.Identity()
    return nn.MaxPool2d(kernel_size=2, stride=2)


class MultiBlockPyramid(nn.Module):
    """(B, 3, H, W) -> ordered dict {"0": stride 4, ..., "3": stride 32} of (B, C, h_k, w_k) maps, C the
    backbone's width; ``out_indices`` are the blocks read (``feature_info`` needs one entry per block)."""

    def __init__(self, backbone: nn.Module, out_indices: Optional[Sequence[int]] = None):
        super().__init__()
        dim = plain_backbone_width(backbone)
        depth = len(backbone.feature_info)
        indices = spread_indices(depth) if out_indices is None else [int(i) for i in out_indices]
        if (len(indices) != len(STRIDES) or indices != sorted(set(indices)) or indices[0] < 0
                or indices[-1] != depth - 1):
            raise ValueError(f"out_indices must be {len(STRIDES)} increasing block indices ending with the last "
                             f"block, {depth - 1} (the blocks after it would get no gradient), got {indices}")
        norm = getattr(backbone, "norm", None)
        if isinstance(norm, nn.Module):
            norm.requires_grad_(False)  # not read: see the module docstring
        self.backbone = backbone
        self.out_indices = indices
        self.out_channels = dim
        self.levels = nn.ModuleList(_resample(stride, dim) for stride in STRIDES)
        self.strides: Dict[str, int] = {str(k): stride for k, stride in enumerate(STRIDES)}

    def forward(self, images: Tensor) -> "OrderedDict[str, Tensor]":
        images = pad_to_multiple(images, STRIDES[-1])  # (B, 3, H', W')
        blocks = self.backbone.forward_intermediates(  # 4 x (B, C, H'/16, W'/16), without the final norm
            images, indices=self.out_indices, norm=False, output_fmt="NCHW", intermediates_only=True)
        return OrderedDict((str(k), level(x)) for k, (level, x) in enumerate(zip(self.levels, blocks)))
