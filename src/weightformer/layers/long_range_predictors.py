"""Predictors that carry relations between distant tokens into ΔW / ΔK, at O(N) cost.

Two things keep the released ``bilateral`` predictor from carrying a few distant tokens into ΔW:

1. Scale. ΔW = U_inᵀ·core·U_out with every factor initialised at std 0.02 and the core averaged
   over tokens: at init its columns are about 1e-5 long against the static weight's 0.16 (after
   training on the probes too: docs/analysis.md). The layer behaves as a static one, and the gradient
   that would grow ΔW is as small as ΔW's factors (a saddle at zero).
2. Dilution. core = Σ_t σ(p_in,t)ᵀσ(p_out,t) / N: a few informative tokens (two glyphs in 144) must
   beat the background's constant outer product N to a few.

The linear predictors below share a fix for (1): the core is divided by its root mean square and
multiplied by a learned gain g, initialised so that ΔW's columns start about 0.3 long
(g₀ = 0.3 / (0.02²·√(C/r·O/r·C)), for the bases' init std 0.02). They differ in the aggregation.
Notation as in :mod:`.dynamic_linear`: X̄ the 2×2-pooled tokens (N' of them), P = X̄·W_p + b_p
split into P_in (N'×C/r) and P_out (N'×O/r), σ = SiLU, unit(M) = M / (rms(M) + 1e-6).

Linear predictors (``linear_predictor=``):

- ``bilateral_unit``: the released mean over tokens with the scale fix only,
  ΔW = g·U_inᵀ·unit(Σ_t σ(P_in,t)ᵀσ(P_out,t))·U_out.
- ``score_pool`` (score-weighted pooling, several heads): h = 4 heads each score every token,
  α_h = softmax_t(X̄·w_h + c_h), and own a quarter of the C/r input-rank rows:
  core[h-th rows] = Σ_t α_{t,h} σ(P_in,t)[h-th rows]ᵀ σ(P_out,t); ΔW = g·U_inᵀ·unit(core)·U_out.
  The weights sum to one over the tokens, so a few salient tokens can set ΔW whatever N is.
  Cost N'·(C·h + C/r·O/r), as ``bilateral`` plus the scores.
- ``centered`` (second-order statistics): the covariance of the activated projections,
  core = Σ_t (σ(P_in,t) − mean)ᵀ(σ(P_out,t) − mean), which removes the background's constant
  outer product and keeps only how tokens vary; ΔW = g·U_inᵀ·unit(core)·U_out.
- ``double_centered`` (second-order statistics of the grid's residuals): as ``centered`` with each
  side's projections double-centred on the H'×W' grid of pooled tokens, D = σ(P) − row mean − column
  mean + grid mean, core = Σ_t D_in,tᵀ D_out,t. Any pattern that is a sum of a function of the row and
  one of the column drops out: so do the borders of zero-padded convolutions over a uniform background
  (but for the four corners), whose count grows with the canvas' side and which under ``centered``
  make unit(core), and ΔW with it, change with the canvas size (docs/analysis.md, "Resolution
  transfer"). Cost as ``centered`` plus the row and column means, N'·(C/r + O/r).

Depthwise-conv predictor (``dwc_predictor=``):

- ``score_gap``: ``gap`` with the global average replaced by a per-channel softmax-weighted
  pool, z_c = Σ_t softmax_t(X·W_s + b_s)_{t,c} · X_{t,c}; ΔK_c = GELU(W₁z + b₁)_c · U_c.

Each registers itself under its name (:func:`~weightformer.layers.dynamic_layer.register_predictor`).
"""

import torch
import torch.nn.functional as F
from timm.layers import trunc_normal_
from torch import Tensor, nn

from .dynamic_layer import register_predictor
from .dynamic_linear import _LowRankPredictor, pool_2x2, pool_2x2_window, reset_linear

__all__ = ["BilateralUnitPredictor", "CenteredPredictor", "DoubleCenteredPredictor", "ScorePoolKernelPredictor",
           "ScorePoolPredictor", "double_center"]

_INIT_STD = 0.02  # of the bases U_in, U_out (as the released predictors)
_INIT_COLUMN_NORM = 0.3  # ΔW's column length at init


