"""How large the predicted weight updates of a model's dynamic layers are, and how much they depend on the image.

Per layer, over a batch: ``delta_norm``, the mean norm of the raw ΔW columns (ΔK kernels, times a static-led
conv's scale s: what the layer normalises); ``capped_norm``, of
ΔŴ = Δ/(‖Δ‖+1), near 1 only where the cap binds; ``static_norm``, of the static weight's columns; ``spread``, the
mean of ‖ΔŴ(x) − mean_x ΔŴ(x)‖ per column, the part that can carry an image's content.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..layers import DynamicDWConv, DynamicLinear

__all__ = ["dynamic_update_stats"]


def _column_norms(delta: Tensor) -> Tensor:
    """Norms of the update's columns: ΔWᵀ (B, O, C) over C, ΔK (B, C, K, K) over K×K -> (B, O or C)."""
    return torch.linalg.vector_norm(delta.flatten(2), dim=-1)


@torch.no_grad()
def dynamic_update_stats(model: nn.Module, images: Tensor) -> list[dict[str, Any]]:
    """One row per dynamic layer (name, kind and the numbers of the module docstring) for ``images``."""
    captured: dict[str, Tensor] = {}
    layers = {name: m for name, m in model.named_modules() if isinstance(m, (DynamicLinear, DynamicDWConv))}
    hooks = [m.predictor.register_forward_hook(lambda mod, args, out, name=name: captured.__setitem__(name, out))
             for name, m in layers.items()]
    was_training = model.training
    model.eval()
    try:
        model(images)
    finally:
        model.train(was_training)
        for hook in hooks:
            hook.remove()
    rows = []
    for name, layer in layers.items():
        delta = captured[name].float()  # (B, O, C) or (B, C, K, K)
        if isinstance(layer, DynamicDWConv):
            delta = delta * layer.delta_scale  # what the layer normalises (DynamicDWConv.predicted_delta)
        norms = _column_norms(delta)
        capped = delta / (norms.view(*norms.shape, *([1] * (delta.dim() - 2))) + 1.0)
        spread = _column_norms(capped - capped.mean(0, keepdim=True))
        static = torch.linalg.vector_norm(layer.weight.flatten(1), dim=-1)
        rows.append({"layer": name, "kind": "linear" if isinstance(layer, DynamicLinear) else "dwc",
                     "delta_norm": norms.mean().item(), "capped_norm": (norms / (norms + 1)).mean().item(),
                     "static_norm": static.mean().item(), "spread": spread.mean().item()})
    return rows
