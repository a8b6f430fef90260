"""GELU (exact or tanh-approximated) followed by a linear layer, keeping only the GELU's input for the backward pass.

Autograd would keep both the GELU's input (for its own backward) and its output (for the linear
layer's weight gradient): two tensors of the MLP's 4× width per block, the largest activations of
the network. Recomputing GELU(h) in the backward pass costs one element-wise pass and halves that
memory; the gradients are bit-for-bit those of ``F.linear(F.gelu(h), W, b)``.
"""

import torch
import torch.nn.functional as F
from torch import Tensor
from timm.layers import register_notrace_function

__all__ = ["gelu_linear"]


class _GeluLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor, approximate: str) -> Tensor:
        ctx.save_for_backward(hidden, weight)
        ctx.bias_dtype = bias.dtype
        ctx.approximate = approximate
        return F.linear(F.gelu(hidden, approximate=approximate), weight, bias)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        hidden, weight = ctx.saved_tensors
        dtype = grad_out.dtype  # under autocast the forward ran in a lower precision
        act = F.gelu(hidden, approximate=ctx.approximate).to(dtype)
        grad_rows = grad_out.reshape(-1, grad_out.shape[-1])  # (tokens, out)
        grad_weight = grad_rows.t() @ act.reshape(-1, act.shape[-1])  # (out, in)
        grad_bias = grad_rows.sum(0)
        grad_act = grad_out @ weight.to(dtype)  # (..., in)
        grad_hidden = torch.ops.aten.gelu_backward(grad_act, hidden.to(dtype), approximate=ctx.approximate)
        return grad_hidden.to(hidden.dtype), grad_weight.to(weight.dtype), grad_bias.to(ctx.bias_dtype), None


@register_notrace_function
def gelu_linear(hidden: Tensor, weight: Tensor, bias: Tensor, consume: bool = False, approximate: str = "none") -> Tensor:
    """``F.linear(F.gelu(hidden, approximate=approximate), weight, bias)`` that saves ``hidden`` only.
    Shapes (..., in) -> (..., out). ``approximate`` is ``nn.GELU``'s: "none" (exact) or "tanh".

    With ``consume=True`` and no gradient needed, the activation is computed in place in ``hidden``
    (which the caller must not read afterwards), sparing a tensor of the MLP's full width.
    """
    if torch.jit.is_scripting():
        return F.linear(F.gelu(hidden, approximate=approximate), weight, bias)  # TorchScript cannot call autograd Functions
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad or bias.requires_grad):
        return _GeluLinear.apply(hidden, weight, bias, approximate)
    act = torch.ops.aten.gelu_(hidden, approximate=approximate) if consume else F.gelu(hidden, approximate=approximate)
    return F.linear(act, weight, bias)
