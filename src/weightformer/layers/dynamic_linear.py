"""Dynamic linear layer: a linear map whose weight is predicted from the tokens it is applied to.

X ∈ R^{N×C} a sample's tokens on an H×W grid, X̄ ∈ R^{N'×C} after 2×2 average pooling (:func:`pool_2x2`),
r the reduction (4), s = C^-1/2 / N with N = H·W (not N'), as in the release. P = X̄·W_p + b_p splits into
P_in ∈ R^{N'×C/r} and P_out ∈ R^{N'×O/r}; bases U_in ∈ R^{C/r×C}, U_out ∈ R^{O/r×O}. Each predictor returns
ΔW ∈ R^{C×O} stored as ΔWᵀ (O, C), like ``nn.Linear.weight``; :class:`DynamicLinear` normalises it and adds
the static weight. σ = SiLU.

- ``bilateral`` (the paper's default): ΔW = (σ(P_in)·U_in)ᵀ · (σ(P_out)·U_out) · s.
- ``linear``: ΔW = (P_in·U_in)ᵀ · (P_out·U_out) · s.
- ``nonlinear``: ΔW = U_inᵀ · σ(P_inᵀ·P_out · s) · U_out.
- ``deep``: bilateral with P = GELU(X̄·W_h + b_h)·W_p + b_p (hidden width C).
- ``gap``: bilateral on the single token ḡ = mean(X) (N' = 1, s = C^-1/2), a rank-one ΔW.
"""


import torch
import torch.nn.functional as F
from torch import Tensor, nn
from timm.layers import trunc_normal_

from .dynamic_layer import LINEAR_PREDICTORS, DynamicWeightLayer, register_predictor
from .inference import hookless

__all__ = ["LINEAR_PREDICTORS", "DynamicLinear", "BilateralPredictor", "LinearPredictor", "NonlinearPredictor",
           "DeepPredictor", "GapPredictor", "pool_2x2", "pool_2x2_window"]


class _AddNormalisedRows(torch.autograd.Function):
    """W + Δ/(‖Δ‖+1), row-wise, with a hand-written backward: six passes over the per-sample weights
    (B, O, C), one of them a copy of the gradient into Δ's layout, where autograd makes about a dozen.
    With s = 1/(‖Δ‖+1) and g the output gradient:
    ∂/∂Δ = g·s − Δ·s²·⟨g, Δ⟩/‖Δ‖ and ∂/∂W = Σ_batch g."""

    @staticmethod
    def forward(ctx, weight: Tensor, delta: Tensor) -> Tensor:
        norm = torch.linalg.vector_norm(delta, dim=-1, keepdim=True)  # (B, O, 1)
        scale = 1.0 / (norm + 1.0)
        ctx.save_for_backward(delta, norm, scale)
        return torch.addcmul(weight, delta, scale)  # (B, O, C)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        delta, norm, scale = ctx.saved_tensors
        # baddbmm's backward hands g over as a transposed view of a (B, C, O) tensor. One copy into Δ's (B, O, C)
        # layout first: the products with Δ and the batch sum then read memory in order, 3.5 against 15.9 ms
        # for T's (16, 768, 192) on a 2-core Xeon (2026-12-04); the batch sum alone of the view took 6.5 ms.
        grad = grad.contiguous()
        dot = (grad * delta).sum(-1, keepdim=True)  # ⟨g, Δ⟩ per row
        coef = dot * scale * scale / norm.clamp_min(torch.finfo(norm.dtype).tiny)
        grad_delta = (grad * scale).addcmul_(delta, coef, value=-1.0)
        grad_weight = grad.sum(0) if ctx.needs_input_grad[0] else None
        return grad_weight, grad_delta.to(delta.dtype)


def add_normalised_rows(weight: Tensor, delta: Tensor) -> Tensor:
    """W + Δ/(‖Δ‖₂+1) with the norm over the last dim. Shapes: weight (O, C), delta (B, O, C) -> (B, O, C)."""
    return _AddNormalisedRows.apply(weight, delta)


