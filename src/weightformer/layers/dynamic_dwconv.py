"""Dynamic depthwise convolution: a K×K depthwise kernel predicted per sample and per channel.

Each predictor maps a sample's X ∈ R^{C×H×W} to ΔK ∈ R^{C×K×K}; :class:`DynamicDWConv` normalises it per channel
and adds the static kernel. With P_K(X) the adaptive average pool of X to K×K and ḡ = mean(X) ∈ R^C:

- ``adaptive`` (the paper's default): ΔK = W₂ ∗ GELU(W₁ ∗ P_K(X) + b₁), W₁, W₂ 1×1 convs (W₂ without bias).
- ``gap``: ΔK_c = h_c · U_c, h = GELU(W₁ḡ + b₁), U ∈ R^{C×K×K} a learned kernel bank.
- ``amp_dir``: ΔK_c = a_c · D_c / ‖D_c‖, D the ``adaptive`` output, a = W_a·GELU(W₁ḡ + b₁) + b_a.
- ``conv``: ``adaptive`` with W₁ a 3×3 depthwise conv (zero padding) followed by a 1×1 conv.

``padding="background"`` (not the release's; :class:`DynamicDWConv` and :class:`BackgroundPaddedConv2d`) pads with
each sample's blank-canvas feature m (per channel, the median over the grid, :func:`background_value`) in place
of zeros, so that the grid's edge looks like more canvas: W ∗ pad_m(X) = W ∗ pad_0(X − m) + m·ΣW.

Eager mode runs one grouped conv with B·C groups and ``F.adaptive_avg_pool2d``, which do not trace with symbolic
sizes; under ``torch.compile``/``torch.export`` the same arithmetic runs as K² shifted, per-sample-scaled copies
of the input (:func:`per_sample_depthwise_conv_taps`) and size-following averaging matrices
(:func:`adaptive_avg_pool_matrices`), equal up to float rounding.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from timm.layers import trunc_normal_

from .dynamic_layer import DWCONV_PREDICTORS, DynamicWeightLayer, lower_median, register_predictor

__all__ = ["DWCONV_PREDICTORS", "DWC_PADDINGS", "background_value", "check_dwc_padding", "BackgroundPaddedConv2d",
           "static_depthwise_conv", "adaptive_avg_pool", "adaptive_avg_pool_matrices", "per_sample_depthwise_conv_taps",
           "DynamicDWConv", "AdaptiveKernelPredictor", "GapKernelPredictor", "AmplitudeDirectionKernelPredictor",
           "ConvKernelPredictor"]


DWC_PADDINGS = ("zeros", "background")  # what a depthwise conv reads past the grid's edge (module docstring)


def background_value(x: Tensor) -> Tensor:
    """The blank canvas's feature m: per sample and channel, the median over the grid (the lower of the two middle
    values when H·W is even); the canvas's own wherever background is most of the grid. (B, C, H, W) -> (B, C, 1, 1)."""
    return lower_median(x.flatten(2), dim=2)[..., None]


def check_dwc_padding(padding: str) -> None:
    if padding not in DWC_PADDINGS:
        raise ValueError(f"dwc_padding must be one of {', '.join(DWC_PADDINGS)}, got {padding!r}")


