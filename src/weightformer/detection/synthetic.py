"""``shapes``: a small COCO-layout instance data set drawn from its seed, so detection runs offline.

0 to 3 circles, squares and triangles of random colours on noisy 96-128 px images; squares and triangles are
annotated as polygons, circles as RLE, so both mask formats are exercised."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional

import numpy as np
from PIL import Image

__all__ = ["SHAPES_CATEGORIES", "SHAPES_NAME", "SPLIT_SIZES", "cache_root", "shapes_root", "write_shapes"]

SHAPES_NAME = "shapes"  # the --data name that selects this data set
VERSION = "det-shapes-v2"  # bump when the drawing or the split sizes change, so an old cache is not reused
SHAPES_CATEGORIES = ({"id": 1, "name": "circle"}, {"id": 2, "name": "square"}, {"id": 3, "name": "triangle"})
# 800 training images: with 200 (and 50 to validate), three seeds of the recipe spread by 5.8 bbox mAP (docs/dense.md)
SPLIT_SIZES = {"train": 800, "val": 200}
IMAGE_SIDES = (96, 128)  # each side drawn uniformly in this range
OBJECT_SIDES = (20, 56)  # a shape's bounding square
MAX_OBJECTS = 3
NEGATIVE_FRACTION = 0.1

def cache_root() -> Path:
    """Where the data set lives: ``$XDG_CACHE_HOME/weightformer/det-shapes-v2`` (default ``~/.cache``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "weightformer" / VERSION


def _polygon(kind: str, x: float, y: float, side: float) -> list[float]:
    """The outline of a square or an upward triangle in the ``side``² square at (x, y), as x0, y0, x1, y1, ..."""
    if kind == "square":
        return [x, y, x + side, y, x + side, y + side, x, y + side]
    return [x + side / 2, y, x + side, y + side, x, y + side]


def _disk(height: int, width: int, x: float, y: float, side: float) -> np.ndarray:
    """(H, W) uint8 mask of the circle inscribed in the ``side``² square at (x, y)."""
    rows, cols = np.mgrid[:height, :width]
    radius = side / 2
    return (((cols + 0.5 - x - radius) ** 2 + (rows + 0.5 - y - radius) ** 2) <= radius**2).astype(np.uint8)


def _draw_image(rng: np.random.Generator, image_id: int) -> tuple[Image.Image, list[dict[str, Any]]]:
    """One image and its annotations (shapes that do not overlap)."""
    from pycocotools import mask as mask_utils

    width, height = (int(v) for v in rng.integers(IMAGE_SIDES[0], IMAGE_SIDES[1] + 1, size=2))
    base = rng.integers(40, 215, size=3)
    pixels = np.clip(base + rng.normal(0, 12, (height, width, 3)), 0, 255).astype(np.uint8)
    count = 0 if rng.random() < NEGATIVE_FRACTION else int(rng.integers(1, MAX_OBJECTS + 1))
    placed: list[tuple[float, float, float]] = []
    annotations = []
    for _ in range(count * 10):  # a few tries per shape to find free space
        if len(annotations) == count:
            break
        side = float(rng.integers(OBJECT_SIDES[0], min(OBJECT_SIDES[1], width, height) + 1))
        x, y = float(rng.uniform(0, width - side)), float(rng.uniform(0, height - side))
        if any(x < px + ps and px < x + side and y < py + ps and py < y + side for px, py, ps in placed):
            continue
        placed.append((x, y, side))
        category = SHAPES_CATEGORIES[int(rng.integers(len(SHAPES_CATEGORIES)))]
        color = rng.integers(0, 256, size=3)
        while np.abs(color.astype(int) - base).sum() < 150:  # visible against the background
            color = rng.integers(0, 256, size=3)
        if category["name"] == "circle":
            mask = _disk(height, width, x, y, side)
            segmentation: Any = mask_utils.encode(np.asfortranarray(mask))
            segmentation["counts"] = segmentation["counts"].decode()
        else:
            segmentation = [[round(v, 2) for v in _polygon(category["name"], x, y, side)]]
            # painted with the mask pycocotools rasterises from the polygon, so pixels and annotation agree
            mask = mask_utils.decode(mask_utils.merge(mask_utils.frPyObjects(segmentation, height, width)))
        pixels[mask.astype(bool)] = color
        rle = mask_utils.encode(np.asfortranarray(mask))
        annotations.append({"image_id": image_id, "category_id": category["id"], "segmentation": segmentation,
                            "bbox": [round(float(v), 2) for v in mask_utils.toBbox(rle)],
                            "area": float(mask_utils.area(rle)), "iscrowd": 0})
    return Image.fromarray(pixels), annotations


def write_shapes(root: str | Path, seed: int = 0, split_sizes: Optional[dict[str, int]] = None) -> Path:
    """Draw the data set into ``root`` (not there yet), ``split_sizes`` images per split; returns ``root``."""
    root = Path(root)
    split_sizes = SPLIT_SIZES if split_sizes is None else split_sizes
    rng, ann_ids = np.random.default_rng(seed), itertools.count(1)
    (root / "annotations").mkdir(parents=True)
    for split, size in split_sizes.items():
        folder = root / "images" / split
        folder.mkdir(parents=True)
        images, annotations = [], []
        for image_id in range(1, size + 1):
            image, anns = _draw_image(rng, image_id)
            name = f"{image_id:06d}.png"
            image.save(folder / name)
            images.append({"id": image_id, "file_name": name, "width": image.width, "height": image.height})
            annotations += [{"id": next(ann_ids), **ann} for ann in anns]
        content = {"images": images, "annotations": annotations, "categories": list(SHAPES_CATEGORIES)}
        (root / "annotations" / f"instances_{split}.json").write_text(json.dumps(content))
    return root


def shapes_root(seed: int = 0) -> Path:
    """The data set's folder in the cache, drawn on first use into a temporary folder renamed into place, so a
    concurrent or killed writer never leaves a partial one."""
    root = cache_root()
    if root.is_dir():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{VERSION}.", suffix=".tmp", dir=root.parent))
    try:
        write_shapes(staging / "data", seed)
        try:
            os.rename(staging / "data", root)
        except OSError:
            if not root.is_dir():  # not a writer that finished first: a real failure
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return root
