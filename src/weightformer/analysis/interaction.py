"""Do two distant parts of an image interact inside a model? A training-free test.

Take two glyphs A and B and a random placement (one near the left edge, one near the right, as in
the ``glyph_match`` probe), and the model's pooled features φ (``forward_head(..., pre_logits=True)``)
of the four images AA, AB, BA, BB (left glyph, right glyph). The cross term

    I = φ(AA) − φ(AB) − φ(BA) + φ(BB)

is zero for any model whose pooled features are a sum of one part that sees only the left glyph and
one that sees only the right: a stack of local convolutions whose receptive field spans less than
the gap, followed by average pooling, is such a model. Comparing two distant glyphs (the probe's
same/different) needs I ≠ 0. :func:`edge_interaction` returns the mean ‖I‖ over placements and
glyph pairs, relative to the mean size of the left glyph's own effect ‖φ(AA) − φ(BA)‖.
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
    """Mean ‖cross term‖ / mean ‖left-glyph effect‖ of the pooled features (see the module docstring).

    Images are normalised with ``mean``/``std`` (the probes') and repeated over the model's input
    channels. Returns ``{"interaction": ratio, "cross": mean ‖I‖, "left_effect": mean ‖φ(AA) − φ(BA)‖}``.
    """
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
