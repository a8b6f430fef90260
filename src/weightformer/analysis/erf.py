"""Effective receptive fields, as in the paper's ERF figure (after Luo et al., 2016, and RepLKNet).

M (H×W) = mean over images of |∂ Σ_c y[c, h/2, w/2] / ∂x| summed over input channels, normalised to sum to one,
where y is the last block's output (timm's ``forward_intermediates``, or ``features``). Read off M:
``outside_center``, its share outside the centred box of half the height and width, and ``radius_50`` /
``radius_90``, the distance from the centre token's centre (px) within which 50% / 90% of it lies.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..engine.errors import NonFiniteError

if TYPE_CHECKING:
    from torch import Tensor, nn

__all__ = ["ErfResult", "erf_map", "erf_stats", "last_feature_map", "token_center"]


def last_feature_map(model: nn.Module, images: Tensor) -> Tensor:
    """The last block's output as (B, C, h, w), through timm's ``forward_intermediates``."""
    if not hasattr(model, "forward_intermediates"):
        raise TypeError(f"{type(model).__name__} has no forward_intermediates; pass features=... to erf_map")
    return model.forward_intermediates(images, indices=1, intermediates_only=True)[-1]


def erf_map(model: nn.Module, images: Tensor, features: Callable[[nn.Module, Tensor], Tensor] | None = None,
            batch_size: int = 8) -> tuple[np.ndarray, tuple[float, float]]:
    """The normalised ERF map (H, W) of ``model`` over ``images`` (N, C, H, W) and the pixel (row, col) of the
    centre token's centre. ``features(model, x)`` gives the map (B, C, h, w) whose centre token is differentiated
    (default :func:`last_feature_map`). Eval mode, in batches (image i's centre token depends on image i only)."""
    import torch

    features = features or last_feature_map
    was_training = model.training
    model.eval()
    total = torch.zeros(images.shape[-2:], dtype=torch.float64)
    grid = (1, 1)
    try:
        for start in range(0, len(images), batch_size):
            x = images[start:start + batch_size].clone().requires_grad_(True)
            fmap = features(model, x)  # (B, C, h, w)
            h, w = grid = fmap.shape[-2:]
            fmap[:, :, h // 2, w // 2].sum().backward()
            total += x.grad.abs().sum(dim=(0, 1)).double()  # (H, W)
    finally:
        model.train(was_training)
    if total.sum() <= 0:
        raise ValueError("the centre token does not depend on the input at all (zero gradient)")
    return (total / total.sum()).numpy(), token_center(tuple(images.shape[-2:]), tuple(grid))


@dataclass
class ErfResult:
    """The numbers of one ERF map (see the module docstring)."""

    outside_center: float
    radius_50: float
    radius_90: float
    radius_50_rel: float  # radius / half the image diagonal
    radius_90_rel: float

    def as_dict(self) -> dict:
        return asdict(self)


def erf_stats(erf: np.ndarray, center: Sequence[float] | None = None) -> ErfResult:
    """The numbers of an ERF map (H, W); ``center``: (row, col) of the centre token's centre (default the image's)."""
    H, W = erf.shape
    if not erf.sum() > 0:  # no gradient reached the input (all zero), or one that is not a number
        raise NonFiniteError(f"the effective receptive field has no finite gradient mass (its sum is {erf.sum()}); "
                             f"no statistics are given from it")
    cy, cx = center if center is not None else ((H - 1) / 2, (W - 1) / 2)
    mass = erf / erf.sum()
    top, left = H // 4, W // 4
    inside = mass[top:top + H - 2 * (H // 4), left:left + W - 2 * (W // 4)].sum()  # half the side, centred
    rows, cols = np.mgrid[0:H, 0:W]
    dist = np.hypot(rows - cy, cols - cx).ravel()
    order = np.argsort(dist, kind="stable")
    cumulative = np.cumsum(mass.ravel()[order])
    half_diag = math.hypot(H, W) / 2

    def radius(q: float) -> float:
        # The 1e-9 absorbs rounding in the cumulative sum of an exactly-reached quantile.
        return float(dist[order][min(int(np.searchsorted(cumulative, q - 1e-9)), len(order) - 1)])

    r50, r90 = radius(0.5), radius(0.9)
    return ErfResult(float(1.0 - inside), r50, r90, r50 / half_diag, r90 / half_diag)


def token_center(img_size: tuple[int, int], grid: tuple[int, int]) -> tuple[float, float]:
    """Pixel (row, col) of the centre token's centre, for a (h, w) token grid tiling an (H, W) image."""
    (H, W), (h, w) = img_size, grid
    step_y, step_x = H // h, W // w
    return ((h // 2 + 0.5) * step_y - 0.5, (w // 2 + 0.5) * step_x - 0.5)
