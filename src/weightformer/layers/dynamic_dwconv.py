"""Dynamic depthwise convolution: a K×K depthwise kernel predicted per sample and per channel.

Each predictor maps a sample's feature map X ∈ R^{C×H×W} to ΔK ∈ R^{C×K×K};
:class:`DynamicDWConv` normalises it per channel and adds the static kernel. With P_K(X) the
adaptive average pool of X to K×K and ḡ = mean(X) ∈ R^C:

- ``adaptive`` (spatially adaptive prediction, the paper's default):
  ΔK = W₂ ∗ GELU(W₁ ∗ P_K(X) + b₁), W₁ and W₂ 1×1 convolutions (W₂ without bias).
- ``gap``: the kernel's shape is learned, only its gain is predicted from the global average,
  ΔK_c = h_c · U_c with h = GELU(W₁ḡ + b₁) and U ∈ R^{C×K×K} a learned kernel bank.
- ``amp_dir`` (decoupled amplitude and direction): the direction comes from the adaptive branch,
  the amplitude from the global average, ΔK_c = a_c · D_c / ‖D_c‖ with D the ``adaptive`` output
  and a = W_a·GELU(W₁ḡ + b₁) + b_a.
- ``conv``: like ``adaptive`` with spatial mixing inside the predictor, W₁ a 3×3 depthwise
  convolution (zero padding) followed by a 1×1 convolution.

Traced forms. In eager mode the per-sample kernels run as one grouped convolution with B·C groups
and P_K is ``F.adaptive_avg_pool2d``; neither survives tracing with symbolic sizes (ONNX ``Conv``
takes its group count as a constant, an exported adaptive pool keeps the example's bins). While
``torch.compile`` or ``torch.export`` (and so the ONNX exporter) traces the layer, it runs the same
arithmetic as K² shifted, per-sample-scaled copies of the input (:func:`per_sample_depthwise_conv_taps`)
and two averaging matrices built from the input size (:func:`adaptive_avg_pool_matrices`), equal to
the eager forms up to float rounding (tested).
"""


import torch
import torch.nn.functional as F
from torch import Tensor, nn
from timm.layers import trunc_normal_

from .dynamic_layer import DWCONV_PREDICTORS, DynamicWeightLayer, register_predictor

__all__ = ["DWCONV_PREDICTORS", "adaptive_avg_pool", "adaptive_avg_pool_matrices", "per_sample_depthwise_conv_taps",
           "DynamicDWConv", "AdaptiveKernelPredictor", "GapKernelPredictor", "AmplitudeDirectionKernelPredictor",
           "ConvKernelPredictor"]


def adaptive_avg_pool_matrices(x: Tensor, size: int) -> Tensor:
    """``F.adaptive_avg_pool2d(x, size)`` as A_H · X · A_Wᵀ, A_n (size, n) averaging PyTorch's bins: bin i of a
    side n covers [⌊i·n/size⌋, ⌈(i+1)·n/size⌉). Built from the input's shape, so a traced graph pools any
    size correctly. Shapes (B, C, H, W) -> (B, C, size, size)."""
    H, W = x.shape[-2], x.shape[-1]
    rows = _bin_average_matrix(H, size, x)  # (size, H)
    cols = _bin_average_matrix(W, size, x)  # (size, W)
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
    """Adaptive average pooling to size×size: ``F.adaptive_avg_pool2d`` in eager mode, the
    size-following :func:`adaptive_avg_pool_matrices` while torch.compile or torch.export traces."""
    if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript skips only a bare is_scripting() test)
        if torch.compiler.is_compiling():
            return adaptive_avg_pool_matrices(x, size)
    return F.adaptive_avg_pool2d(x, size)


def per_sample_depthwise_conv_taps(x: Tensor, kernel: Tensor, bias: Tensor) -> Tensor:
    """Depthwise convolution with one K×K kernel per sample and channel, "same" zero padding, as a sum of K²
    shifted copies of the input: y = b + Σ_ij K[:, :, i, j] · pad(X)[:, :, i:i+H, j:j+W]. No group count, so
    every size can stay symbolic. Channels-last, as the blocks hold their tokens.
    Shapes: x (B, C, H, W), kernel (B, C, K, K), bias (C,) -> (B, C, H, W)."""
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

    def forward(self, x: Tensor) -> Tensor:  # (B, C, H, W) -> (B, C, K, K)
        # Contiguous (NCHW) so the 1×1 convs' weight gradients come out in the weights' own layout,
        # which DDP's gradient buckets expect; the pooled map is only K×K.
        pooled = adaptive_avg_pool(x, self.kernel_size).contiguous()
        return self.fc2(self.act(self.fc1(pooled)))


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
        """The kernel bank U: truncated normal, std 0.02 (fc1 is a plain ``nn.Linear``)."""
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


class DynamicDWConv(DynamicWeightLayer):
    """Depthwise convolution with a per-sample kernel, y = (K + ΔK̂(X)) ∗ X + b, "same" padding.

    ΔK̂_c = ΔK_c / (‖ΔK_c‖₂ + 1) per channel c; ΔK comes from a predictor (module docstring). Shapes
    (B, C, H, W) -> (B, C, H, W), like the ``nn.Conv2d(C, C, K, padding=K // 2, groups=C)`` it replaces; K odd.
    """

    def __init__(self, dim: int, kernel_size: int = 3, predictor: str = "adaptive", device=None, dtype=None):
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be a positive odd number for 'same' padding, got {kernel_size}")
        super().__init__("dynamic depthwise-conv", DWCONV_PREDICTORS, predictor, (dim, kernel_size),
                         weight_shape=(dim, 1, kernel_size, kernel_size), bias_size=dim, device=device, dtype=dtype)
        self.dim, self.kernel_size = dim, kernel_size

    def extra_repr(self) -> str:
        return f"dim={self.dim}, kernel_size={self.kernel_size}, predictor={self.predictor_name}"

    def forward_fast(self, x: Tensor) -> Tensor:  # (B, C, H, W) -> (B, C, H, W)
        B, C, H, W = x.shape
        K = self.kernel_size
        if C != self.dim:
            raise ValueError(f"DynamicDWConv expected {self.dim} channels, got {C}")
        delta = self.predictor(x)  # (B, C, K, K)
        delta = delta / (torch.linalg.vector_norm(delta, dim=(2, 3), keepdim=True) + 1.0)
        kernel = (delta + self.weight.view(1, C, K, K)).to(x.dtype)  # (B, C, K, K), no repeat of the static kernel
        if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript skips only a bare is_scripting() test)
            if torch.compiler.is_compiling():  # sizes stay symbolic: no B·C group count (module docstring)
                return per_sample_depthwise_conv_taps(x, kernel, self.bias)
        # Fold the batch into the channels, channels-last: (H, W, B, C) -> one grouped conv with B·C
        # groups gives every sample its own kernels. For a channels-last x (a permuted token grid) the
        # fold is a view when B == 1 and one copy otherwise; an NCHW fold would send mkldnn down its
        # slow planar path.
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
    delta = layer.predictor(x).reshape(B * C, 1, K, K)
    delta = delta / (delta.norm(dim=(-2, -1), keepdim=True) + 1.0)
    kernel = delta + layer.weight.repeat(B, 1, 1, 1)
    out = F.conv2d(x.reshape(1, B * C, H, W), kernel, layer.bias.repeat(B), padding=K // 2, groups=B * C)
    return out.reshape(B, C, H, W)