@register_predictor("linear", "bilateral_unit")
class BilateralUnitPredictor(_LowRankPredictor):
    """The released mean over tokens, with the core set to unit RMS and scaled by a learned gain."""

    def __init__(self, in_features: int, out_features: int, reduction: int = 4, device=None, dtype=None):
        super().__init__(in_features, out_features, reduction, device=device, dtype=dtype)
        self.gain = nn.Parameter(torch.empty((), device=device, dtype=dtype))
        self._reset_gain()

    def _reset_gain(self) -> None:
        # ΔW's entries are sums of C/r·O/r products of a unit core entry and two std-0.02 basis entries;
        # a column has C of them.
        start = _INIT_COLUMN_NORM / (_INIT_STD**2 * (self.in_rank * self.out_rank * self.in_features) ** 0.5)
        with torch.no_grad():
            self.gain.fill_(start)

    def reset_parameters(self) -> None:
        """W_p, U_in, U_out as the release, then the gain g₀ (see the module docstring)."""
        super().reset_parameters()
        self._reset_gain()

    def unit_expand(self, core: Tensor) -> Tensor:
        """g·U_inᵀ·unit(core)·U_out as ΔWᵀ (B, O, C), core (B, C/r, O/r)."""
        # The 1e-24 only keeps sqrt's gradient finite at an all-zero core (one pooled token under ``centered``).
        rms = torch.sqrt(core.pow(2).mean(dim=(1, 2), keepdim=True) + 1e-24)
        return self.expand(core * (self.gain / (rms + 1e-6)))

    def activated(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The pooled tokens X̄ (B, N', C) and σ(P_in) (B, N', C/r), σ(P_out) (B, N', O/r)."""
        pooled = pool_2x2(x)
        p_in, p_out = torch.split(F.silu(self.proj(pooled)), [self.in_rank, self.out_rank], dim=-1)
        return pooled, p_in, p_out

    def forward(self, x: Tensor) -> Tensor:  # (B, H, W, C) -> ΔWᵀ (B, O, C)
        _, p_in, p_out = self.activated(x)
        return self.unit_expand(torch.matmul(p_in.transpose(1, 2), p_out))


@register_predictor("linear", "score_pool")
class ScorePoolPredictor(BilateralUnitPredictor):
    """Several softmax-score-weighted heads in place of the mean over tokens (see module docstring)."""

    heads = 4

    def __init__(self, in_features: int, out_features: int, reduction: int = 4, device=None, dtype=None):
        super().__init__(in_features, out_features, reduction, device=device, dtype=dtype)
        if self.in_rank % self.heads:
            raise ValueError(f"score_pool needs in_features / reduction ({self.in_rank}) divisible by {self.heads} heads")
        self.score = nn.Linear(in_features, self.heads, device=device, dtype=dtype)
        reset_linear(self.score)

    def reset_parameters(self) -> None:
        """The unit-scaled predictor's parameters, then the scores (truncated normal 0.02, zero bias)."""
        super().reset_parameters()
        reset_linear(self.score)

    def forward(self, x: Tensor) -> Tensor:  # (B, H, W, C) -> ΔWᵀ (B, O, C)
        pooled, p_in, p_out = self.activated(x)
        weights = torch.softmax(self.score(pooled), dim=1)  # (B, N', h), each head sums to 1 over tokens
        B, N, _ = p_in.shape
        # Each head weights the tokens for its own group of input-rank rows.
        p_in = p_in.view(B, N, self.heads, self.in_rank // self.heads) * weights.unsqueeze(-1)  # (B, N', h, C/rh)
        core = torch.matmul(p_in.reshape(B, N, self.in_rank).transpose(1, 2), p_out)  # (B, C/r, O/r)
        return self.unit_expand(core)


@register_predictor("linear", "centered")
class CenteredPredictor(BilateralUnitPredictor):
    """Covariance of the activated projections: the core with each side's token mean removed."""

    def forward(self, x: Tensor) -> Tensor:  # (B, H, W, C) -> ΔWᵀ (B, O, C)
        _, p_in, p_out = self.activated(x)
        p_in, p_out = p_in - p_in.mean(dim=1, keepdim=True), p_out - p_out.mean(dim=1, keepdim=True)
        return self.unit_expand(torch.matmul(p_in.transpose(1, 2), p_out))


def double_center(p: Tensor, rows: int, cols: int) -> Tensor:
    """Tokens (B, N', D) of a rows×cols grid (row-major) minus their row mean and column mean, plus the grid
    mean: what is left of each token once every sum of a row effect and a column effect is removed."""
    B, _, D = p.shape
    grid = p.view(B, rows, cols, D)
    grid = grid - grid.mean(dim=2, keepdim=True) - grid.mean(dim=1, keepdim=True) + grid.mean(dim=(1, 2), keepdim=True)
    return grid.reshape(B, rows * cols, D)


@register_predictor("linear", "double_centered")
class DoubleCenteredPredictor(BilateralUnitPredictor):
    """Covariance of the activated projections after double centring on the pooled grid (see module docstring)."""

    def forward(self, x: Tensor) -> Tensor:  # (B, H, W, C) -> ΔWᵀ (B, O, C)
        _, p_in, p_out = self.activated(x)
        H, W = x.shape[1], x.shape[2]
        window_h, window_w = pool_2x2_window(H, W)
        rows, cols = H // window_h, W // window_w  # the grid pool_2x2 leaves
        p_in, p_out = double_center(p_in, rows, cols), double_center(p_out, rows, cols)
        return self.unit_expand(torch.matmul(p_in.transpose(1, 2), p_out))


@register_predictor("dwconv", "score_gap")
class ScorePoolKernelPredictor(nn.Module):
    """ΔK_c = GELU(W₁z + b₁)_c · U_c with z a per-channel softmax-score-weighted pool of the tokens."""

    def __init__(self, dim: int, kernel_size: int, device=None, dtype=None):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.score = nn.Conv2d(dim, dim, 1, **dd)
        self.fc1 = nn.Linear(dim, dim, **dd)
        self.act = nn.GELU()
        self.bank = nn.Parameter(torch.empty(dim, kernel_size, kernel_size, **dd))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The kernel bank U: truncated normal, std 0.02 (the score conv and fc1 are plain modules with their own)."""
        trunc_normal_(self.bank, std=0.02)

    def forward(self, x: Tensor) -> Tensor:  # (B, C, H, W) -> (B, C, K, K)
        weights = torch.softmax(self.score(x).flatten(2), dim=-1)  # (B, C, N), per channel over tokens
        pooled = (weights * x.flatten(2)).sum(-1)  # (B, C)
        return self.act(self.fc1(pooled))[:, :, None, None] * self.bank
