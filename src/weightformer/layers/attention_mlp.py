"""Softmax attention read as a two-layer MLP whose weights are predicted from the input:

    Attention(Q, K, V) = softmax(Q·Kᵀ·s)·V = MLP(Q; W₁ = s·Kᵀ, W₂ = V, act = softmax)

The hidden width is N: that is where attention's O(N²) cost lives. WeightFormer's predicted weights do not grow with N.
"""


import torch
from torch import Tensor

__all__ = ["attention_as_mlp"]


def attention_as_mlp(q: Tensor, k: Tensor, v: Tensor, scale: float | None = None) -> Tensor:
    """Softmax attention as an MLP on q with dynamic weights Kᵀ and V: q (..., Nq, d), k (..., N, d),
    v (..., N, dv) -> (..., Nq, dv); ``scale`` defaults to d^-1/2."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    first_weight = k.transpose(-2, -1) * scale  # (..., d, N): layer 1, predicted from the input
    second_weight = v  # (..., N, dv): layer 2, predicted from the input
    hidden = torch.softmax(q @ first_weight, dim=-1)  # (..., Nq, N): hidden width N, softmax activation
    return hidden @ second_weight