def pool_2x2(x: Tensor) -> Tensor:
    """Average-pool a token grid 2×2 as the release's ``AvgPool2d(2)``: (B, H, W, C) -> (B, N', C), N' = ⌊H/2⌋·⌊W/2⌋
    (an odd side's last row is left out); a side of 1 is kept (window 1 along it)."""
    B, H, W, C = x.shape
    pooled = F.avg_pool2d(x.permute(0, 3, 1, 2), pool_2x2_window(H, W))  # (B, C, H', W')
    return pooled.flatten(2).transpose(1, 2)  # (B, N', C)


def pool_2x2_window(H: int, W: int) -> tuple[int, int]:
    """The window :func:`pool_2x2` pools an H×W grid with: 2×2, or 1 along a side of 1."""
    return min(H, 2), min(W, 2)


def reset_linear(linear: nn.Linear) -> None:
    """A predictor's linear layer as the release sets it: truncated normal weight (std 0.02), zero bias."""
    trunc_normal_(linear.weight, std=0.02)
    nn.init.zeros_(linear.bias)


class _LowRankPredictor(nn.Module):
    """Shared parameters of the ΔW predictors: the projection W_p and the bases U_in, U_out."""

    def __init__(self, in_features: int, out_features: int, reduction: int = 4, device=None, dtype=None):
        super().__init__()
        dd = dict(device=device, dtype=dtype)
        if in_features % reduction or out_features % reduction:
            raise ValueError(f"in_features ({in_features}) and out_features ({out_features}) must be divisible by "
                             f"the predictor reduction ({reduction}); pick widths that are multiples of {reduction}")
        self.in_features, self.out_features = in_features, out_features
        self.in_rank, self.out_rank = in_features // reduction, out_features // reduction
        self.scale = in_features**-0.5
        self.proj = nn.Linear(in_features, self.in_rank + self.out_rank, **dd)
        self.in_basis = nn.Parameter(torch.empty(self.in_rank, in_features, **dd))
        self.out_basis = nn.Parameter(torch.empty(self.out_rank, out_features, **dd))
        # This class's own values only: a subclass's override may reset modules that it has not built yet.
        _LowRankPredictor.reset_parameters(self)

    def reset_parameters(self) -> None:
        """W_p, U_in and U_out as in the release: truncated normal (std 0.02), zero bias."""
        reset_linear(self.proj)
        trunc_normal_(self.in_basis, std=0.02)
        trunc_normal_(self.out_basis, std=0.02)

    def expand(self, core: Tensor) -> Tensor:
        """Lift a low-rank core (B, C/r, O/r) to ΔWᵀ = (U_inᵀ·core·U_out)ᵀ (B, O, C), the O side first (cheaper)."""
        lifted_out = torch.matmul(core, self.out_basis)  # (B, C/r, O)
        return torch.matmul(lifted_out.transpose(1, 2), self.in_basis)  # (B, O, C)

    def bilateral_core(self, p: Tensor, scale: float) -> Tensor:
        """The core σ(P_in)ᵀσ(P_out)·scale (B, C/r, O/r) of P (B, N', C/r + O/r); ``torch.bmm``, as a traced
        ``matmul`` records a batch-size condition that makes an exported program refuse batch 1."""
        return self.plain_core(F.silu(p), scale)

    def plain_core(self, p: Tensor, scale: float) -> Tensor:
        """P_inᵀ·P_out·scale (B, C/r, O/r) of P (B, N', C/r + O/r)."""
        if torch.compiler.is_compiling():
            # One zero token more (it adds 0 to every entry): Inductor (torch 2.14, CPU) rewrites a bmm whose inner
            # size is statically 1 (a 2x2-pooled grid of one token: 2-3 tokens a side) as a broadcast product, and
            # its vectorised code for that product reads past the pooled token (NaN or wrong logits). With N'+1
            # the inner size is never statically 1 and the bmm stays a GEMM.
            p = F.pad(p, (0, 0, 0, 1))  # (B, N' + 1, C/r + O/r)
        p_in, p_out = torch.split(p, [self.in_rank, self.out_rank], dim=-1)
        return torch.bmm(p_in.transpose(1, 2), p_out) * scale

    def core(self, x: Tensor) -> Tensor:  # (B, H, W, C) -> (B, C/r, O/r)
        """The low-rank core of ΔW = U_inᵀ·core·U_out; each predictor defines it."""
        raise NotImplementedError(f"{type(self).__name__} defines forward, not a core")

    def forward(self, x: Tensor) -> Tensor:  # (B, H, W, C) -> ΔWᵀ (B, O, C)
        return self.expand(self.core(x))


