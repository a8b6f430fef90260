"""Long-range reasoning probes: procedural grey-scale images whose label needs information from distant parts.

Each generator is deterministic in its seed and returns (N, S, S) uint8 images (0 background, 255 ink) and
(N,) int64 labels:

- ``glyph_match``: two glyphs from a bank of 10 5×5 patterns (``glyphs``: the first k), near the left and the
  right edge; label 1 if they are the same glyph (half each).
- ``glyph_count``: 1 to 4 copies of a glyph scattered without overlap; label = count - 1 (a control).
- ``path_link``: two curves that do not touch and two markers at least a quarter of the image apart; label 1
  if both markers end the same curve (a small "Pathfinder").

``scale`` is the pixels per glyph cell (or ``path_link``'s stroke width), by default :func:`default_scale`;
given explicitly it stays put, so a larger canvas draws the same glyphs farther apart (resolution transfer).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

__all__ = ["GLYPH_BANK", "PROBES", "check_canvas", "default_scale", "glyph_count", "glyph_match", "path_link", "stamp_glyph"]


def _glyph_bank(count: int = 10, side: int = 5) -> np.ndarray:
    """``count`` fixed 5×5 bit patterns, 8-16 pixels on, differing pairwise in 6+ pixels, spanning their box."""
    rng = np.random.default_rng(20261130)
    bank: list[np.ndarray] = []
    while len(bank) < count:
        glyph = rng.random((side, side)) < 0.5
        on = int(glyph.sum())
        spans = glyph[0].any() and glyph[-1].any() and glyph[:, 0].any() and glyph[:, -1].any()
        if 8 <= on <= 16 and spans and all(int((glyph != other).sum()) >= 6 for other in bank):
            bank.append(glyph)
    return np.stack(bank)  # (count, 5, 5) bool


GLYPH_BANK = _glyph_bank()


def default_scale(size: int) -> int:
    """Pixels per glyph cell (the stroke width of ``path_link``) when none is given: 2 at 64 px, 1 at 32 px."""
    return max(1, size // 32)


def check_canvas(probe: str, size: int, scale: int | None = None, max_count: int = 4) -> None:
    """Raise ValueError (one line) unless ``probe`` can draw at ``size`` px with ``scale`` (None: the default)."""
    scale = default_scale(size) if scale is None else scale
    if scale < 1:
        raise ValueError(f"scale must be at least 1, got {scale}")
    box = 5 * scale
    if probe == "glyph_match" and 2 * (box + _margin(size)) > size:
        raise ValueError(f"glyph_match cannot draw two {box} px glyphs (scale {scale}) with their {_margin(size)} px "
                         f"edge bands apart on a {size} px canvas; use size >= {2 * (box + _margin(size))} or a smaller scale")
    if probe == "glyph_count" and (size // (box + scale)) ** 2 < max_count:
        raise ValueError(f"glyph_count cannot place {max_count} {box} px glyphs (scale {scale}) apart on a {size} px "
                         f"canvas; use size >= {2 * (box + scale)} or a smaller scale")
    if probe == "path_link" and 4 * scale > size // 4:
        raise ValueError(f"path_link cannot draw {scale} px strokes on a {size} px canvas; use size >= {16 * scale}")


def _margin(size: int) -> int:
    """The band, at each side edge, in which a glyph_match glyph's outer edge lies."""
    return max(1, size // 16)


def stamp_glyph(image: np.ndarray, glyph: np.ndarray, top: int, left: int, scale: int) -> None:
    block = np.kron(glyph, np.ones((scale, scale), dtype=bool))
    h, w = block.shape
    image[top:top + h, left:left + w][block] = 255


def glyph_match(num: int, size: int = 64, seed: int = 0, glyphs: int = 10, scale: int | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """Two glyphs at opposite edges, from the first ``glyphs`` of the bank: 1 if they are the same glyph, else 0."""
    check_canvas("glyph_match", size, scale)
    rng = np.random.default_rng([seed, 1])
    scale = default_scale(size) if scale is None else scale
    box = 5 * scale
    margin = _margin(size)  # each glyph's outer edge lies within this band of its image edge
    images = np.zeros((num, size, size), np.uint8)
    labels = (np.arange(num) % 2).astype(np.int64)
    rng.shuffle(labels)
    if not 2 <= glyphs <= len(GLYPH_BANK):
        raise ValueError(f"glyphs must be 2 to {len(GLYPH_BANK)}, got {glyphs}")
    for i in range(num):
        first = int(rng.integers(glyphs))
        second = first if labels[i] else int((first + rng.integers(1, glyphs)) % glyphs)
        stamp_glyph(images[i], GLYPH_BANK[first], int(rng.integers(0, size - box + 1)), int(rng.integers(0, margin)), scale)
        right = size - box - int(rng.integers(0, margin))
        stamp_glyph(images[i], GLYPH_BANK[second], int(rng.integers(0, size - box + 1)), right, scale)
    return images, labels


def glyph_count(num: int, size: int = 64, seed: int = 0, glyphs: int = 10, max_count: int = 4,
                scale: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """1 to ``max_count`` non-touching copies of one random glyph; label = count - 1."""
    check_canvas("glyph_count", size, scale, max_count)
    rng = np.random.default_rng([seed, 2])
    scale = default_scale(size) if scale is None else scale
    box = 5 * scale
    cells = size // (box + scale)  # a grid of slots one cell apart, so copies never touch
    images = np.zeros((num, size, size), np.uint8)
    labels = rng.integers(0, max_count, num).astype(np.int64)
    for i in range(num):
        glyph = GLYPH_BANK[int(rng.integers(glyphs))]
        for slot in rng.choice(cells * cells, int(labels[i]) + 1, replace=False):
            row, col = divmod(int(slot), cells)
            stamp_glyph(images[i], glyph, row * (box + scale), col * (box + scale), scale)
    return images, labels


def _curve(rng: np.random.Generator, size: int, steps: int) -> list[tuple[float, float]]:
    """A smooth random walk inside the image: heading turns by small random angles."""
    pad = size * 0.08
    x, y = rng.uniform(pad, size - pad, 2)
    heading = rng.uniform(0, 2 * np.pi)
    step = size / 10
    points = [(float(x), float(y))]
    for _ in range(steps):
        heading += rng.normal(0, 0.6)
        nx, ny = x + step * np.cos(heading), y + step * np.sin(heading)
        if not (pad <= nx <= size - pad and pad <= ny <= size - pad):
            heading += np.pi  # bounce off the border
            nx, ny = x + step * np.cos(heading), y + step * np.sin(heading)
        x, y = nx, ny
        points.append((float(x), float(y)))
    return points


def _draw(size: int, points: list[tuple[float, float]], width: int, marker_ends: tuple[bool, bool]) -> np.ndarray:
    image = Image.new("L", (size, size), 0)
    draw = ImageDraw.Draw(image)
    draw.line(points, fill=255, width=width)
    half = width + 1
    for end, on in zip((points[0], points[-1]), marker_ends):
        if on:
            draw.rectangle([end[0] - half, end[1] - half, end[0] + half, end[1] + half], fill=255)
    return np.asarray(image) > 0


def path_link(num: int, size: int = 64, seed: int = 0, scale: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Two non-touching curves and two markers: 1 if the markers end the same curve, else 0."""
    check_canvas("path_link", size, scale)
    rng = np.random.default_rng([seed, 3])
    width = default_scale(size) if scale is None else scale
    reach = width + 1  # curves stay at least this many pixels apart
    images = np.zeros((num, size, size), np.uint8)
    labels = (np.arange(num) % 2).astype(np.int64)
    rng.shuffle(labels)
    for i in range(num):
        while True:
            first, second = _curve(rng, size, 8), _curve(rng, size, 8)
            markers = ((True, True), (False, False)) if labels[i] else ((True, False), (False, True))
            ends = (first[0], first[-1]) if labels[i] else (first[0], second[-1])
            if np.hypot(ends[0][0] - ends[1][0], ends[0][1] - ends[1][1]) < size / 4:
                continue  # markers far apart, so the answer is never read off one spot
            a = _draw(size, first, width, markers[0])
            b = _draw(size, second, width, markers[1])
            if not _touches(a, b, reach):
                break
        images[i] = (a | b) * np.uint8(255)
    return images, labels


def _touches(a: np.ndarray, b: np.ndarray, reach: int) -> bool:
    """Whether mask ``a`` grown by ``reach`` pixels (a square max filter) meets mask ``b``."""
    grown = Image.fromarray(a.astype(np.uint8) * 255).filter(ImageFilter.MaxFilter(2 * reach + 1))
    return bool(((np.asarray(grown) > 0) & b).any())


# name -> (generator(num, size, seed), number of classes)
PROBES: dict[str, tuple[Callable[..., tuple[np.ndarray, np.ndarray]], int]] = {
    "glyph_match": (glyph_match, 2),
    "glyph_count": (glyph_count, 4),
    "path_link": (path_link, 2),
}
