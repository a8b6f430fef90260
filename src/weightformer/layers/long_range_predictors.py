"""Predictors that carry relations between distant tokens into ΔW / ΔK, at O(N) cost.

The released ``bilateral`` predictor cannot: (1) scale: every factor of ΔW = U_inᵀ·core·U_out starts at std 0.02
and the core is a mean over tokens, so ΔW's columns are about 1e-5 long against the static weight's 0.16 (a
saddle at zero; docs/analysis.md); (2) dilution: core = Σ_t σ(p_in,t)ᵀσ(p_out,t) / N, so a few informative tokens
must beat the background's constant outer product. The linear predictors below fix (1) alike: the core is divided
by its RMS and multiplied by a learned gain g₀ = 0.3 / (0.02²·√(C/r·O/r·C)), so ΔW's columns start about 0.3
long. Notation of :mod:`.dynamic_linear`; σ = SiLU, unit(M) = M / (rms(M) + 1e-6). They differ in aggregation:

- ``bilateral_unit``: ΔW = g·U_inᵀ·unit(Σ_t σ(P_in,t)ᵀσ(P_out,t))·U_out (the scale fix only).
- ``score_pool``: h = 4 heads score every token, α_h = softmax_t(X̄·w_h + c_h), each owning a quarter of the C/r
  input-rank rows: core[h-th rows] = Σ_t α_{t,h} σ(P_in,t)[h-th rows]ᵀ σ(P_out,t); ΔW = g·U_inᵀ·unit(core)·U_out.
- ``centered``: core = Σ_t (σ(P_in,t) − mean)ᵀ(σ(P_out,t) − mean), removing the background's constant product.
- ``double_centered``: as ``centered`` with each side double-centred on the H'×W' pooled grid,
  D = σ(P) − row mean − column mean + grid mean, core = Σ_t D_in,tᵀ D_out,t: any sum of a row and a column
  pattern drops out, such as the borders of zero-padded convolutions, which under ``centered`` make ΔW change
  with the canvas size (docs/analysis.md, "Resolution transfer").
- ``double_centered_gated``: ``double_centered`` with g = g₀·exp(κ·s), s a learned scalar from 0 and κ = 30. The
  plain gain g is a parameter of about 3 (64-d) that Adam moves by about the learning rate per step, so in a
  short run it stays where it starts (±0.06 in 900 steps of detection): a fixed choice between learning
  relations quickly (large g₀) and costing nothing on local tasks (small g₀). On the log scale the same steps
  change g by orders of magnitude, so each task sets it: detection shrinks it, the probes keep it
  (docs/analysis.md, "No cost on local tasks").
- ``double_centered_gated_led``: ``double_centered_gated`` started static-led, as a ``dwc_static_led`` conv: s
  from ln(0.1)/κ, so g starts at g₀/10 and ΔW's columns about 0.03 long (the static weight's: about 0.2): the
  block starts close to a static one, and a task that needs ΔW can grow it tenfold in about 80 Adam steps at lr
  1e-3 (docs/analysis.md §6).
- ``median_polished``: as ``double_centered`` with medians for means (one pass of Tukey's median polish: each
  row's median removed, then each column's), core = Σ_t M_in,tᵀ M_out,t. Background inserted into the canvas
  moves a row or column mean (so under ``double_centered`` every background token's residual, and ΔW with
  it, changes with the canvas), but not its median while background is most of the row or column: there the
  background's residual stays 0 and the core is the same sum at any canvas size (docs/probes.md).
- ``median_gap`` (``dwc_predictor=``): ``gap`` with the median-polished sum of the tokens, set to unit RMS over
  channels, in place of the global average: z = unit(Σ_t M_t), ΔK_c = GELU(W₁z + b₁)_c · U_c. The release's
  ``adaptive`` kernel reads each tap from its own region of the canvas, and ``gap`` a mean that background
  dilutes, so both change when the canvas grows; this sum does not while background is most of each row
  and column.
- ``offset_corr`` (``dwc_predictor=``): ``adaptive``'s two 1×1 convs read, in place of region (i, j)'s mean, the
  median-polished map's correlation along offset (i, j): with M the median-polish residuals of X on its H×W grid
  and r = K // 2, A_c(i, j) = Σ_p M_{c,p}·SiLU(M_{c,p+(i−r, j−r)}) (zero beyond the edge), then
  ΔK = W₂ ∗ GELU(W₁ ∗ unit(A) + b₁), unit over channels and taps. Tap (i, j) of a kernel weighs the neighbour at
  that offset; A says how the features co-vary in that direction (a stroke's orientation, say), wherever they
  are. Background residuals are 0 while background is most of each row and column, and contribute nothing to
  the sum, so a drawing centred on a larger blank canvas gives the same ΔK; ``adaptive``'s region means do not
  (docs/probes.md, "Why ``path_link`` falls").
- ``score_gap`` (``dwc_predictor=``): ``gap`` with a per-channel softmax-weighted pool in place of the global
  average, z_c = Σ_t softmax_t(X·W_s + b_s)_{t,c} · X_{t,c}; ΔK_c = GELU(W₁z + b₁)_c · U_c.
"""