@register_predictor("linear", "bilateral")
class BilateralPredictor(_LowRankPredictor):
    """Bilateral activation: ΔW = (σ(P_in)·U_in)ᵀ(σ(P_out)·U_out)·C^-1/2/N, P from 2×2-pooled tokens."""

    def core(self, x: Tensor) -> Tensor:  # (B, H, W, C) -> (B, C/r, O/r)
        return self.bilateral_core(self.proj(pool_2x2(x)), self.scale / (x.shape[1] * x.shape[2]))


@register_predictor("linear", "linear")
class LinearPredictor(_LowRankPredictor):
    """Linear prediction: ΔW = (P_in·U_in)ᵀ(P_out·U_out)·C^-1/2/N, no activation."""

    def core(self, x: Tensor) -> Tensor:  # (B, H, W, C) -> (B, C/r, O/r)
        return self.plain_core(self.proj(pool_2x2(x)), self.scale / (x.shape[1] * x.shape[2]))


@register_predictor("linear", "nonlinear")
class NonlinearPredictor(_LowRankPredictor):
    """Non-linear prediction: ΔW = U_inᵀ·σ(P_inᵀP_out·C^-1/2/N)·U_out, one activation on the core."""

    def core(self, x: Tensor) -> Tensor:  # (B, H, W, C) -> (B, C/r, O/r)
        return F.silu(self.plain_core(self.proj(pool_2x2(x)), self.scale / (x.shape[1] * x.shape[2])))


@register_predictor("linear", "deep")
class DeepPredictor(_LowRankPredictor):
    """Deep prediction: bilateral ΔW with a two-layer token projection P = GELU(X̄·W_h + b_h)·W_p + b_p."""

    def __init__(self, in_features: int, out_features: int, reduction: int = 4, device=None, dtype=None):
        super().__init__(in_features, out_features, reduction, device=device, dtype=dtype)
        self.hidden = nn.Linear(in_features, in_features, device=device, dtype=dtype)
        reset_linear(self.hidden)

    def reset_parameters(self) -> None:
        """W_p, U_in, U_out as the release, then the hidden layer W_h."""
        super().reset_parameters()
        reset_linear(self.hidden)

    def core(self, x: Tensor) -> Tensor:  # (B, H, W, C) -> (B, C/r, O/r)
        return self.bilateral_core(self.proj(F.gelu(self.hidden(pool_2x2(x)))), self.scale / (x.shape[1] * x.shape[2]))


@register_predictor("linear", "gap")
class GapPredictor(_LowRankPredictor):
    """Global-average prediction: bilateral ΔW from the single token ḡ = mean(X), a rank-one update."""

    def core(self, x: Tensor) -> Tensor:  # (B, H, W, C) -> (B, C/r, O/r)
        g = x.mean(dim=(1, 2)).unsqueeze(1)  # (B, 1, C)
        return self.bilateral_core(self.proj(g), self.scale)


