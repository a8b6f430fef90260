"""``shapes``: a small segmentation data set drawn procedurally (a pure function of its seed and sizes), so a
first run needs no download: 64-96 px grainy greyish gradients with 1 to 4 circles, squares and triangles, each
class's colour from its own hue band, annotated in the ADE20K layout as

    0 unlabelled (a 1 px ring on each shape's edge)   1 background   2 circle   3 square   4 triangle
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from ..data.errors import DataError
from ..engine.errors import resource_error

__all__ = ["SHAPES_CLASSES", "SHAPES_NAME", "draw_sample", "shapes_root", "write_shapes"]

SHAPES_NAME = "shapes"  # the --data name that selects this set
SHAPES_CLASSES = ("background", "circle", "square", "triangle")  # after reduce-zero-label: class c is value c + 1
VERSION = "seg-shapes-v2"  # the cache folder; bump it when the drawing changes
TRAIN_IMAGES, VAL_IMAGES, SEED = 200, 50, 0
UNLABELLED, BACKGROUND, CIRCLE, SQUARE, TRIANGLE = 0, 1, 2, 3, 4

HUE_BANDS = {CIRCLE: (-0.05, 0.17), SQUARE: (0.22, 0.5), TRIANGLE: (0.58, 0.9)}  # HSV hue, 1.0 = 360 degrees


def _greyish(rng: np.random.Generator) -> np.ndarray:  # a low-saturation colour, (3,) floats in [0, 255]
    grey = rng.uniform(40, 215)
    return np.clip(grey + rng.normal(0, 20, 3), 0, 255)


def _background(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """(H, W, 3) float: a linear gradient between two greyish colours plus Gaussian grain."""
    start, end = _greyish(rng), _greyish(rng)
    angle = rng.uniform(0, 2 * np.pi)
    ys, xs = np.mgrid[0:height, 0:width]
    t = (np.cos(angle) * xs / width + np.sin(angle) * ys / height)[..., None]  # (H, W, 1)
    t = (t - t.min()) / max(float(t.max() - t.min()), 1e-6)
    return start + t * (end - start) + rng.normal(0, 18, (height, width, 3))


def draw_sample(rng: np.random.Generator) -> tuple[Image.Image, Image.Image]:
    """One (RGB image, L annotation) pair of the same random size."""
    height, width = (int(v) for v in rng.integers(64, 97, 2))
    pixels = _background(rng, height, width)  # (H, W, 3)
    colour_layer = Image.new("RGB", (width, height))
    mask_layer = Image.new("L", (width, height), 0)  # 255 where a shape was drawn
    label = Image.new("L", (width, height), BACKGROUND)
    image_draw, mask_draw, label_draw = ImageDraw.Draw(colour_layer), ImageDraw.Draw(mask_layer), ImageDraw.Draw(label)
    for _ in range(int(rng.integers(1, 5))):
        kind = int(rng.choice([CIRCLE, SQUARE, TRIANGLE]))
        r = rng.uniform(0.12, 0.3) * min(height, width)
        cx, cy = rng.uniform(r * 0.5, width - r * 0.5), rng.uniform(r * 0.5, height - r * 0.5)
        hue, saturation, value = rng.uniform(*HUE_BANDS[kind]) % 1.0, rng.uniform(0.55, 1.0), rng.uniform(0.55, 1.0)
        hsv = Image.new("HSV", (1, 1), (int(hue * 255), int(saturation * 255), int(value * 255)))
        colour = tuple(hsv.convert("RGB").getpixel((0, 0)))  # saturated, from the class's band of hues
        if kind == CIRCLE:
            shape, where = "ellipse", [cx - r, cy - r, cx + r, cy + r]
        else:  # a square or triangle of circumradius r, rotated
            corners, turn = 4 if kind == SQUARE else 3, rng.uniform(0, 2 * np.pi)
            shape, where = "polygon", [(cx + r * np.cos(turn + 2 * np.pi * k / corners),
                                        cy + r * np.sin(turn + 2 * np.pi * k / corners)) for k in range(corners)]
        for draw, fill in ((image_draw, colour), (mask_draw, 255), (label_draw, kind)):
            getattr(draw, shape)(where, fill=fill)
        getattr(label_draw, shape)(where, outline=UNLABELLED, width=1)
    shapes = np.asarray(mask_layer)[..., None] > 0  # (H, W, 1)
    shaded = np.asarray(colour_layer).astype(np.float64) + rng.normal(0, 8, (height, width, 3))
    pixels = np.where(shapes, shaded, pixels)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)), label


def write_shapes(root: str | os.PathLike, train: int = TRAIN_IMAGES, val: int = VAL_IMAGES, seed: int = SEED) -> Path:
    """Write the set in the ADE20K layout under ``root`` (which must not hold one yet); returns ``root``.
    Image i of a split is drawn from the seed sequence (seed, split, i)."""
    root = Path(root)
    for split_index, (split, count) in enumerate((("training", train), ("validation", val))):
        image_dir, label_dir = root / "images" / split, root / "annotations" / split
        for folder in (image_dir, label_dir):
            folder.mkdir(parents=True, exist_ok=True)
        for i in range(count):
            image, label = draw_sample(np.random.default_rng([seed, split_index, i]))
            image.save(image_dir / f"shapes_{i:05d}.jpg", quality=95)
            label.save(label_dir / f"shapes_{i:05d}.png")
    return root


def shapes_root() -> Path:
    """The ``shapes`` data set's folder in the cache, written first if it is not there."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")) / "weightformer"
    root = cache / VERSION
    if root.is_dir():
        return root
    try:
        cache.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{VERSION}.", dir=cache))
    except OSError as exc:  # a full disk is the machine's (ResourceError), a folder of someone else's the user's
        raise resource_error(exc) or DataError(f"cannot write the shapes data set into {cache} ({exc.strerror or exc}); "
                                               f"set XDG_CACHE_HOME to a folder you can write to") from None
    try:
        write_shapes(staging)
        os.rename(staging, root)  # atomic; another process that finished first wins and ours is dropped
    except OSError:
        if not root.is_dir():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return root
