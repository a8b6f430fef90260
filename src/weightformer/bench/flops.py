"""FLOP counting: torch's FlopCounterMode, with attention counted."""

from __future__ import annotations

from typing import Any, Dict


def count_flops(model: Any, *args: Any, modules: Any = None) -> "FlopCount":
    """FLOPs of one call ``model(*args)`` in inference mode, per batch (FlopCounterMode: a multiply-add is 2), timm
    attention switched to explicit matmuls meanwhile so QKᵀ and AV count; norms, activations and softmax do not.
    Works on the meta device. ``modules``: whose attention is switched where ``model`` is a function."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    fused = {m: m.fused_attn for m in (model if modules is None else modules).modules() if hasattr(m, "fused_attn")}
    counter = FlopCounterMode(display=False)
    try:
        for module in fused:
            module.fused_attn = False
        with torch.inference_mode(), counter:
            model(*args)
    finally:
        for module, value in fused.items():
            module.fused_attn = value
    ops = {str(op).split(".")[-1]: int(v) for op, v in counter.get_flop_counts().get("Global", {}).items()}
    return FlopCount(int(counter.get_total_flops()), ops)


class FlopCount:
    """What :func:`count_flops` counted: ``flops``, ``macs`` (= flops / 2) and FLOPs by aten op."""

    def __init__(self, flops: int, ops: Dict[str, int]):
        self.flops, self.macs, self.ops = flops, flops // 2, ops