class DynamicLinear(DynamicWeightLayer):
    """Linear layer with an input-dependent weight, y = X·(W + ΔŴ(X)) + b, ΔŴ = ΔW / (‖ΔW‖₂ + 1) (norm over the
    input dim of each output column); ΔW is C×O for any N, so the layer costs O(N). (B, H, W, C) -> (B, H, W, O)."""

    def __init__(self, in_features: int, out_features: int | None = None, predictor: str = "bilateral",
                 reduction: int = 4, device=None, dtype=None):
        out_features = out_features or in_features
        super().__init__("dynamic linear", LINEAR_PREDICTORS, predictor, (in_features, out_features, reduction),
                         weight_shape=(out_features, in_features), bias_size=out_features, device=device, dtype=dtype)
        self.in_features, self.out_features = in_features, out_features

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, predictor={self.predictor_name}"

    def dynamic_weight(self, x: Tensor) -> Tensor:  # (B, H, W, C) -> (B, O, C)
        """The per-sample weight W + ΔŴ(x), stored as ``nn.Linear.weight`` is: (B, O, C)."""
        C = x.shape[-1]
        if C != self.in_features:
            raise ValueError(f"DynamicLinear expected {self.in_features} input features, got {C}")
        delta_t = self.predictor(x)  # (B, O, C)
        if torch.jit.is_scripting():  # TorchScript cannot call autograd Functions
            return self.weight + delta_t / (torch.linalg.vector_norm(delta_t, dim=-1, keepdim=True) + 1.0)
        return add_normalised_rows(self.weight, delta_t)  # (B, O, C)

    def applies_low_rank(self, num_tokens: int) -> bool:
        """Whether ``forward_fast`` takes :meth:`forward_low_rank`: eager, ΔW = U_inᵀ·core·U_out, no hook on the
        predictor, and fewer multiply-adds than forming the C×O weight: N < C·O/(C + O)."""
        if torch.jit.is_scripting() or torch.compiler.is_compiling():  # traced graphs keep one form for every size
            return False
        predictor_forward = type(self.predictor).forward
        return predictor_forward is _LowRankPredictor.forward and hookless(self.predictor) and num_tokens * (
            self.in_features + self.out_features) < self.in_features * self.out_features

    def forward_low_rank(self, x: Tensor) -> Tensor:  # (B, H, W, C) -> (B, H, W, O)
        """y = X·Wᵀ + b + ((X·U_inᵀ)·L)·diag(1/(‖ΔWᵀ_o‖+1)), L = core·U_out (B, C/r, O), ΔWᵀ = Lᵀ·U_in never
        formed: ‖ΔWᵀ_o‖² = L_oᵀ·G·L_o with G = U_in·U_inᵀ."""
        B, H, W, C = x.shape
        predictor = self.predictor
        lifted = torch.matmul(predictor.core(x), predictor.out_basis)  # (B, C/r, O)
        gram = predictor.in_basis @ predictor.in_basis.t()  # (C/r, C/r)
        squared_norms = (lifted * torch.matmul(gram, lifted)).sum(dim=1, keepdim=True)  # (B, 1, O)
        # clamp: an all-zero ΔW (a zero input) keeps a finite gradient through the square root
        scaled = lifted / (squared_norms.clamp_min(torch.finfo(x.dtype).tiny).sqrt() + 1.0)  # (B, C/r, O)
        rows = x.reshape(B, H * W, C)
        static = F.linear(rows, self.weight, self.bias)  # (B, N, O)
        # in place: baddbmm would first copy `static` into a new tensor (4% of WeightFormer-S's 224² forward)
        out = static.baddbmm_(torch.matmul(rows, predictor.in_basis.t()), scaled)  # (B, N, O)
        return out.reshape(B, H, W, self.out_features)

    def forward_fast(self, x: Tensor) -> Tensor:  # (B, H, W, C) -> (B, H, W, O)
        B, H, W, C = x.shape
        if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript skips only a bare is_scripting() test)
            if C == self.in_features and self.applies_low_rank(H * W):
                return self.forward_low_rank(x)
        weight_t = self.dynamic_weight(x)  # (B, O, C)
        # One batched GEMM with the static weight folded in: y = b + X·(W + ΔŴ)ᵀ.
        out = torch.baddbmm(self.bias, x.reshape(B, H * W, C), weight_t.transpose(1, 2))  # (B, N, O)
        return out.reshape(B, H, W, self.out_features)

    def forward_reference(self, x: Tensor) -> Tensor:
        return dynamic_linear_reference(self, x)


def dynamic_linear_reference(layer: DynamicLinear, x: Tensor) -> Tensor:
    """The paper's pseudocode, step by step and without re-association: the equivalence reference.
    Only the bilateral predictor has one; the others reuse their (already plain) predictor."""
    B, H, W, C = x.shape
    N = H * W
    if isinstance(layer.predictor, BilateralPredictor):
        p = layer.predictor
        pooled = pool_2x2(x)  # (B, N', C)
        p_in, p_out = torch.split(p.proj(pooled), [p.in_rank, p.out_rank], dim=-1)
        a = F.silu(p_in) @ p.in_basis  # (B, N', C)
        b = F.silu(p_out) @ p.out_basis  # (B, N', O)
        delta = a.transpose(-2, -1) @ b * p.scale / N  # (B, C, O)
    else:
        delta = layer.predictor(x).transpose(1, 2)
    delta = delta / (delta.norm(dim=-2, keepdim=True) + 1.0)
    weight = delta + layer.weight.t()
    return (x.reshape(B, N, C) @ weight + layer.bias).reshape(B, H, W, -1)

