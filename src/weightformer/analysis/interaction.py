"""Do two distant parts of an image interact inside a model? A training-free test.

For glyphs A, B near the left and right edges (as in ``glyph_match``) and pooled features φ, the cross term
I = φ(AA) − φ(AB) − φ(BA) + φ(BB) (left glyph, right glyph) is zero for any model whose pooled features sum a part
that sees only the left glyph and one that sees only the right (local convolutions narrower than the gap, then
average pooling); comparing the two glyphs needs I ≠ 0.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from ..data.probes import GLYPH_BANK, stamp_glyph

__all__ = ["edge_interaction", "four_images"]


def four_images(size: int, first: int, second: int, rng: np.random.Generator) -> np.ndarray:
    """AA, AB, BA, BB (left, right glyph) at one random placement, as (4, size, size) uint8."""
    scale = max(1, size // 32)
    box = 5 * scale
    margin = max(1, size // 16)
    rows = rng.integers(0, size - box + 1, 2)
    cols = (int(rng.integers(0, margin)), size - box - int(rng.integers(0, margin)))
    out = np.zeros((4, size, size), np.uint8)
    for k, (left, right) in enumerate(((first, first), (first, second), (second, first), (second, second))):
        stamp_glyph(out[k], GLYPH_BANK[left], int(rows[0]), cols[0], scale)
        stamp_glyph(out[k], GLYPH_BANK[right], int(rows[1]), cols[1], scale)
    return out


def _pooled_features(model: nn.Module, images: Tensor) -> Tensor:
    return model.forward_head(model.forward_features(images), pre_logits=True)


@torch.no_grad()
def edge_interaction(model: nn.Module, size: int, placements: int = 16, seed: int = 0, glyphs: int = 2,
                     mean: float = 0.05, std: float = 0.2) -> dict[str, float]:
    """``{"interaction": cross / left_effect, "cross": mean ‖I‖, "left_effect": mean ‖φ(AA) − φ(BA)‖}`` over
    ``placements`` random placements and glyph pairs, images normalised with the probes' ``mean``/``std``."""
    rng = np.random.default_rng(seed)
    in_chans = next(m for m in model.modules() if isinstance(m, nn.Conv2d)).in_channels
    was_training = model.training
    model.eval()
    cross, effect = [], []
    try:
        for _ in range(placements):
            first, second = rng.choice(glyphs, 2, replace=False)
            x = torch.from_numpy(four_images(size, int(first), int(second), rng)).float().div(255)
            x = ((x - mean) / std)[:, None].expand(-1, in_chans, -1, -1)  # (4, C, S, S)
            phi = _pooled_features(model, x)  # (4, D)
            cross.append(torch.linalg.vector_norm(phi[0] - phi[1] - phi[2] + phi[3]).item())
            effect.append(torch.linalg.vector_norm(phi[0] - phi[2]).item())
    finally:
        model.train(was_training)
    left_effect = float(np.mean(effect))
    return {"interaction": float(np.mean(cross)) / max(left_effect, 1e-12), "cross": float(np.mean(cross)),
            "left_effect": left_effect}
