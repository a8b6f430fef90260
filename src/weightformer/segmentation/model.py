"""``build_upernet``: a backbone, its feature pyramid and an UperNet head, composed into one model."""

from __future__ import annotations

from typing import Any, Sequence, Union

from torch import nn

from ..models.pyramid import SimpleFeaturePyramid, build_backbone
from ..models.upernet import FCNHead, UperNet, UperNetHead

__all__ = ["build_upernet"]


def _is_pyramid(module: nn.Module) -> bool:
    """A torchvision-style pyramid: returns {"0": ..., "3": ...} feature maps and says their ``out_channels``."""
    return isinstance(getattr(module, "out_channels", None), int)


def build_upernet(
    backbone: Union[str, nn.Module],
    num_classes: int,
    channels: int = 512,
    pyramid_channels: int = 256,
    aux_channels: int = 256,
    pool_scales: Sequence[int] = (1, 2, 3, 6),
    **kwargs: Any,
) -> UperNet:
    """UperNet on ``backbone``: (B, 3, H, W) images -> (B, num_classes, H, W) logits.

    ``backbone`` is a timm model name (made by :func:`weightformer.models.pyramid.build_backbone`
    with ``**kwargs``, e.g. ``pretrained=True``, ``drop_path_rate=0.1``), a timm backbone module,
    or a module that already returns a pyramid (a dict of stride 4, 8, 16, 32 maps with an
    ``out_channels`` attribute), used as it is. Names and backbone modules get a
    :class:`weightformer.models.pyramid.SimpleFeaturePyramid` of ``pyramid_channels`` channels.
    ``channels`` is the head's width; ``aux_channels`` 0 leaves out the auxiliary FCN head.
    """
    if isinstance(backbone, nn.Module) and _is_pyramid(backbone):
        if kwargs:
            raise TypeError(f"build_upernet got a ready pyramid, so it cannot take arguments {sorted(kwargs)}")
        pyramid = backbone
    else:
        if isinstance(backbone, str):
            backbone = build_backbone(backbone, **kwargs)
        elif kwargs:
            raise TypeError(f"build_upernet got a backbone module, so it cannot take arguments {sorted(kwargs)}")
        pyramid = SimpleFeaturePyramid(backbone, out_channels=pyramid_channels, top_block=False)  # no "pool" level
    head = UperNetHead(pyramid.out_channels, num_classes, channels=channels, pool_scales=pool_scales)
    aux_head = FCNHead(pyramid.out_channels, num_classes, channels=aux_channels) if aux_channels else None
    return UperNet(pyramid, head, aux_head)
