"""UperNet (Xiao et al., ECCV 2018) on a feature pyramid, as mmsegmentation's ``UPerHead`` lays it out.

    pyramid levels C2..C5 (strides 4, 8, 16, 32)
    C5 -> pyramid pooling (scales 1, 2, 3, 6) -> 3x3 conv                         = P5
    Ci -> 1x1 lateral conv, + upsampled P(i+1) (top-down)  -> 3x3 conv            = Pi, i = 2..4
    [P2, up(P3), up(P4), up(P5)] -> concat -> 3x3 conv -> dropout -> 1x1 classifier (stride 4)
    -> bilinear upsampling x4, cut to the input's size (a pyramid may pad its input)

An optional FCN auxiliary head on the stride-16 level adds a deep-supervision loss in training. (transformers'
and segmentation_models_pytorch's UperNets build their own backbone; this one takes any pyramid module.)
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["DEFAULT_STRIDES", "ConvBNReLU", "FCNHead", "PyramidPooling", "UperNet", "UperNetHead"]


class ConvBNReLU(nn.Sequential):
    """Conv (no bias) -> BatchNorm -> ReLU, mmseg's ``ConvModule`` with its default norm and activation."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2, bias=False)
        nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")  # ConvModule's init
        super().__init__(conv, nn.BatchNorm2d(out_channels), nn.ReLU(inplace=True))


def _classifier(channels: int, num_classes: int) -> nn.Conv2d:
    """The 1x1 conv to class logits, initialised N(0, 0.01) with zero bias as mmseg's ``conv_seg``."""
    conv = nn.Conv2d(channels, num_classes, 1)
    nn.init.normal_(conv.weight, std=0.01)
    nn.init.zeros_(conv.bias)
    return conv


def _resize(x: Tensor, size: Sequence[int]) -> Tensor:
    return F.interpolate(x, size=tuple(size), mode="bilinear", align_corners=False)


class PyramidPooling(nn.Module):
    """PSPNet's pyramid pooling: average-pool to s x s for each scale s, 1x1 conv, upsample, concat with the input."""

    def __init__(self, in_channels: int, channels: int, pool_scales: Sequence[int]):
        super().__init__()
        self.stages = nn.ModuleList(
            nn.Sequential(nn.AdaptiveAvgPool2d(scale), ConvBNReLU(in_channels, channels, 1)) for scale in pool_scales
        )
        self.out_channels = in_channels + len(pool_scales) * channels

    def forward(self, x: Tensor) -> Tensor:  # (B, C_in, h, w) -> (B, C_in + S * channels, h, w)
        return torch.cat([x] + [_resize(stage(x), x.shape[-2:]) for stage in self.stages], dim=1)


class UperNetHead(nn.Module):
    """UperNet's decoder: pyramid pooling on the coarsest level, FPN top-down path, fusion, classifier."""

    def __init__(self, in_channels: Union[int, Sequence[int]], num_classes: int, channels: int = 512,
                 pool_scales: Sequence[int] = (1, 2, 3, 6), num_levels: int = 4, dropout: float = 0.1):
        super().__init__()
        in_channels = [in_channels] * num_levels if isinstance(in_channels, int) else list(in_channels)
        self.in_channels = in_channels
        self.ppm = PyramidPooling(in_channels[-1], channels, pool_scales)
        self.ppm_bottleneck = ConvBNReLU(self.ppm.out_channels, channels, 3)
        self.lateral_convs = nn.ModuleList(ConvBNReLU(c, channels, 1) for c in in_channels[:-1])
        self.fpn_convs = nn.ModuleList(ConvBNReLU(channels, channels, 3) for _ in in_channels[:-1])
        self.fuse = ConvBNReLU(len(in_channels) * channels, channels, 3)
        self.dropout = nn.Dropout2d(dropout)
        self.classifier = _classifier(channels, num_classes)

    def forward(self, features: Sequence[Tensor]) -> Tensor:  # L levels, finest first -> (B, K, H/4, W/4)
        if len(features) != len(self.in_channels):
            raise ValueError(f"UperNetHead was built for {len(self.in_channels)} levels, got {len(features)}")
        laterals = [conv(x) for conv, x in zip(self.lateral_convs, features)]  # (B, channels, h_i, w_i)
        laterals.append(self.ppm_bottleneck(self.ppm(features[-1])))  # (B, channels, h_L, w_L)
        for i in range(len(laterals) - 1, 0, -1):  # top-down: each level adds the coarser one, upsampled
            laterals[i - 1] = laterals[i - 1] + _resize(laterals[i], laterals[i - 1].shape[-2:])
        outs = [conv(x) for conv, x in zip(self.fpn_convs, laterals)] + [laterals[-1]]
        size = outs[0].shape[-2:]
        fused = self.fuse(torch.cat([outs[0]] + [_resize(x, size) for x in outs[1:]], dim=1))  # (B, channels, h_1, w_1)
        return self.classifier(self.dropout(fused))  # (B, K, h_1, w_1)