class BackgroundPaddedConv2d(nn.Conv2d):
    """A depthwise ``nn.Conv2d`` ("same" size) padded with :func:`background_value` in place of zeros: the static
    blocks' conv under ``dwc_padding="background"``. The same parameters, so the same checkpoint keys."""

    def __init__(self, dim: int, kernel_size: int, device=None, dtype=None):
        super().__init__(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:  # (B, C, H, W) -> (B, C, H, W)
        m = background_value(x)  # (B, C, 1, 1)
        return super().forward(x - m) + m * self.weight.sum(dim=(1, 2, 3)).to(x.dtype)[None, :, None, None]


def static_depthwise_conv(dim: int, kernel_size: int, padding: str = "zeros", device=None, dtype=None) -> nn.Conv2d:
    """A static block's depthwise conv ("same" size): ``nn.Conv2d`` zero-padded, or :class:`BackgroundPaddedConv2d`."""
    if padding == "background":
        return BackgroundPaddedConv2d(dim, kernel_size, device=device, dtype=dtype)
    return nn.Conv2d(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim, device=device, dtype=dtype)


def adaptive_avg_pool_matrices(x: Tensor, size: int) -> Tensor:
    """``F.adaptive_avg_pool2d(x, size)`` as A_H · X · A_Wᵀ, A_n (size, n) averaging bin i = [⌊i·n/size⌋,
    ⌈(i+1)·n/size⌉), built from the input's shape. (B, C, H, W) -> (B, C, size, size)."""
    H, W = x.shape[-2], x.shape[-1]
    rows, cols = _bin_average_matrix(H, size, x), _bin_average_matrix(W, size, x)  # (size, H), (size, W)
    return torch.matmul(torch.matmul(rows, x), cols.t())  # (B, C, size, W) -> (B, C, size, size)


def _bin_average_matrix(n: int, size: int, like: Tensor) -> Tensor:
    """(size, n): row i averages the positions of adaptive-pooling bin i of a side of n."""
    bins = torch.arange(size, device=like.device)
    start = (bins * n) // size
    end = ((bins + 1) * n + size - 1) // size  # ceil((i + 1)·n / size)
    positions = torch.arange(n, device=like.device)
    inside = ((positions[None, :] >= start[:, None]) & (positions[None, :] < end[:, None])).to(like.dtype)
    return inside / inside.sum(dim=1, keepdim=True)


def adaptive_avg_pool(x: Tensor, size: int) -> Tensor:
    """``F.adaptive_avg_pool2d`` in eager mode, :func:`adaptive_avg_pool_matrices` while torch.compile traces."""
    if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript skips only a bare is_scripting() test)
        if torch.compiler.is_compiling():
            return adaptive_avg_pool_matrices(x, size)
    return F.adaptive_avg_pool2d(x, size)


