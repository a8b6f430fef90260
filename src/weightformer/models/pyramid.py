"""ViTDet's simple feature pyramid (Li et al., arXiv 2203.16527): a plain stride-16 backbone's last map as a
torchvision detection backbone, one small module per scale:

    stride 4:  ConvT 2×2 (C -> C/2) -> LayerNorm -> GELU -> ConvT 2×2 (C/2 -> C/4)
    stride 8:  ConvT 2×2 (C -> C/2);  stride 16: identity;  stride 32: max-pool 2×2
    each then: Conv 1×1 -> LayerNorm -> Conv 3×3 -> LayerNorm   (out_channels, LayerNorm over channels)
    "pool":    stride 64, the stride-32 map subsampled by 2 (torchvision's LastLevelMaxPool), for the RPN

``final_norm=False`` reads the last block before the final norm, as ViTDet's ViT does, and freezes that norm
(no unused parameter for DDP). ``conv_init``: ``"c2_xavier"`` is detectron2's FPN init, ``"pytorch"``
PyTorch's. Sides are zero-padded to multiples of 32 at the bottom and right: level k of an H×W image is
(⌈H/32⌉·32/stride_k) × (⌈W/32⌉·32/stride_k). Any timm model with ``forward_intermediates`` and a stride-16
``feature_info`` works (timm's ViT/DeiT with ``dynamic_img_size=True``, which ``build_backbone`` passes).
"""

import math
from collections import OrderedDict
from typing import Any, Dict, Sequence, Tuple

import timm
import torch.nn.functional as F
from timm.layers import LayerNorm2d
from timm.models import get_pretrained_cfg
from torch import Tensor, nn

__all__ = ["CONV_INITS", "SimpleFeaturePyramid", "build_backbone", "pad_to_multiple", "plain_backbone_width"]

CONV_INITS = ("c2_xavier", "pytorch")


