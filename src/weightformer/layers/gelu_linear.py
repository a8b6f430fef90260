"""GELU (exact or tanh) followed by a linear layer, saving only the GELU's input for backward: autograd would
keep its input and output, two tensors of the MLP's 4× width per block. Recomputing GELU(h) in backward costs
one element-wise pass; the gradients are bit-for-bit those of ``F.linear(F.gelu(h), W, b)``.
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
    """``F.linear(F.gelu(hidden, approximate=approximate), weight, bias)`` saving ``hidden`` only, (..., in) ->
    (..., out). ``consume=True`` without gradients computes the activation in place in ``hidden``."""
    if torch.jit.is_scripting():
        return F.linear(F.gelu(hidden, approximate=approximate), weight, bias)  # TorchScript cannot call autograd Functions
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad or bias.requires_grad):
        return _GeluLinear.apply(hidden, weight, bias, approximate)
    act = torch.ops.aten.gelu_(hidden, approximate=approximate) if consume else F.gelu(hidden, approximate=approximate)
    return F.linear(act, weight, bias)
