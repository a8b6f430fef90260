"""The dynamic layers' formulas, written out again for the tests from the paper and the release.

Shares no code with ``weightformer.layers``: the pooling, the predictors and the convolution are
re-stated here with tensor primitives, and the layers' parameters are read from their state dicts.
Every function takes float64 tensors in the tests, so a comparison can be tight.
"""

import torch
import torch.nn.functional as F
from torch import Tensor


def pool_tokens_2x2(x: Tensor) -> Tensor:
    """(B, H, W, C) -> (B, N', C): means of 2×2 windows, the release's AvgPool2d(2).

    A side of 2 or more is floored (the last row or column of an odd side is left out); along a
    side of 1 the window is 1.
    """
    B, H, W, C = x.shape
    kh, kw = min(H, 2), min(W, 2)
    x = x[:, : H - H % kh, : W - W % kw]  # the whole windows only
    windows = x.reshape(B, H // kh, kh, W // kw, kw, C)  # (B, H', kh, W', kw, C)
    return windows.mean(dim=(2, 4)).reshape(B, -1, C)  # (B, H'·W', C)


def linear_update(predictor: str, sd: dict, x: Tensor) -> Tensor:
    """ΔW (B, C, O) of a DynamicLinear with state dict ``sd`` for tokens x (B, H, W, C), before normalising.

    With X̄ the 2×2-pooled tokens, P = X̄·W_pᵀ + b_p split into P_in (C/r) and P_out (O/r), σ = SiLU,
    s = C^-1/2 / N and N = H·W the full token count:
    bilateral ΔW = (σ(P_in)·U_in)ᵀ(σ(P_out)·U_out)·s; linear: the same without σ;
    nonlinear ΔW = U_inᵀ·σ(P_inᵀ·P_out·s)·U_out;
    deep: bilateral with P = GELU(X̄·W_hᵀ + b_h)·W_pᵀ + b_p;
    gap: bilateral on the one mean token ḡ, with s = C^-1/2.
    """
    B, H, W, C = x.shape
    if predictor == "gap":
        tokens, scale = x.mean(dim=(1, 2)).unsqueeze(1), C**-0.5  # (B, 1, C)
    else:
        tokens, scale = pool_tokens_2x2(x), C**-0.5 / (H * W)  # (B, N', C)
    if predictor == "deep":
        tokens = F.gelu(tokens @ sd["predictor.hidden.weight"].T + sd["predictor.hidden.bias"])
    p = tokens @ sd["predictor.proj.weight"].T + sd["predictor.proj.bias"]  # (B, N', C/r + O/r)
    u_in, u_out = sd["predictor.in_basis"], sd["predictor.out_basis"]  # (C/r, C), (O/r, O)
    p_in, p_out = p[..., : u_in.shape[0]], p[..., u_in.shape[0]:]
    if predictor == "nonlinear":
        return u_in.T @ F.silu(p_in.transpose(1, 2) @ p_out * scale) @ u_out
    if predictor != "linear":
        p_in, p_out = F.silu(p_in), F.silu(p_out)
    return (p_in @ u_in).transpose(1, 2) @ (p_out @ u_out) * scale


def linear_layer(predictor: str, sd: dict, x: Tensor) -> Tensor:
    """y = X·(W + ΔW/(‖ΔW‖+1)) + b, the norm over C for each output column: (B, H, W, C) -> (B, H, W, O)."""
    B, H, W, C = x.shape
    delta = linear_update(predictor, sd, x)  # (B, C, O)
    weight = sd["weight"].T + delta / (delta.norm(dim=1, keepdim=True) + 1.0)  # (B, C, O)
    return (x.reshape(B, H * W, C) @ weight + sd["bias"]).reshape(B, H, W, -1)  # (B, N, O) -> (B, H, W, O)


def adaptive_pool(x: Tensor, k: int) -> Tensor:
    """(B, C, H, W) -> (B, C, k, k): bin (i, j) averages rows ⌊iH/k⌋ up to ⌈(i+1)H/k⌉, columns alike."""
    H, W = x.shape[-2:]

    def bins(n: int) -> list:
        return [((i * n) // k, -(-((i + 1) * n) // k)) for i in range(k)]

    rows = [torch.stack([x[:, :, r0:r1, c0:c1].mean(dim=(2, 3)) for c0, c1 in bins(W)], -1) for r0, r1 in bins(H)]
    return torch.stack(rows, -2)


def depthwise_same(x: Tensor, kernel: Tensor, bias: Tensor) -> Tensor:
    """Per-sample depthwise cross-correlation with zero "same" padding.

    x (B, C, H, W), kernel (B, C, K, K), bias (C,) -> (B, C, H, W).
    """
    K = kernel.shape[-1]
    H, W = x.shape[-2:]
    padded = F.pad(x, (K // 2,) * 4)
    out = bias[None, :, None, None].expand_as(x)
    for u in range(K):
        for v in range(K):
            out = out + kernel[:, :, u, v, None, None] * padded[:, :, u:u + H, v:v + W]
    return out


def _pointwise(t: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """A 1×1 convolution: weight (O, C, 1, 1), t (B, C, K, K) -> (B, O, K, K)."""
    out = torch.einsum("oc,bckl->bokl", weight[:, :, 0, 0], t)
    return out if bias is None else out + bias[:, None, None]


def dwconv_update(predictor: str, sd: dict, x: Tensor, k: int) -> Tensor:
    """ΔK (B, C, K, K) of a DynamicDWConv with state dict ``sd`` for x (B, C, H, W), before normalising.

    With P_K the adaptive average pool to K×K and ḡ the mean of x:
    adaptive ΔK = W₂ ∗ GELU(W₁ ∗ P_K(X) + b₁); conv: the same with a 3×3 depthwise conv (zero padding)
    on P_K(X) first; gap ΔK_c = GELU(W₁ḡ + b₁)_c·U_c; amp_dir ΔK_c = a_c·D_c/(‖D_c‖ + 1e-6) with D
    the adaptive ΔK and a = W_a·GELU(W₁ḡ + b₁) + b_a.
    """
    B = x.shape[0]
    mean = x.mean(dim=(2, 3))  # (B, C)
    if predictor == "gap":
        gain = F.gelu(mean @ sd["predictor.fc1.weight"].T + sd["predictor.fc1.bias"])  # (B, C)
        return gain[:, :, None, None] * sd["predictor.bank"]
    prefix = "predictor.direction." if predictor == "amp_dir" else "predictor."
    t = adaptive_pool(x, k)  # (B, C, K, K)
    if predictor == "conv":
        spatial = sd["predictor.spatial.weight"][:, 0].expand(B, -1, -1, -1)  # (B, C, 3, 3)
        t = depthwise_same(t, spatial, sd["predictor.spatial.bias"])
    d = _pointwise(F.gelu(_pointwise(t, sd[prefix + "fc1.weight"], sd[prefix + "fc1.bias"])), sd[prefix + "fc2.weight"])
    if predictor != "amp_dir":
        return d
    hidden = F.gelu(mean @ sd["predictor.fc1.weight"].T + sd["predictor.fc1.bias"])
    amplitude = hidden @ sd["predictor.amplitude.weight"].T + sd["predictor.amplitude.bias"]  # (B, C)
    return amplitude[:, :, None, None] * d / (d.flatten(2).norm(dim=-1)[..., None, None] + 1e-6)


def dwconv_layer(predictor: str, sd: dict, x: Tensor, k: int) -> Tensor:
    """y = (K + ΔK/(‖ΔK‖+1)) ∗ X + b per sample and channel: (B, C, H, W) -> (B, C, H, W)."""
    delta = dwconv_update(predictor, sd, x, k)
    kernel = sd["weight"][:, 0] + delta / (delta.flatten(2).norm(dim=-1)[..., None, None] + 1.0)
    return depthwise_same(x, kernel, sd["bias"])
