"""FLOP counting: torch's FlopCounterMode, with attention counted."""

from __future__ import annotations

from typing import Any, Dict


def count_flops(model: Any, *args: Any, modules: Any = None) -> "FlopCount":
    """FLOPs of one call ``model(*args)`` in inference mode, per batch, as torch's FlopCounterMode counts
    them (one multiply-add is 2 FLOPs), with every timm attention module switched to explicit matmuls while
    counting so that its QKᵀ and AV are counted too (the counter misses fused CPU attention). Norms,
    activations and softmax are not counted. Works on the ``meta`` device (no memory, no arithmetic).
    ``modules``: the module whose attention is switched, where ``model`` is a function (default: ``model``)."""
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