def build_backbone(name: str, pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """A timm model ready for dense inputs of any size: no classifier, and ``dynamic_img_size=True`` for
    models whose pretrained config fixes the input size (timm's ViT/DeiT)."""
    if not timm.is_model(name):
        raise ValueError(f"unknown timm model {name!r}; list names with timm.list_models('*{name[:6]}*')")
    cfg = get_pretrained_cfg(name)
    if cfg is not None and cfg.fixed_input_size:
        kwargs.setdefault("dynamic_img_size", True)
    backbone = timm.create_model(name, pretrained=pretrained, num_classes=0, **kwargs)
    if not hasattr(backbone, "forward_intermediates"):
        raise ValueError(f"{name} has no forward_intermediates; the pyramid needs a timm model that has it")
    return backbone


def plain_backbone_width(backbone: nn.Module) -> int:
    """The width of a plain stride-16 timm backbone's last block; ValueError for anything else."""
    if not hasattr(backbone, "forward_intermediates") or not hasattr(backbone, "feature_info"):
        raise ValueError(f"{type(backbone).__name__} lacks forward_intermediates/feature_info; pass a timm model "
                         f"such as build_backbone('weightformer_tiny')")
    last = backbone.feature_info[-1]
    if last["reduction"] != 16:
        raise ValueError(f"the pyramid expects a stride-16 backbone, {type(backbone).__name__} has stride "
                         f"{last['reduction']}")
    return last["num_chs"]


def pad_to_multiple(images: Tensor, d: int) -> Tensor:
    """Zeros at the bottom and right: (B, 3, H, W) -> (B, 3, H', W'), H' and W' multiples of ``d``."""
    H, W = images.shape[-2:]
    return F.pad(images, (0, math.ceil(W / d) * d - W, 0, math.ceil(H / d) * d - H))


def _norm(norm: str, channels: int) -> nn.Module:
    return LayerNorm2d(channels) if norm == "LN" else nn.Identity()


def _conv(in_chs: int, out_chs: int, kernel_size: int, norm: str, init: str) -> nn.Sequential:
    """Conv (no bias before a norm) -> norm; ``init`` c2_xavier: detectron2's c2_xavier_fill."""
    conv = nn.Conv2d(in_chs, out_chs, kernel_size, padding=kernel_size // 2, bias=norm == "")
    if init == "c2_xavier":
        nn.init.kaiming_uniform_(conv.weight, a=1)
        if conv.bias is not None:
            nn.init.zeros_(conv.bias)
    return nn.Sequential(conv, _norm(norm, out_chs))


def _resample(scale: float, dim: int, norm: str) -> Tuple[nn.Sequential, int]:
    """The module that brings the stride-16 map of ``dim`` channels to stride 16 / scale, and its channels."""
    if scale == 4.0:
        return nn.Sequential(nn.ConvTranspose2d(dim, dim // 2, 2, stride=2), _norm(norm, dim // 2), nn.GELU(),
                             nn.ConvTranspose2d(dim // 2, dim // 4, 2, stride=2)), dim // 4
    if scale == 2.0:
        return nn.Sequential(nn.ConvTranspose2d(dim, dim // 2, 2, stride=2)), dim // 2
    if scale == 1.0:
        return nn.Sequential(), dim
    if scale == 0.5:
        return nn.Sequential(nn.MaxPool2d(kernel_size=2, stride=2)), dim
    raise ValueError(f"scale {scale} is not one of ViTDet's 4.0, 2.0, 1.0, 0.5")


def _level(scale: float, dim: int, out_channels: int, norm: str, init: str) -> nn.Sequential:
    """One pyramid level: resample, then Conv 1×1 -> norm -> Conv 3×3 -> norm."""
    resample, chs = _resample(scale, dim, norm)
    return nn.Sequential(resample, _conv(chs, out_channels, 1, norm, init),
                         _conv(out_channels, out_channels, 3, norm, init))


class SimpleFeaturePyramid(nn.Module):
    """(B, 3, H, W) -> ordered dict "0", "1", ... (one per scale, finest first) and "pool" (if ``top_block``),
    each (B, out_channels, h, w); ``strides`` gives each key's stride."""

    def __init__(self, backbone: nn.Module, out_channels: int = 256, scales: Sequence[float] = (4.0, 2.0, 1.0, 0.5),
                 norm: str = "LN", top_block: bool = True, final_norm: bool = True, conv_init: str = "c2_xavier"):
        super().__init__()
        dim, in_stride = plain_backbone_width(backbone), 16
        if norm not in ("LN", ""):
            raise ValueError(f"norm must be 'LN' (LayerNorm over channels) or '' (none), got {norm!r}")
        if conv_init not in CONV_INITS:
            raise ValueError(f"conv_init must be one of {', '.join(CONV_INITS)}, got {conv_init!r}")
        scales = [float(s) for s in scales]
        if not scales or scales != sorted(scales, reverse=True) or len(set(scales)) != len(scales):
            raise ValueError(f"scales must be distinct and decreasing (finest level first), got {scales}")
        self.backbone = backbone
        self.out_channels = out_channels
        self.levels = nn.ModuleList(_level(s, dim, out_channels, norm, conv_init) for s in scales)
        self.final_norm = final_norm
        if not final_norm:  # the norm is out of the forward: frozen, so that DDP sees no gradient missing
            for p in getattr(backbone, "norm", nn.Identity()).parameters():
                p.requires_grad_(False)
        self.top_block = top_block
        self.strides: Dict[str, int] = {str(i): int(in_stride / s) for i, s in enumerate(scales)}
        self.size_divisor = max(in_stride, *self.strides.values())  # every level, and the backbone, divide it
        if top_block:
            self.strides["pool"] = 2 * self.strides[str(len(scales) - 1)]

    def forward(self, images: Tensor) -> "OrderedDict[str, Tensor]":
        images = pad_to_multiple(images, self.size_divisor)  # (B, 3, H', W')
        x = self.backbone.forward_intermediates(  # the last block: [(B, C, H'/16, W'/16)]
            images, indices=1, norm=self.final_norm, output_fmt="NCHW", intermediates_only=True)[-1]
        feats = OrderedDict((str(i), level(x)) for i, level in enumerate(self.levels))  # (B, out, H'/s, W'/s)
        if self.top_block:
            coarsest = feats[str(len(self.levels) - 1)]
            feats["pool"] = F.max_pool2d(coarsest, kernel_size=1, stride=2)  # (B, out, ceil(h / 2), ceil(w / 2))
        return feats
