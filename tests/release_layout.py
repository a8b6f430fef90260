"""The authors' released network as a pure function of a state dict in their key layout.

Written from the architecture facts of the release (layer order, key names, constants), not from its
code, so tests can check that our models load the authors' weights and give the same logits.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

EPS = 1e-6  # the release's LayerNorm epsilon


def release_state_dict(dim: int = 192, depth: int = 17, num_classes: int = 1000, mlp_ratio: float = 4.0,
                       in_chans: int = 3, patch: int = 16, seed: int = 0) -> dict[str, Tensor]:
    """Random weights under the release's key names (dynamic blocks at i with (i + 2) % 3 == 0).

    Values are drawn at a scale that makes every branch matter, so a mis-mapped key changes logits.
    The predictors' weights are drawn small enough that the predicted updates have norms of about
    0.1 to 3 before the normalisation Δ/(‖Δ‖+1): far from saturating (‖Δ‖ ≫ 1, where Δ/(‖Δ‖+1) no
    longer depends on the C^-1/2/N scale), so an error in that scale changes the logits too.
    """
    g = torch.Generator().manual_seed(seed)
    hidden = int(dim * mlp_ratio)

    def rnd(*shape: int, std: float = 0.05) -> Tensor:
        return torch.randn(*shape, generator=g) * std

    sd = {
        "patch_embed.proj.weight": rnd(dim, in_chans, patch, patch),
        "patch_embed.proj.bias": rnd(dim),
        "init_norm.weight": 1 + rnd(dim),
        "init_norm.bias": rnd(dim),
        "norm.weight": 1 + rnd(dim),
        "norm.bias": rnd(dim),
        "head.weight": rnd(num_classes, dim),
        "head.bias": rnd(num_classes),
    }
    for i in range(depth):
        p = f"blocks.{i}."
        sd[p + "norm2.weight"] = 1 + rnd(dim)
        sd[p + "norm2.bias"] = rnd(dim)
        sd[p + "linear2.weight"] = rnd(dim, hidden)
        sd[p + "linear2.bias"] = rnd(dim)
        if (i + 2) % 3 == 0:
            sd[p + "norm1.weight"] = 1 + rnd(dim)
            sd[p + "norm1.bias"] = rnd(dim)
            sd[p + "linear1.w"] = rnd(dim, hidden)  # (in, out)
            sd[p + "linear1.b"] = rnd(hidden)
            sd[p + "linear1.wfm.weight"] = rnd(dim // 4 + hidden // 4, dim, std=0.25)
            sd[p + "linear1.wfm.bias"] = rnd(dim // 4 + hidden // 4, std=0.25)
            sd[p + "linear1.w1"] = rnd(dim // 4, dim, std=0.15)
            sd[p + "linear1.w2"] = rnd(hidden // 4, hidden, std=0.15)
            sd[p + "dwc.w"] = rnd(dim, 1, 3, 3)
            sd[p + "dwc.b"] = rnd(dim)
            sd[p + "dwc.wfm.0.weight"] = rnd(dim, dim, 1, 1, std=0.06)
            sd[p + "dwc.wfm.0.bias"] = rnd(dim, std=0.06)
            sd[p + "dwc.wfm.2.weight"] = rnd(dim, dim, 1, 1, std=0.06)
        else:
            sd[p + "linear1.weight"] = rnd(hidden, dim)
            sd[p + "linear1.bias"] = rnd(hidden)
            sd[p + "dwc.weight"] = rnd(dim, 1, 3, 3)
            sd[p + "dwc.bias"] = rnd(dim)
    return sd


def release_forward(sd: dict[str, Tensor], images: Tensor, depth: int = 17) -> Tensor:
    """Logits of the released network, at every input size it accepts.

    The release's facts at other sizes: its timm 0.4.12 ``PatchEmbed`` checks the input against its
    configured square size and its stride-16 convolution drops the pixels past the last whole patch
    (232 px give 14×14 tokens); the blocks take the grid side as int(√N), so the grid must be
    square; the dynamic linear layer pools with ``AvgPool2d(2)``, which floors an odd side (its last
    row and column are not pooled) and fails on a side of 1; its scale divides by the full token
    count N = H·W, not the pooled count; the dynamic conv pools adaptively to 3×3, any size.
    """
    x = F.conv2d(images, sd["patch_embed.proj.weight"], sd["patch_embed.proj.bias"], stride=16)
    B, C, H, W = x.shape
    if H != W or H < 2:
        raise ValueError(f"the release does not run a {H}×{W} token grid (square, side >= 2 only)")
    x = x.flatten(2).transpose(1, 2)  # (B, N, C)
    x = F.layer_norm(x, (C,), sd["init_norm.weight"], sd["init_norm.bias"], EPS)
    N = H * W
    for i in range(depth):
        p = f"blocks.{i}."
        dynamic = (i + 2) % 3 == 0
        if dynamic:
            x = F.layer_norm(x, (C,), sd[p + "norm1.weight"], sd[p + "norm1.bias"], EPS)
        grid = x.transpose(1, 2).reshape(B, C, H, W)
        if dynamic:
            pooled = F.adaptive_avg_pool2d(grid, 3)
            k = F.conv2d(F.gelu(F.conv2d(pooled, sd[p + "dwc.wfm.0.weight"], sd[p + "dwc.wfm.0.bias"])),
                         sd[p + "dwc.wfm.2.weight"])  # (B, C, 3, 3)
            k = k / (k.flatten(2).norm(dim=-1)[..., None, None] + 1.0)
            conv = torch.stack([
                F.conv2d(grid[b:b + 1], (k[b] + sd[p + "dwc.w"][:, 0]).unsqueeze(1), sd[p + "dwc.b"],
                         padding=1, groups=C)[0]
                for b in range(B)
            ])
        else:
            conv = F.conv2d(grid, sd[p + "dwc.weight"], sd[p + "dwc.bias"], padding=1, groups=C)
        x = x + conv.flatten(2).transpose(1, 2)
        h = F.layer_norm(x, (C,), sd[p + "norm2.weight"], sd[p + "norm2.bias"], EPS)
        if dynamic:
            pooled = F.avg_pool2d(h.transpose(1, 2).reshape(B, C, H, W), 2).flatten(2).transpose(1, 2)
            proj = F.linear(pooled, sd[p + "linear1.wfm.weight"], sd[p + "linear1.wfm.bias"])
            r_in = sd[p + "linear1.w1"].shape[0]
            left = F.silu(proj[..., :r_in]) @ sd[p + "linear1.w1"]  # (B, N', C)
            right = F.silu(proj[..., r_in:]) @ sd[p + "linear1.w2"]  # (B, N', hidden)
            delta = torch.einsum("bnc,bno->bco", left, right) * C**-0.5 / N
            delta = delta / (delta.norm(dim=1, keepdim=True) + 1.0)
            h = torch.einsum("bnc,bco->bno", h, delta + sd[p + "linear1.w"]) + sd[p + "linear1.b"]
        else:
            h = F.linear(h, sd[p + "linear1.weight"], sd[p + "linear1.bias"])
        h = F.linear(F.gelu(h), sd[p + "linear2.weight"], sd[p + "linear2.bias"])
        x = x + h
    x = F.layer_norm(x, (C,), sd["norm.weight"], sd["norm.bias"], EPS)
    return F.linear(x.mean(dim=1), sd["head.weight"], sd["head.bias"])