class FCNHead(nn.Module):
    """mmseg's auxiliary ``FCNHead`` (one 3x3 conv, no input concat) on a single pyramid level."""

    def __init__(self, in_channels: int, num_classes: int, channels: int = 256, dropout: float = 0.1):
        super().__init__()
        self.conv = ConvBNReLU(in_channels, channels, 3)
        self.dropout = nn.Dropout2d(dropout)
        self.classifier = _classifier(channels, num_classes)

    def forward(self, x: Tensor) -> Tensor:  # (B, C, h, w) -> (B, K, h, w)
        return self.classifier(self.dropout(self.conv(x)))


DEFAULT_STRIDES = {"0": 4, "1": 8, "2": 16, "3": 32}


def _to_input_size(logits: Tensor, stride: int, size: Sequence[int]) -> Tensor:
    """Logits of a stride-``stride`` map upsampled ``stride`` times, then cut to the input's ``size``: maps of
    a padded input cover more than the image, and resizing straight to ``size`` would stretch the padding."""
    height, width = int(size[0]), int(size[1])
    covered = (logits.shape[-2] * stride, logits.shape[-1] * stride)
    if covered[0] < height or covered[1] < width:
        raise ValueError(f"a stride-{stride} map of {tuple(logits.shape[-2:])} covers {covered[0]}x{covered[1]} "
                         f"pixels, less than the {height}x{width} input; the pyramid must pad (or keep) partial "
                         f"strides, not drop them")
    return _resize(logits, covered)[..., :height, :width]


class UperNet(nn.Module):
    """A pyramid (images -> {"0": stride 4, ..., "3": stride 32, ...}) with an UperNet head; each key's
    stride from the pyramid's ``strides`` if it has one, else ``DEFAULT_STRIDES``."""

    def __init__(self, pyramid: nn.Module, head: UperNetHead, aux_head: Optional[FCNHead] = None,
                 levels: Sequence[str] = ("0", "1", "2", "3"), aux_level: str = "2"):
        super().__init__()
        self.pyramid, self.head, self.aux_head = pyramid, head, aux_head
        self.levels, self.aux_level = tuple(levels), aux_level
        self.strides = dict(getattr(pyramid, "strides", DEFAULT_STRIDES))

    def forward(self, images: Tensor, with_aux: bool = False) -> Union[Tensor, tuple[Tensor, Optional[Tensor]]]:
        """Logits (B, num_classes, H, W) at the input's size; with ``with_aux``, (logits, auxiliary logits or
        None), through ``forward`` so that a DistributedDataParallel wrapper synchronises their gradients."""
        features = self.pyramid(images)
        size = images.shape[-2:]
        logits = self.head([features[key] for key in self.levels])  # (B, K, H/4, W/4)
        logits = _to_input_size(logits, self.strides[self.levels[0]], size)  # (B, K, H, W)
        if not with_aux:
            return logits
        if self.aux_head is None:
            return logits, None
        aux_logits = self.aux_head(features[self.aux_level])  # (B, K, H/16, W/16)
        return logits, _to_input_size(aux_logits, self.strides[self.aux_level], size)
