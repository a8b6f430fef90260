"""``build_upernet``: a backbone, its feature pyramid, an UperNet head and an auxiliary FCN head, by protocol:
``vim`` (BEiT's and Vim's ViT UperNet, the paper's ADE20K protocol): four blocks spread over the depth at strides
4-32 and the backbone's width, a head as wide; ``simple-pyramid`` (the protocol of checkpoints that record none):
ViTDet's simple feature pyramid on the last block, 256 wide, and a 512-channel head."""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

from torch import nn

from ..models.multiblock_pyramid import MultiBlockPyramid
from ..models.pyramid import SimpleFeaturePyramid, build_backbone
from ..models.upernet import FCNHead, UperNet, UperNetHead
from .config import PROTOCOLS

__all__ = ["PROTOCOLS", "build_upernet"]

SIMPLE_PYRAMID_CHANNELS = 256  # the simple pyramid's default width
SIMPLE_PYRAMID_HEAD_CHANNELS = 512  # mmseg's UPerHead default, the simple-pyramid protocol's head width


def _pyramid(backbone: nn.Module, protocol: str, pyramid_channels: Optional[int],
             out_indices: Optional[Sequence[int]]) -> nn.Module:
    """The protocol's pyramid on a timm ``backbone``; ValueError for an option of the other protocol."""
    if protocol == "vim":
        if pyramid_channels is not None:
            raise ValueError(f"pyramid_channels={pyramid_channels} is the simple-pyramid protocol's width, and the vim "
                             f"protocol's levels keep the backbone's: leave it out, or use --protocol simple-pyramid")
        return MultiBlockPyramid(backbone, out_indices)
    if out_indices is not None:
        raise ValueError(f"out_indices={list(out_indices)} is the vim protocol's, and the simple pyramid reads the "
                         f"last block only: leave it out, or use --protocol vim")
    channels = SIMPLE_PYRAMID_CHANNELS if pyramid_channels is None else pyramid_channels
    return SimpleFeaturePyramid(backbone, out_channels=channels, top_block=False)  # no "pool" level


def build_upernet(backbone: Union[str, nn.Module], num_classes: int, protocol: str = "simple-pyramid",
                  channels: Optional[int] = None, pyramid_channels: Optional[int] = None, aux_channels: int = 256,
                  pool_scales: Sequence[int] = (1, 2, 3, 6), out_indices: Optional[Sequence[int]] = None,
                  **kwargs: Any) -> UperNet:
    """UperNet, (B, 3, H, W) images -> (B, num_classes, H, W) logits, on ``backbone``: a timm name (built with
    ``**kwargs``) or backbone, given ``protocol``'s pyramid, or a ready pyramid (stride 4-32 maps, ``out_channels``).
    ``channels``: the head's width (default: the pyramid's under ``vim``, else 512); ``aux_channels`` 0: no FCN head."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol {protocol!r} is not one of {', '.join(PROTOCOLS)}")
    if isinstance(backbone, nn.Module) and isinstance(getattr(backbone, "out_channels", None), int):  # a pyramid
        if kwargs:
            raise TypeError(f"build_upernet got a ready pyramid, so it cannot take arguments {sorted(kwargs)}")
        pyramid = backbone
    else:
        if isinstance(backbone, str):
            backbone = build_backbone(backbone, **kwargs)
        elif kwargs:
            raise TypeError(f"build_upernet got a backbone module, so it cannot take arguments {sorted(kwargs)}")
        pyramid = _pyramid(backbone, protocol, pyramid_channels, out_indices)
    if channels is None:
        channels = pyramid.out_channels if protocol == "vim" else SIMPLE_PYRAMID_HEAD_CHANNELS
    head = UperNetHead(pyramid.out_channels, num_classes, channels=channels, pool_scales=pool_scales)
    aux_head = FCNHead(pyramid.out_channels, num_classes, channels=aux_channels) if aux_channels else None
    return UperNet(pyramid, head, aux_head, aux_level="2")