import math

import torch
import torch.nn.functional as F
from timm.layers import trunc_normal_
from torch import Tensor, nn

from .dynamic_dwconv import STATIC_LED_DELTA_SCALE, AdaptiveKernelPredictor, GapKernelPredictor
from .dynamic_layer import lower_median, register_predictor
from .dynamic_linear import _LowRankPredictor, pool_2x2, pool_2x2_window, reset_linear

__all__ = ["BilateralUnitPredictor", "CenteredPredictor", "DoubleCenteredPredictor", "GatedDoubleCenteredPredictor",
           "MedianPolishedPredictor", "StaticLedGatedPredictor",
           "MedianGapKernelPredictor", "OffsetCorrelationKernelPredictor", "ScorePoolKernelPredictor",
           "ScorePoolPredictor", "double_center", "median_polish", "offset_correlation"]

_INIT_STD = 0.02  # of the bases U_in, U_out (as the released predictors)
_INIT_COLUMN_NORM = 0.3  # ΔW's column length at init
_GATE_RATE = 30.0  # κ of the gated predictors' g = g₀·exp(κ·s)


def _rms(t: Tensor, dims: list[int]) -> Tensor:
    """Root mean square over ``dims``, kept. The 1e-24 only keeps sqrt's gradient finite at an all-zero input (one
    pooled token under ``centered``, an all-background canvas under ``median_gap``)."""
    return torch.sqrt(t.pow(2).mean(dim=dims, keepdim=True) + 1e-24)


@register_predictor("linear", "bilateral_unit")
class BilateralUnitPredictor(_LowRankPredictor):
    """The released mean over tokens, with the core set to unit RMS and scaled by a learned gain."""

    def __init__(self, in_features: int, out_features: int, reduction: int = 4, device=None, dtype=None):
        super().__init__(in_features, out_features, reduction, device=device, dtype=dtype)
        # g₀: ΔW's columns start about _INIT_COLUMN_NORM long
        self.start = _INIT_COLUMN_NORM / (_INIT_STD**2 * (self.in_rank * self.out_rank * self.in_features) ** 0.5)
        self.gain = nn.Parameter(torch.empty((), device=device, dtype=dtype))
        self._reset_gain()

    def _reset_gain(self) -> None:
        with torch.no_grad():
            self.gain.fill_(self.start)

    def reset_parameters(self) -> None:
        """W_p, U_in, U_out as the release, then the gain g₀."""
        super().reset_parameters()
        self._reset_gain()

    def current_gain(self) -> Tensor:
        """g, the factor on unit(core): here the parameter itself."""
        return self.gain

    def unit_expand(self, core: Tensor) -> Tensor:
        """g·U_inᵀ·unit(core)·U_out as ΔWᵀ (B, O, C), core (B, C/r, O/r)."""
        return self.expand(core * (self.current_gain() / (_rms(core, [1, 2]) + 1e-6)))

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
        """The unit-scaled predictor's parameters, then the scores."""
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


def median_polish(p: Tensor, rows: int, cols: int) -> Tensor:
    """Tokens (B, N', D) of a rows×cols grid (row-major) minus their row median, then minus the column median of
    what is left: one pass of Tukey's median polish, with the lower middle value of an even count (:func:`lower_median`;
    its gradient goes to that element)."""
    B, _, D = p.shape
    grid = p.view(B, rows, cols, D)
    grid = grid - lower_median(grid, dim=2)
    grid = grid - lower_median(grid, dim=1)
    return grid.reshape(B, rows * cols, D)


@register_predictor("linear", "double_centered")
class DoubleCenteredPredictor(BilateralUnitPredictor):
    """Covariance of the activated projections after double centring on the pooled grid (see module docstring)."""

    def center(self, p: Tensor, rows: int, cols: int) -> Tensor:
        """Tokens (B, N', D) of the rows×cols pooled grid, double-centred."""
        return double_center(p, rows, cols)

    def forward(self, x: Tensor) -> Tensor:  # (B, H, W, C) -> ΔWᵀ (B, O, C)
        _, p_in, p_out = self.activated(x)
        H, W = x.shape[1], x.shape[2]
        window_h, window_w = pool_2x2_window(H, W)
        rows, cols = H // window_h, W // window_w  # the grid pool_2x2 leaves
        p_in, p_out = self.center(p_in, rows, cols), self.center(p_out, rows, cols)
        return self.unit_expand(torch.matmul(p_in.transpose(1, 2), p_out))