def per_sample_depthwise_conv_taps(x: Tensor, kernel: Tensor, bias: Tensor) -> Tensor:
    """Per-sample depthwise conv, "same" zero padding, as K² shifted copies: y = b + Σ_ij K[:, :, i, j] ·
    pad(X)[:, :, i:i+H, j:j+W]; no group count, so sizes stay symbolic. x (B, C, H, W), kernel (B, C, K, K),
    bias (C,) -> (B, C, H, W), channels-last."""
    K = kernel.shape[-1]
    H, W = x.shape[-2], x.shape[-1]
    padded = F.pad(x.permute(0, 2, 3, 1), (0, 0, K // 2, K // 2, K // 2, K // 2))  # (B, H+K-1, W+K-1, C)
    taps = kernel.permute(0, 2, 3, 1)  # (B, K, K, C)
    out = bias.to(x.dtype)  # (C,), broadcast to (B, H, W, C) by the first tap
    for i in range(K):
        for j in range(K):
            out = out + padded[:, i:i + H, j:j + W, :] * taps[:, i, j, None, None, :]
    return out.permute(0, 3, 1, 2)  # (B, C, H, W), channels-last


@register_predictor("dwconv", "adaptive")
class AdaptiveKernelPredictor(nn.Module):
    """Spatially adaptive prediction: ΔK = W₂ ∗ GELU(W₁ ∗ AdaptiveAvgPool_K(X) + b₁)."""

    def __init__(self, dim: int, kernel_size: int, device=None, dtype=None):
        super().__init__()
        self.kernel_size = kernel_size
        self.fc1 = nn.Conv2d(dim, dim, 1, device=device, dtype=dtype)
        self.act = nn.GELU()
        self.fc2 = nn.Conv2d(dim, dim, 1, bias=False, device=device, dtype=dtype)

    def statistic(self, x: Tensor) -> Tensor:  # (B, C, H, W) -> (B, C, K, K)
        """What the 1×1 convs read at tap (i, j): here region (i, j)'s mean."""
        # Contiguous (NCHW) so the 1×1 convs' weight gradients come out in the weights' own layout,
        # which DDP's gradient buckets expect; the pooled map is only K×K.
        return adaptive_avg_pool(x, self.kernel_size).contiguous()

    def forward(self, x: Tensor) -> Tensor:  # (B, C, H, W) -> (B, C, K, K)
        return self.fc2(self.act(self.fc1(self.statistic(x))))


@register_predictor("dwconv", "gap")
class GapKernelPredictor(nn.Module):
    """Global-average prediction: ΔK_c = GELU(W₁ḡ + b₁)_c · U_c, a learned kernel bank U scaled per channel."""

    def __init__(self, dim: int, kernel_size: int, device=None, dtype=None):
        super().__init__()
        self.fc1 = nn.Linear(dim, dim, device=device, dtype=dtype)
        self.act = nn.GELU()
        self.bank = nn.Parameter(torch.empty(dim, kernel_size, kernel_size, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The kernel bank U: truncated normal, std 0.02."""
        trunc_normal_(self.bank, std=0.02)

    def forward(self, x: Tensor) -> Tensor:  # (B, C, H, W) -> (B, C, K, K)
        gain = self.act(self.fc1(x.mean(dim=(2, 3))))  # (B, C)
        return gain[:, :, None, None] * self.bank


@register_predictor("dwconv", "amp_dir")
class AmplitudeDirectionKernelPredictor(nn.Module):
    """Decoupled amplitude and direction: ΔK_c = a_c · D_c/‖D_c‖, D spatially adaptive, a from ḡ."""

    def __init__(self, dim: int, kernel_size: int, device=None, dtype=None):
        super().__init__()
        self.direction = AdaptiveKernelPredictor(dim, kernel_size, device=device, dtype=dtype)
        self.fc1 = nn.Linear(dim, dim, device=device, dtype=dtype)
        self.act = nn.GELU()
        self.amplitude = nn.Linear(dim, dim, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:  # (B, C, H, W) -> (B, C, K, K)
        direction = self.direction(x)
        direction = direction / (torch.linalg.vector_norm(direction, dim=(2, 3), keepdim=True) + 1e-6)
        amplitude = self.amplitude(self.act(self.fc1(x.mean(dim=(2, 3)))))  # (B, C)
        return amplitude[:, :, None, None] * direction


@register_predictor("dwconv", "conv")
class ConvKernelPredictor(nn.Module):
    """Convolutional prediction: ΔK = W₂ ∗ GELU(W₁ ∗ DW3×3(AdaptiveAvgPool_K(X)) + b₁)."""

    def __init__(self, dim: int, kernel_size: int, device=None, dtype=None):
        super().__init__()
        self.kernel_size = kernel_size
        self.spatial = nn.Conv2d(dim, dim, 3, padding=1, groups=dim, device=device, dtype=dtype)
        self.fc1 = nn.Conv2d(dim, dim, 1, device=device, dtype=dtype)
        self.act = nn.GELU()
        self.fc2 = nn.Conv2d(dim, dim, 1, bias=False, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:  # (B, C, H, W) -> (B, C, K, K)
        pooled = adaptive_avg_pool(x, self.kernel_size).contiguous()  # see AdaptiveKernelPredictor
        return self.fc2(self.act(self.fc1(self.spatial(pooled))))


STATIC_LED_DELTA_SCALE = 0.1  # ΔK's factor in a static-led conv: its correction starts a tenth as long


class DynamicDWConv(DynamicWeightLayer):
    """Depthwise conv with a per-sample kernel, y = (K + ΔK̂(X)) ∗ X + b, "same" padding, K odd;
    ΔK̂_c = s·ΔK_c / (‖s·ΔK_c‖₂ + 1) per channel, s = 1. (B, C, H, W) -> (B, C, H, W).

    ``static_led=True`` (not the release's): K and b drawn as ``nn.Conv2d``'s, as the static blocks' conv (K about
    0.58 long per channel at 3×3, against the release's 0.06), and s = :data:`STATIC_LED_DELTA_SCALE`, so the
    conv starts as a static block's with a per-sample correction about 0.05 long (the release's: 0.3, five times
    K); the correction can still grow to length 1 as the predictor learns (docs/analysis.md §6).
    ``padding="background"`` (not the release's) pads with :func:`background_value` in place of zeros."""

    def __init__(self, dim: int, kernel_size: int = 3, predictor: str = "adaptive", static_led: bool = False,
                 padding: str = "zeros", device=None, dtype=None):
        check_dwc_padding(padding)
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be a positive odd number for 'same' padding, got {kernel_size}")
        if not isinstance(static_led, bool):
            raise ValueError(f"static_led (the model's dwc_static_led) must be True or False, got {static_led!r}")
        self.static_led = static_led  # read by reset_parameters, which the base's __init__ calls
        self.delta_scale = STATIC_LED_DELTA_SCALE if static_led else 1.0
        super().__init__("dynamic depthwise-conv", DWCONV_PREDICTORS, predictor, (dim, kernel_size),
                         weight_shape=(dim, 1, kernel_size, kernel_size), bias_size=dim, device=device, dtype=dtype)
        self.dim, self.kernel_size, self.padding = dim, kernel_size, padding

    def reset_parameters(self) -> None:
        """The release's draws, or with ``static_led`` those of ``nn.Conv2d.reset_parameters`` (kaiming uniform with
        a = √5, bias uniform in ±1/√fan_in), the static blocks' conv."""
        if not self.static_led:
            super().reset_parameters()
            return
        nn.Conv2d.reset_parameters(self)  # torch's own draws; they read only self.weight and self.bias

    def extra_repr(self) -> str:
        led = ", static_led=True" if self.static_led else ""
        padding = f", padding={self.padding}" if self.padding != "zeros" else ""
        return f"dim={self.dim}, kernel_size={self.kernel_size}, predictor={self.predictor_name}{led}{padding}"

    def predicted_delta(self, x: Tensor) -> Tensor:  # (B, C, H, W) -> (B, C, K, K)
        """ΔK̂ = s·ΔK / (‖s·ΔK‖₂ + 1) per sample and channel."""
        delta = self.predictor(x)
        if self.static_led:
            delta = delta * self.delta_scale
        return delta / (torch.linalg.vector_norm(delta, dim=(2, 3), keepdim=True) + 1.0)

    def forward_fast(self, x: Tensor) -> Tensor:  # (B, C, H, W) -> (B, C, H, W)
        C, K = x.shape[1], self.kernel_size
        if C != self.dim:
            raise ValueError(f"DynamicDWConv expected {self.dim} channels, got {C}")
        delta = self.predicted_delta(x)  # (B, C, K, K)
        kernel = (delta + self.weight.view(1, C, K, K)).to(x.dtype)  # (B, C, K, K), no repeat of the static kernel
        if self.padding == "background":  # K ∗ pad_m(X) = K ∗ pad_0(X − m) + m·ΣK (module docstring)
            m = background_value(x)  # (B, C, 1, 1)
            return self._zero_padded(x - m, kernel) + m * kernel.sum(dim=(2, 3))[:, :, None, None]
        return self._zero_padded(x, kernel)

    def _zero_padded(self, x: Tensor, kernel: Tensor) -> Tensor:  # (B, C, H, W), (B, C, K, K) -> (B, C, H, W)
        B, C, H, W = x.shape
        K = self.kernel_size
        if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript skips only a bare is_scripting() test)
            if torch.compiler.is_compiling():  # sizes stay symbolic: no B·C group count (module docstring)
                return per_sample_depthwise_conv_taps(x, kernel, self.bias)
        # Batch folded into the channels, channels-last (an NCHW fold sends mkldnn down its slow planar path):
        # one grouped conv with B·C groups gives every sample its own kernels.
        folded = x.permute(2, 3, 0, 1).reshape(1, H, W, B * C).permute(0, 3, 1, 2)  # (1, B·C, H, W)
        out = F.conv2d(folded, kernel.reshape(B * C, 1, K, K), self.bias.to(x.dtype).repeat(B), padding=K // 2,
                       groups=B * C)  # (1, B·C, H, W), channels-last
        return out.permute(0, 2, 3, 1).reshape(H, W, B, C).permute(2, 3, 0, 1)  # (B, C, H, W)

    def forward_reference(self, x: Tensor) -> Tensor:
        return dynamic_dwconv_reference(self, x)


def dynamic_dwconv_reference(layer: DynamicDWConv, x: Tensor) -> Tensor:
    """The paper's pseudocode, with the static kernel repeated per sample: the equivalence reference."""
    B, C, H, W = x.shape
    K = layer.kernel_size
    delta = layer.predictor(x).reshape(B * C, 1, K, K) * layer.delta_scale
    delta = delta / (delta.norm(dim=(-2, -1), keepdim=True) + 1.0)
    kernel = delta + layer.weight.repeat(B, 1, 1, 1)
    pad = K // 2
    if layer.padding == "background":  # the border filled with each channel's median, then a conv that pads nothing
        fill = background_value(x)  # (B, C, 1, 1)
        x, pad = F.pad(x - fill, (pad,) * 4) + fill, 0  # (B, C, H+K-1, W+K-1)
    out = F.conv2d(x.reshape(1, B * C, *x.shape[-2:]), kernel, layer.bias.repeat(B), padding=pad, groups=B * C)
    return out.reshape(B, C, H, W)
