"""Long-range reasoning probes: procedural grey-scale images whose label needs information from distant parts.

Each generator is deterministic in its seed and returns (N, S, S) uint8 images (0 background, 255 ink) and
(N,) int64 labels. The suite (:data:`SUITE`, docs/probes.md), six relations between distant parts:

- ``glyph_match``: two glyphs from a bank of 10 5×5 patterns (``glyphs``: the first k), near the left and the
  right edge; label 1 if they are the same glyph (half each).
- ``glyph_xor``: ``glyph_match`` with two glyph kinds, so that the label is the XOR of the two glyphs' kinds.
- ``count_compare``: 1 to ``max_count`` copies each of two glyph kinds A and B (never as many of each) scattered
  over the canvas; label 1 if there are more A than B. A and B have as many ink pixels, and the total count is
  drawn before the label splits it, so that total ink says nothing.
- ``path_link``: two curves that do not touch and two markers at least a quarter of the image apart; label 1
  if both markers end the same curve (a small "Pathfinder"). With ``ends="free"`` (the default, the images it
  always drew) the markers' distance differs between the classes, so that it alone predicts 60% of the labels
  at 64 px; ``ends="matched"`` draws only curve pairs whose four ends give both classes the same distances.
- ``mirror_match``: a glyph near the left edge and a mirrored one near the right; label 1 if the right one is
  the left one's left–right mirror image, 0 if it is another glyph's (no mirrored glyph is a bank glyph).
- ``scale_match``, held out (:data:`HELD_OUT`): two glyphs at opposite edges, one at twice the other's scale
  (the side at random); label 1 if they are the same glyph.

``glyph_count`` (1 to 4 copies of one glyph; label = count - 1) is a control outside the suite.

``scale`` is the pixels per glyph cell (or ``path_link``'s stroke width), by default :func:`default_scale`;
given explicitly it stays put, so a larger canvas draws the same glyphs farther apart (resolution transfer).
A range ``(lo, hi)`` draws each glyph's (each curve's) own scale. Every generator also takes the nuisance
options ``background`` (:data:`BACKGROUNDS`) and ``distractors`` (a count of glyphs of the 6 kinds of
:data:`DISTRACTOR_BANK`, which no relation uses, away from the relation's glyphs; for ``path_link``, unmarked
curve fragments that touch nothing). Nuisances come from their own random streams, drawn after the relation's:
at a fixed scale, adding a background or distractors leaves the labels and the relation's glyphs as they were
(``path_link``'s curves too, unless the fragments find no room and the curves are drawn anew). The defaults
draw the images these generators always drew.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from PIL import Image, ImageDraw

__all__ = ["BACKGROUNDS", "COUNT_KINDS", "DISTRACTOR_BANK", "GLYPH_BANK", "HELD_OUT", "PAIR_RELATIONS", "PATH_ENDS",
           "PROBES", "SUITE", "check_canvas", "count_compare", "default_scale", "glyph_count", "glyph_match", "glyph_xor",
           "mirror_match", "path_link", "scale_match", "stamp_glyph"]

Scale = int | tuple[int, int] | None

BACKGROUNDS = ("none", "noise", "texture", "clutter")
PATH_ENDS = ("free", "matched")  # path_link's ends=


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


# Drawn in sequence, so the first 10 of 16 are the 10 the relations always used; the last 6 are the distractors.
GLYPH_BANK, DISTRACTOR_BANK = np.split(_glyph_bank(16), [10])  # (10, 5, 5), (6, 5, 5) bool

COUNT_KINDS = (0, 2)  # count_compare's A and B: bank glyphs with 12 ink pixels each


def default_scale(size: int) -> int:
    """Pixels per glyph cell (the stroke width of ``path_link``) when none is given: 2 at 64 px, 1 at 32 px."""
    return max(1, size // 32)


def _scale_range(size: int, scale: Scale) -> tuple[int, int]:
    """The smallest and largest pixels per glyph cell of ``scale``: an int, a range (lo, hi), or None (the default)."""
    if scale is None:
        return default_scale(size), default_scale(size)
    if isinstance(scale, (int, np.integer)):
        if scale < 1:
            raise ValueError(f"scale must be at least 1, got {scale}")
        return int(scale), int(scale)
    if not (isinstance(scale, tuple) and len(scale) == 2 and all(isinstance(v, (int, np.integer)) for v in scale)
            and 1 <= scale[0] <= scale[1]):
        raise ValueError(f"scale must be an int or a range (lo, hi) with 1 <= lo <= hi, got {scale!r}; "
                         f"e.g. scale=(2, 3)")
    return int(scale[0]), int(scale[1])


def _margin(size: int) -> int:
    """The band, at each side edge, in which the outer edge of a pair relation's glyph lies."""
    return max(1, size // 16)


# The widths of a pair relation's two glyphs in cells of the largest scale (scale_match's larger one on either side).
_PAIR_CELLS = {"glyph_match": (5, 5), "glyph_xor": (5, 5), "mirror_match": (5, 5), "scale_match": (5, 10)}
PAIR_RELATIONS = tuple(_PAIR_CELLS)  # two glyphs, each with its outer edge in the band at its side edge


def _between_slots(size: int, near: int, far: int, hi: int) -> int:
    """Distractor slots that fit between a pair's glyphs (``near``, ``far`` px wide) when both lie farthest in."""
    width = size - 2 * (_margin(size) - 1) - near - far - hi
    return max(0, width // (6 * hi)) * (size // (6 * hi))


def _distractor_room(probe: str, size: int, hi: int, max_count: int) -> int:
    """How many distractors ``probe`` always has room for at ``size`` px with glyph cells up to ``hi`` px."""
    if probe in _PAIR_CELLS:
        near, far = (cells * hi for cells in _PAIR_CELLS[probe])
        return _between_slots(size, near, far, hi)
    if probe in ("glyph_count", "count_compare"):  # the lattice's slots that the counted glyphs leave
        return (size // (6 * hi)) ** 2 - (max_count if probe == "glyph_count" else 2 * max_count - 1)
    if probe == "path_link":  # curves' ink and the canvas's room both grow with size / stroke width
        return size // (8 * hi)
    return 0


def check_canvas(probe: str, size: int, scale: Scale = None, max_count: int = 4, *, distractors: int = 0,
                 background: str = "none") -> None:
    """Raise ValueError (one line) unless ``probe`` can draw at ``size`` px with these options (scale None: its
    default)."""
    if background not in BACKGROUNDS:
        raise ValueError(f"background must be one of {', '.join(BACKGROUNDS)}, got {background!r}")
    if isinstance(distractors, bool) or not isinstance(distractors, (int, np.integer)) or distractors < 0:
        raise ValueError(f"distractors must be a count (an int of at least 0), got {distractors!r}")
    lo, hi = _scale_range(size, scale)
    shown = str(hi) if lo == hi else f"{lo}-{hi}"
    box = 5 * hi
    if probe in _PAIR_CELLS:
        near, far = (cells * hi for cells in _PAIR_CELLS[probe])
        margin = _margin(size)
        glyphs = f"two {box} px glyphs" if near == far else f"a {near} and a {far} px glyph"
        if near + far + 2 * margin > size:
            raise ValueError(f"{probe} cannot draw {glyphs} (scale {shown}) with their {margin} px edge bands apart "
                             f"on a {size} px canvas; use size >= {near + far + 2 * margin} or a smaller scale")
    if probe == "count_compare" and max_count < 2:
        raise ValueError(f"count_compare needs max_count >= 2 (two counts from 1 that differ), got {max_count}")
    if probe in ("glyph_count", "count_compare"):
        glyphs = max_count if probe == "glyph_count" else 2 * max_count - 1
        if (size // (box + hi)) ** 2 < glyphs:
            raise ValueError(f"{probe} cannot place {glyphs} {box} px glyphs (scale {shown}) apart on a {size} px "
                             f"canvas; use size >= {(box + hi) * int(np.ceil(np.sqrt(glyphs)))} or a smaller scale")
    if probe == "path_link" and 4 * hi > size // 4:
        raise ValueError(f"path_link cannot draw {hi} px strokes on a {size} px canvas; use size >= {16 * hi}")
    room = _distractor_room(probe, size, hi, max_count)
    if distractors > room:
        # The default scale grows with the size, so only a fixed one gains room on a larger canvas.
        larger = next((s for s in range(size + 1, 8 * size)
                       if _distractor_room(probe, s, _scale_range(s, scale)[1], max_count) >= distractors), None)
        fix = (f" or size >= {larger}" if larger else
               " or a fixed scale (scale=INT) on a larger canvas" if scale is None else "")
        raise ValueError(f"{probe} has room for {room} distractors (scale {shown}) on a {size} px canvas, not "
                         f"{distractors}; use distractors <= {room}{fix}")


def stamp_glyph(image: np.ndarray, glyph: np.ndarray, top: int, left: int, scale: int) -> None:
    block = np.kron(glyph, np.ones((scale, scale), dtype=bool))
    h, w = block.shape
    image[top:top + h, left:left + w][block] = 255


def _balanced(rng: np.random.Generator, num: int) -> np.ndarray:
    """Binary labels, half each (one more 0 for odd ``num``), in random order: (N,) int64."""
    labels = (np.arange(num) % 2).astype(np.int64)
    rng.shuffle(labels)
    return labels


def _lattice(height: int, width: int, pitch: int, left: int = 0) -> np.ndarray:
    """Top-left corners of ``pitch`` px slots filling ``height`` × ``width`` px from column ``left``, row by row."""
    rows, cols = np.mgrid[0:height // pitch, 0:width // pitch]  # (r, c) each
    return np.stack([rows.ravel() * pitch, left + cols.ravel() * pitch], axis=1)  # (r·c, 2)


def _grow(mask: np.ndarray, reach: int) -> np.ndarray:
    """``mask`` (S, S) grown by ``reach`` pixels: a square max filter, as rows then columns."""
    window = 2 * reach + 1
    rows = sliding_window_view(np.pad(mask, reach), window, axis=1).any(-1)  # (S + 2·reach, S)
    return sliding_window_view(rows, window, axis=0).any(-1)  # (S, S)


# ---------------------------------------------------------------------------------------------------------------------
# Nuisances: per-glyph scales, distractors and backgrounds, each from the generator's nuisance streams
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class _Nuisance:
    """A generator's nuisance options and their random streams, apart from the relation's own stream."""

    lo: int  # the range of pixels per glyph cell (stroke widths)
    hi: int
    distractors: int
    background: str
    rng: np.random.Generator  # scales, places in a slot, distractors
    painter: np.random.Generator  # backgrounds: the same draws for every image, so they cannot follow its label

    @classmethod
    def of(cls, seed: int, stream: int, size: int, scale: Scale, distractors: int, background: str) -> _Nuisance:
        return cls(*_scale_range(size, scale), distractors, background,
                   np.random.default_rng([seed, stream, 1]), np.random.default_rng([seed, stream, 2]))

    def scale(self) -> int:
        """One glyph's (one curve's) pixels per cell."""
        return int(self.rng.integers(self.lo, self.hi + 1))

    def stamp_in_slot(self, image: np.ndarray, glyph: np.ndarray, corner: np.ndarray) -> None:
        """``glyph`` at its own scale in the slot at ``corner`` (a largest glyph and a largest cell wide), placed at
        random within the room a smaller glyph leaves, so that glyphs in different slots never touch."""
        scale = self.scale()
        top, left = corner + self.rng.integers(0, 5 * (self.hi - scale) + 1, 2)
        stamp_glyph(image, glyph, int(top), int(left), scale)

    def distract(self, image: np.ndarray, corners: np.ndarray) -> None:
        """Distractor glyphs in ``distractors`` of the free slots at ``corners`` (n, 2)."""
        for corner in corners[self.rng.choice(len(corners), self.distractors, replace=False)]:
            self.stamp_in_slot(image, DISTRACTOR_BANK[int(self.rng.integers(len(DISTRACTOR_BANK)))], corner)

    def fragments(self, ink: np.ndarray, reach: int, tries: int = 50) -> np.ndarray | None:
        """``ink`` with ``distractors`` unmarked 3-step curves that stay ``reach`` px from all other ink, or None
        when one finds no room in ``tries`` draws."""
        size = ink.shape[0]
        for _ in range(self.distractors):
            near = _grow(ink, reach)
            for _ in range(tries):
                piece = _draw(size, _curve(self.rng, size, 3), self.scale(), (False, False))
                if not (piece & near).any():
                    ink = ink | piece
                    break
            else:
                return None
        return ink

    def paint(self, image: np.ndarray, clearance: int) -> None:
        """Lay the background under ``image``'s ink, in place; clutter keeps ``clearance`` px from it."""
        size, cell = image.shape[0], self.lo
        if self.background == "noise":
            layer = np.clip(self.painter.normal(40.0, 30.0, (size, size)), 0, 150)  # below ink, which stays 255
        elif self.background == "texture":
            layer = _gratings(self.painter, size, cell)
        elif self.background == "clutter":
            layer = _clutter(self.painter, image > 0, cell, clearance) * 255.0
        else:
            return
        np.maximum(image, np.rint(layer).astype(np.uint8), out=image)


def _gratings(rng: np.random.Generator, size: int, cell: int, waves: int = 3) -> np.ndarray:
    """A smooth pattern in [0, 96]: the mean of ``waves`` gratings of random 6-16 cell periods, angles and phases."""
    period = rng.uniform(6, 16, waves)[:, None, None] * cell  # (W, 1, 1) px
    angle = rng.uniform(0, np.pi, waves)[:, None, None]
    phase = rng.uniform(0, 2 * np.pi, waves)[:, None, None]
    y, x = np.mgrid[0:size, 0:size]  # (S, S) each
    wave = np.cos(2 * np.pi * (x * np.cos(angle) + y * np.sin(angle)) / period + phase)  # (W, S, S)
    return 48.0 * (1.0 + wave.mean(axis=0))


def _clutter(rng: np.random.Generator, ink: np.ndarray, cell: int, clearance: int) -> np.ndarray:
    """Dots of one cell and strokes of 1-4 cells, one cell wide, one per 12×12 cells (the same density at every
    size), each kept only if it stays ``clearance`` px from ``ink``: a (S, S) bool mask."""
    size = ink.shape[0]
    count = max(1, round(size * size / (12 * cell) ** 2))
    centres = rng.uniform(0, size, (count, 2))
    angles = rng.uniform(0, np.pi, count)
    lengths = rng.integers(0, 5, count) * cell  # 0: a dot
    near = _grow(ink, clearance)
    out = np.zeros_like(ink)
    for (x, y), angle, length in zip(centres, angles, lengths):
        item = Image.new("L", (size, size), 0)
        draw = ImageDraw.Draw(item)
        if length:
            dx, dy = length / 2 * np.cos(angle), length / 2 * np.sin(angle)
            draw.line([(x - dx, y - dy), (x + dx, y + dy)], fill=255, width=cell)
        else:
            draw.rectangle([int(x), int(y), int(x) + cell - 1, int(y) + cell - 1], fill=255)
        mask = np.asarray(item) > 0
        if not (mask & near).any():
            out |= mask
    return out


# ---------------------------------------------------------------------------------------------------------------------
# Glyph relations
# ---------------------------------------------------------------------------------------------------------------------


def _pair_image(rng: np.random.Generator, nuisance: _Nuisance, image: np.ndarray, left: np.ndarray,
                right: np.ndarray, scales: tuple[int, int]) -> None:
    """``left`` and ``right`` (5×5 glyphs at ``scales``) with their outer edges in the side bands, distractors in
    the slots between them, then the background."""
    size = image.shape[0]
    margin = _margin(size)  # each glyph's outer edge lies within this band of its image edge
    near, far = 5 * scales[0], 5 * scales[1]
    first_top = int(rng.integers(0, size - near + 1))
    first_col = int(rng.integers(0, margin))
    stamp_glyph(image, left, first_top, first_col, scales[0])
    second_col = size - far - int(rng.integers(0, margin))
    stamp_glyph(image, right, int(rng.integers(0, size - far + 1)), second_col, scales[1])
    start = first_col + near + nuisance.hi  # one largest cell clear of the left glyph
    nuisance.distract(image, _lattice(size, second_col - start, 6 * nuisance.hi, left=start))
    nuisance.paint(image, nuisance.hi)


# One pair's left glyph, right glyph and their scales, from the kinds ``first`` and ``second`` (the same for label 1).
PairDrawing = Callable[[np.random.Generator, "_Nuisance", int, int], tuple[np.ndarray, np.ndarray, tuple[int, int]]]


def _pair_relation(probe: str, stream: int, num: int, size: int, seed: int, scale: Scale, background: str,
                   distractors: int, kinds: int, drawing: PairDrawing) -> tuple[np.ndarray, np.ndarray]:
    """A pair relation's images and labels: per image a kind, the same or another one by the label, and the two
    glyphs ``drawing`` makes of them at the two side edges."""
    check_canvas(probe, size, scale, distractors=distractors, background=background)
    rng = np.random.default_rng([seed, stream])
    nuisance = _Nuisance.of(seed, stream, size, scale, distractors, background)
    images = np.zeros((num, size, size), np.uint8)
    labels = _balanced(rng, num)
    for i in range(num):
        first = int(rng.integers(kinds))
        second = first if labels[i] else int((first + rng.integers(1, kinds)) % kinds)
        _pair_image(rng, nuisance, images[i], *drawing(rng, nuisance, first, second))
    return images, labels


def glyph_match(num: int, size: int = 64, seed: int = 0, glyphs: int = 10, scale: Scale = None, *,
                background: str = "none", distractors: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two glyphs at opposite edges, from the first ``glyphs`` of the bank: 1 if they are the same glyph, else 0."""
    if not 2 <= glyphs <= len(GLYPH_BANK):
        raise ValueError(f"glyphs must be 2 to {len(GLYPH_BANK)}, got {glyphs}")
    return _pair_relation("glyph_match", 1, num, size, seed, scale, background, distractors, glyphs,
                          lambda rng, nuisance, first, second: (GLYPH_BANK[first], GLYPH_BANK[second],
                                                                (nuisance.scale(), nuisance.scale())))


def glyph_xor(num: int, size: int = 64, seed: int = 0, *, scale: Scale = None, background: str = "none",
              distractors: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``glyph_match`` with two glyph kinds: the label is 1 - (kind of left XOR kind of right)."""
    return glyph_match(num, size, seed, glyphs=2, scale=scale, background=background, distractors=distractors)


def mirror_match(num: int, size: int = 64, seed: int = 0, *, scale: Scale = None, background: str = "none",
                 distractors: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A bank glyph at the left edge, a mirrored bank glyph at the right: 1 if it is the left one mirrored, else 0.

    No glyph's mirror image is a bank glyph (each differs from every bank glyph in 6+ pixels), so both classes
    show a plain glyph left and a mirrored one right, and a negative is never a mirror of the left glyph."""
    return _pair_relation("mirror_match", 5, num, size, seed, scale, background, distractors, len(GLYPH_BANK),
                          lambda rng, nuisance, first, second: (GLYPH_BANK[first], GLYPH_BANK[second][:, ::-1],
                                                                (nuisance.scale(), nuisance.scale())))


def _scaled_pair(rng: np.random.Generator, nuisance: _Nuisance, first: int,
                 second: int) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    small = nuisance.scale()
    return GLYPH_BANK[first], GLYPH_BANK[second], (2 * small, small) if rng.integers(2) else (small, 2 * small)


def scale_match(num: int, size: int = 64, seed: int = 0, *, scale: Scale = None, background: str = "none",
                distractors: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two bank glyphs at opposite edges, one at a scale s and one at 2s (the side at random): 1 if the same glyph.

    The held-out relation of the suite: report it last, as a test not tuned to."""
    return _pair_relation("scale_match", 6, num, size, seed, scale, background, distractors, len(GLYPH_BANK),
                          _scaled_pair)


def glyph_count(num: int, size: int = 64, seed: int = 0, glyphs: int = 10, max_count: int = 4,
                scale: Scale = None, *, background: str = "none", distractors: int = 0
                ) -> tuple[np.ndarray, np.ndarray]:
    """1 to ``max_count`` non-touching copies of one random glyph; label = count - 1."""
    check_canvas("glyph_count", size, scale, max_count, distractors=distractors, background=background)
    rng = np.random.default_rng([seed, 2])
    nuisance = _Nuisance.of(seed, 2, size, scale, distractors, background)
    slots = _lattice(size, size, 6 * nuisance.hi)  # slots a largest glyph and cell wide, so copies never touch
    images = np.zeros((num, size, size), np.uint8)
    labels = rng.integers(0, max_count, num).astype(np.int64)
    for i in range(num):
        glyph = GLYPH_BANK[int(rng.integers(glyphs))]
        chosen = rng.choice(len(slots), int(labels[i]) + 1, replace=False)
        for corner in slots[chosen]:
            nuisance.stamp_in_slot(images[i], glyph, corner)
        nuisance.distract(images[i], np.delete(slots, chosen, axis=0))
        nuisance.paint(images[i], nuisance.hi)
    return images, labels


def count_compare(num: int, size: int = 64, seed: int = 0, *, max_count: int = 4, scale: Scale = None,
                  background: str = "none", distractors: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Copies of glyphs A and B (:data:`COUNT_KINDS`), 1 to ``max_count`` of each and never as many, scattered
    apart over the canvas: 1 if there are more A than B, else 0.

    The total is drawn first (3 to 2·max_count - 1, each splits into two unequal counts either way) and the
    label then says which kind has the larger part, so the counts of the two classes mirror each other and
    the total ink, with A and B of 12 pixels each, is no cue."""
    check_canvas("count_compare", size, scale, max_count, distractors=distractors, background=background)
    rng = np.random.default_rng([seed, 4])
    nuisance = _Nuisance.of(seed, 4, size, scale, distractors, background)
    slots = _lattice(size, size, 6 * nuisance.hi)  # as glyph_count's: copies never touch
    images = np.zeros((num, size, size), np.uint8)
    labels = _balanced(rng, num)
    for i in range(num):
        total = int(rng.integers(3, 2 * max_count))
        larger = int(rng.integers(max(total // 2 + 1, total - max_count), min(max_count, total - 1) + 1))
        counts = (larger, total - larger) if labels[i] else (total - larger, larger)  # (A, B)
        chosen = rng.choice(len(slots), total, replace=False)
        for corner, kind in zip(slots[chosen], np.repeat(COUNT_KINDS, counts)):
            nuisance.stamp_in_slot(images[i], GLYPH_BANK[kind], corner)
        nuisance.distract(images[i], np.delete(slots, chosen, axis=0))
        nuisance.paint(images[i], nuisance.hi)
    return images, labels


# ---------------------------------------------------------------------------------------------------------------------
# Paths
# ---------------------------------------------------------------------------------------------------------------------


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


def _ends_match(first: list[tuple[float, float]], second: list[tuple[float, float]], size: int) -> bool:
    """Whether the curves' ends A, B (first) and C, D (second) give both classes the same distances, within
    size / 16: |AB| ≈ |AD| (the marked pair of class 1 and of class 0) and |CD| ≈ |BC| (the unmarked pairs). Then
    the six distances between ends split into marked, unmarked and mixed pairs alike in both classes."""
    (a, b), (c, d) = (first[0], first[-1]), (second[0], second[-1])
    ab, ad, cd, bc = (math.dist(p, q) for p, q in ((a, b), (a, d), (c, d), (b, c)))
    return min(ab, ad) >= size / 4 and abs(ab - ad) <= size / 16 and abs(cd - bc) <= size / 16


def _namings(first: list[tuple[float, float]], second: list[tuple[float, float]]):
    """The two curves as (first, second) in both orders, each forwards and backwards: 8 pairs."""
    for p, q in ((first, second), (second, first)):
        for p_dir in (p, p[::-1]):
            for q_dir in (q, q[::-1]):
                yield p_dir, q_dir


def path_link(num: int, size: int = 64, seed: int = 0, scale: Scale = None, *, background: str = "none",
              distractors: int = 0, ends: str = "free") -> tuple[np.ndarray, np.ndarray]:
    """Two non-touching curves and two markers: 1 if the markers end the same curve, else 0. The distractors are
    unmarked curve fragments that touch nothing, so they never join or part the marked ends. ``ends``: ``free``
    keeps only the markers a quarter of the side apart, ``matched`` draws only curve pairs that give both classes
    the same distances between ends (:func:`_ends_match`), so that no distance tells the classes apart."""
    if ends not in PATH_ENDS:
        raise ValueError(f"ends must be one of {', '.join(PATH_ENDS)}, got {ends!r}")
    check_canvas("path_link", size, scale, distractors=distractors, background=background)
    rng = np.random.default_rng([seed, 3])
    nuisance = _Nuisance.of(seed, 3, size, scale, distractors, background)
    reach = nuisance.hi + 1  # curves stay at least this many pixels apart
    images = np.zeros((num, size, size), np.uint8)
    labels = _balanced(rng, num)
    for i in range(num):
        widths = nuisance.scale(), nuisance.scale()
        while True:
            first, second = _curve(rng, size, 8), _curve(rng, size, 8)
            markers = ((True, True), (False, False)) if labels[i] else ((True, False), (False, True))
            if ends == "matched":
                # the first of the 8 namings of the four ends (which curve is first, each one's direction) that
                # matches; the label was drawn before the curves, so it does not depend on which
                named = next(((p, q) for p, q in _namings(first, second) if _ends_match(p, q, size)), None)
                if named is None:
                    continue
                first, second = named
            else:
                marked = (first[0], first[-1]) if labels[i] else (first[0], second[-1])
                if np.hypot(marked[0][0] - marked[1][0], marked[0][1] - marked[1][1]) < size / 4:
                    continue  # markers far apart, so the answer is never read off one spot
            a = _draw(size, first, widths[0], markers[0])
            b = _draw(size, second, widths[1], markers[1])
            if _touches(a, b, reach):
                continue
            ink = nuisance.fragments(a | b, reach)
            if ink is not None:  # else no room for the fragments: draw the curves anew
                break
        images[i] = ink * np.uint8(255)
        nuisance.paint(images[i], reach)
    return images, labels


def _touches(a: np.ndarray, b: np.ndarray, reach: int) -> bool:
    """Whether mask ``a`` grown by ``reach`` pixels (a square max filter) meets mask ``b``."""
    return bool((_grow(a, reach) & b).any())


# name -> (generator(num, size, seed, **options), number of classes)
PROBES: dict[str, tuple[Callable[..., tuple[np.ndarray, np.ndarray]], int]] = {
    "glyph_match": (glyph_match, 2),
    "glyph_count": (glyph_count, 4),
    "path_link": (path_link, 2),
    "glyph_xor": (glyph_xor, 2),
    "count_compare": (count_compare, 2),
    "mirror_match": (mirror_match, 2),
    "scale_match": (scale_match, 2),
}

SUITE = ("glyph_match", "glyph_xor", "count_compare", "path_link", "mirror_match", "scale_match")  # report order
HELD_OUT = ("scale_match",)  # not tuned to: reported last