@register_predictor("linear", "double_centered_gated")
class GatedDoubleCenteredPredictor(DoubleCenteredPredictor):
    """``double_centered`` with its gain on a log scale that training can move: g = g₀·exp(κ·s), the parameter
    ``gain`` holding s (0 at init, so g starts at g₀ as before) and κ = :attr:`rate` (see module docstring)."""

    def __init__(self, in_features: int, out_features: int, reduction: int = 4, device=None, dtype=None):
        super().__init__(in_features, out_features, reduction, device=device, dtype=dtype)
        self.rate = _GATE_RATE  # Adam moves s by about lr per step, so g can change by orders of magnitude in a short run

    def _reset_gain(self) -> None:
        with torch.no_grad():
            self.gain.zero_()

    def current_gain(self) -> Tensor:
        """g = g₀·exp(κ·s)."""
        return self.start * torch.exp(self.rate * self.gain)


@register_predictor("linear", "double_centered_gated_led")
class StaticLedGatedPredictor(GatedDoubleCenteredPredictor):
    """``double_centered_gated`` with s starting at ln(:data:`STATIC_LED_DELTA_SCALE`)/κ: g starts at a tenth of g₀,
    ΔW's columns about 0.03 long (see module docstring)."""

    def _reset_gain(self) -> None:
        with torch.no_grad():  # called by the base's __init__ before self.rate is set, so κ from the constant
            self.gain.fill_(math.log(STATIC_LED_DELTA_SCALE) / _GATE_RATE)


@register_predictor("linear", "median_polished")
class MedianPolishedPredictor(DoubleCenteredPredictor):
    """``double_centered`` with row and column medians for the means (see module docstring)."""

    def center(self, p: Tensor, rows: int, cols: int) -> Tensor:
        """Tokens (B, N', D) of the rows×cols pooled grid, median-polished."""
        return median_polish(p, rows, cols)


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
        """The kernel bank U: truncated normal, std 0.02."""
        trunc_normal_(self.bank, std=0.02)

    def forward(self, x: Tensor) -> Tensor:  # (B, C, H, W) -> (B, C, K, K)
        weights = torch.softmax(self.score(x).flatten(2), dim=-1)  # (B, C, N), per channel over tokens
        pooled = (weights * x.flatten(2)).sum(-1)  # (B, C)
        return self.act(self.fc1(pooled))[:, :, None, None] * self.bank


@register_predictor("dwconv", "median_gap")
class MedianGapKernelPredictor(GapKernelPredictor):
    """``gap``'s layers with z the unit-RMS sum of the median-polished tokens for the mean (module docstring)."""

    def forward(self, x: Tensor) -> Tensor:  # (B, C, H, W) -> (B, C, K, K)
        _, _, H, W = x.shape
        tokens = x.flatten(2).transpose(1, 2)  # (B, H·W, C), row-major
        z = median_polish(tokens, H, W).sum(dim=1)  # (B, C)
        z = z / (_rms(z, [1]) + 1e-6)
        return self.act(self.fc1(z))[:, :, None, None] * self.bank


def offset_correlation(m: Tensor, kernel_size: int) -> Tensor:
    """A[b, c, i, j] = Σ_p m[b, c, p]·SiLU(m[b, c, p + (i − r, j − r)]), r = kernel_size // 2, zero beyond the
    edge: per channel, how each position's value meets its neighbour's at every offset of a K×K kernel.
    (B, C, H, W) -> (B, C, K, K)."""
    B, C, H, W = m.shape
    r = kernel_size // 2
    neighbour = F.pad(F.silu(m), (r, r, r, r))  # (B, C, H + 2r, W + 2r)
    taps: list[Tensor] = []  # K² of (B, C), row-major; loops, as TorchScript takes one generator per comprehension
    for i in range(kernel_size):
        for j in range(kernel_size):
            taps.append((m * neighbour[:, :, i:i + H, j:j + W]).sum(dim=(2, 3)))
    return torch.stack(taps, dim=-1).view(B, C, kernel_size, kernel_size)


@register_predictor("dwconv", "offset_corr")
class OffsetCorrelationKernelPredictor(AdaptiveKernelPredictor):
    """``adaptive``'s layers reading unit(A), A the median-polished map's offset correlation (module docstring)."""

    def statistic(self, x: Tensor) -> Tensor:  # (B, C, H, W) -> (B, C, K, K)
        """unit(A): the offset correlation of the median-polish residuals, at unit RMS over channels and taps."""
        B, C, H, W = x.shape
        tokens = x.flatten(2).transpose(1, 2)  # (B, H·W, C), row-major
        residual = median_polish(tokens, H, W).transpose(1, 2).reshape(B, C, H, W)
        a = offset_correlation(residual, self.kernel_size)
        return a / (_rms(a, [1, 2, 3]) + 1e-6)
