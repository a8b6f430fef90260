"""FLOP counting: torch's FlopCounterMode, plus attention counted analytically where the counter misses it.

Conventions: one multiply-add is 2 FLOPs (torch's counter), and MACs = FLOPs / 2. On CPU, fused
attention runs as ``aten._scaled_dot_product_flash_attention_for_cpu``, which the counter does not
know, so the two attention matmuls (QKᵀ and AV) of each fused attention module are added from
``attention_flops``. Softmax, norms and activations are not counted, as in torch's counter.
"""

from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Tuple

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

# The counter attributes a Linear's FLOPs to these ops; anything else inside an attention module is attention.
_LINEAR_OPS = {"addmm", "mm", "linear"}


def attention_flops(batch: int, tokens: int, dim: int) -> int:
    """FLOPs of the two attention matmuls, QKᵀ and AV: 2 · (2·B·N²·D) = 4·B·N²·D.

    ``dim`` is the total width, heads × head_dim; the count does not depend on the number of heads.
    """
    return 4 * batch * tokens * tokens * dim


@dataclass
class FlopReport:
    """FLOPs of one forward pass, per image, and how they were obtained."""

    flops_counted: int  # what FlopCounterMode reported
    flops_attention_added: int  # attention matmuls the counter missed, added analytically
    attention_modules_missed: int
    ops: Dict[str, int]  # counter's FLOPs by aten op

    @property
    def flops(self) -> int:
        return self.flops_counted + self.flops_attention_added

    @property
    def macs(self) -> int:
        return self.flops // 2

    def as_dict(self) -> Dict[str, Any]:
        return {**asdict(self), "flops": self.flops, "macs": self.macs}


def _op_name(op: Any) -> str:
    return str(op).split(".")[-1] if "." in str(op) else str(op)


def count_flops(model: nn.Module, images: torch.Tensor) -> FlopReport:
    """Count the FLOPs of ``model(images)`` per image (inference mode), adding missed attention analytically.

    An attention module (one with a ``fused_attn`` attribute, as timm's) whose subtree shows no op
    other than its Linear layers' has had its attention matmuls missed by the counter.
    """
    shapes: Dict[str, List[Tuple[int, int, int]]] = {}
    root = type(model).__name__
    hooks = []
    for name, module in model.named_modules():
        if hasattr(module, "fused_attn"):
            fqn = f"{root}.{name}"
            shapes[fqn] = []
            hooks.append(
                module.register_forward_pre_hook(lambda m, args, fqn=fqn: shapes[fqn].append(tuple(args[0].shape)))
            )
    counter = FlopCounterMode(display=False)
    try:
        with torch.inference_mode(), counter:
            model(images)
    finally:
        for hook in hooks:
            hook.remove()
    counts = counter.get_flop_counts()
    added, missed = 0, 0
    for fqn, calls in shapes.items():
        ops = counts.get(fqn, {})
        if not any(_op_name(op) not in _LINEAR_OPS for op in ops):
            missed += 1
            added += sum(attention_flops(b, n, d) for b, n, d in calls)
    batch = images.shape[0]
    ops_total = {_op_name(op): int(v) // batch for op, v in counts.get("Global", {}).items()}
    return FlopReport(
        flops_counted=int(counter.get_total_flops()) // batch,
        flops_attention_added=added // batch,
        attention_modules_missed=missed,
        ops=ops_total,
    )
