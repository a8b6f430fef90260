"""The image sizes an export may be traced at, checked before any tracing: the model must take the example, its
last feature map must not be tiny (tracers specialise a side of 1, and WeightFormer's 2×2 pooling takes other
paths under 4×4 tokens), and it must take the other sizes the export serves.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Optional

import torch
from torch import nn

from ..engine.errors import ConfigError

__all__ = ["check_export_sizes", "min_export_side"]


def _reduction(model: nn.Module) -> Optional[int]:
    """The stride of the model's last feature map in pixels (timm's ``feature_info``), if it says."""
    info = getattr(model, "feature_info", None)
    try:
        return int(info[-1]["reduction"])
    except (TypeError, KeyError, IndexError, ValueError):
        return None


def min_export_side(model: nn.Module) -> Optional[int]:
    """The smallest example side an export of ``model`` may be traced at (None: unknown): 4×4 tokens for a model
    with WeightFormer's dynamic layers, 2×2 for any other."""
    from ..layers import DynamicDWConv, DynamicLinear

    reduction = _reduction(model)
    if reduction is None:
        return None
    dynamic = any(isinstance(m, (DynamicLinear, DynamicDWConv)) for m in model.modules())
    return (4 if dynamic else 2) * reduction


def _name(model: nn.Module) -> str:
    cfg = getattr(model, "pretrained_cfg", None) or {}
    return str(cfg.get("architecture") or type(model).__name__)


def check_export_sizes(model: nn.Module, in_chans: int, size: Sequence[int],
                       others: Iterable[Sequence[int]] = ()) -> None:
    """ConfigError unless ``model`` can be exported from an example of ``size`` (height, width) and serve the
    (batch, height, width) of ``others``. Leaves the model in eval mode."""
    from ..classification.model import check_input_size

    h, w = size
    name = _name(model)
    model.eval()
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    for side in sorted({h, w}):  # an image smaller than one patch, or a size the model refuses: one line
        check_input_size(model, {"model": name, "in_chans": in_chans, "img_size": side}, device)
    least = min_export_side(model)
    if least is not None and min(h, w) < least:
        grid = least // (_reduction(model) or 1)
        raise ConfigError(
            f"an export traced at {h}x{w} px would give {name} a feature map under {grid}x{grid} tokens, and the "
            f"tracer would bake in the code paths of that small grid (the file would take no other size); pass "
            f"--img-size {least} or more (the file then takes every size from that grid up)")
    for batch, oh, ow in others:
        try:
            with torch.no_grad():
                model(torch.zeros(batch, in_chans, oh, ow, device=device))
        except (ValueError, AssertionError) as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(
                f"{name} takes {h}x{w} px images but not {oh}x{ow} ({reason}), so its export cannot have a "
                f"dynamic height and width; build it to take any size (a timm ViT: --model-kwargs "
                f"dynamic_img_size=true dynamic_img_pad=true)") from exc
