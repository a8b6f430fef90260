"""A COCO instances file, read and checked before pycocotools indexes it (:func:`open_instances`).

pycocotools only indexes (a missing key is a KeyError, a repeated id silently wins, an RLE's runs are not
checked against its size). :func:`check_instances` refuses what the loader, the loss or COCOeval would fail
on or misread, in one :class:`DataError` line naming the file, the entry and the fix; drops what detectron2
drops (polygons under 3 points or of odd length, annotations left maskless or of no listed image), one
:class:`DroppedAnnotationsWarning` line per reason; and fills a missing ``area``, which COCOeval needs.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import math
import warnings
from pathlib import Path
from typing import Any, Optional

import numpy as np
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

from ..data.errors import DataError

__all__ = ["DroppedAnnotationsWarning", "check_instances", "listed", "open_instances"]

KEYS = ("images", "annotations", "categories")
NUMBERS = (int, float)  # what JSON numbers load as (a bool is no number here)
CHUNK = 1 << 21  # polygon coordinates checked per NumPy array
MIN_POLYGON = 6  # coordinates of the smallest polygon kept: 3 points, as detectron2 and mmdetection keep


class DroppedAnnotationsWarning(UserWarning):
    """Annotations (or polygons of one) that the data set left out, counted, one line per reason."""


def _shown(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def listed(items: list[Any], limit: int = 5) -> str:
    """The first ``limit`` of ``items``, comma-separated, with ", ..." if there are more."""
    return ", ".join(str(i) for i in items[:limit]) + (", ..." if len(items) > limit else "")


def _finite(value: Any) -> bool:
    try:
        return type(value) in NUMBERS and math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def _all_finite(values: list[Any], width: Optional[int] = None) -> bool:
    """Whether ``values`` (a flat list, or rows of ``width``) are all finite JSON numbers: one NumPy pass."""
    try:
        array = np.array(values)
    except (ValueError, TypeError, OverflowError):  # ragged rows, huge ints
        return False
    shape_ok = array.ndim == 1 if width is None else (array.ndim == 2 and array.shape[1] == width)
    return shape_ok and array.dtype.kind in "iuf" and (array.dtype.kind != "f" or bool(np.isfinite(array).all()))


def _compressed_runs(counts: str) -> Optional[list[int]]:
    """The run lengths of COCO's compressed RLE string (pycocotools' ``rleFrString``), or None if it is none."""
    runs: list[int] = []
    position = 0
    while position < len(counts):
        value, shift, more = 0, 0, True
        while more:
            if position == len(counts):
                return None  # the string stops inside a number
            char = ord(counts[position]) - 48
            if not 0 <= char < 64:
                return None
            value |= (char & 0x1F) << 5 * shift
            more = bool(char & 0x20)
            position += 1
            shift += 1
            if not more and char & 0x10:
                value |= -1 << 5 * shift
        if len(runs) > 2:
            value += runs[-2]
        if value < 0:
            return None
        runs.append(value)
    return runs


def _rle_problem(segm: dict[str, Any], height: int, width: int) -> Optional[str]:
    """What is wrong with an RLE ``segmentation`` on a ``height`` x ``width`` image, or None."""
    size, counts = segm.get("size"), segm.get("counts")
    if not (type(size) is list and len(size) == 2 and all(type(v) is int for v in size)):
        return f"has an RLE mask whose size is {_shown(size)}, not [height, width]"
    if size != [height, width]:
        return (f"has an RLE mask of {size[0]}x{size[1]} pixels (height x width) on a {height}x{width} image (it "
                "would be stretched over the image)")
    runs = _compressed_runs(counts) if type(counts) is str else None
    if type(counts) is list and counts and all(type(v) is int and v >= 0 for v in counts):
        runs = counts
    if runs is None:
        return (f"has an RLE mask whose counts {_shown(counts)} are no run lengths (a list of non-negative "
                f"integers, or COCO's compressed string)")
    if sum(runs) != height * width:
        return f"has an RLE mask whose runs cover {sum(runs)} pixels, not the {height * width} of its {height}x{width} size"
    return None


def _fill_areas(anns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``anns`` (checked, without ``area``) with their masks' area, which COCOeval needs: a polygon's by the
    shoelace formula over all at once (pycocotools' rasterised count differs by boundary pixels and costs
    far more), an RLE's as pycocotools counts it."""
    polygons = [polygon for ann in anns if type(ann["segmentation"]) is list for polygon in ann["segmentation"]]
    points = np.array([v for polygon in polygons for v in polygon], dtype=np.float64).reshape(-1, 2)  # (P, 2)
    sizes = np.array([len(polygon) // 2 for polygon in polygons], dtype=np.int64)
    starts = np.cumsum(sizes) - sizes
    following = np.arange(1, len(points) + 1)
    following[starts + sizes - 1] = starts  # each polygon's last point closes it
    x, y = points[:, 0], points[:, 1]
    areas = iter((0.5 * np.abs(np.add.reduceat(x * y[following] - x[following] * y, starts))).tolist() if polygons else [])
    out = []
    for ann in anns:
        segm = ann["segmentation"]
        if type(segm) is list:
            area = sum(next(areas) for _ in segm)
        else:  # RLE: its runs alternate 0s and 1s, starting with 0s
            area = float(sum(segm["counts"][1::2]) if type(segm["counts"]) is list else mask_utils.area(segm))
        out.append({**ann, "area": area})
    return out


class _Check:
    """One pass over an instances file's content: see :func:`check_instances`."""

    def __init__(self, content: Any, path: Path):
        if not isinstance(content, dict):
            raise DataError(f"{path} holds a JSON {type(content).__name__}, not an object with images, annotations "
                            "and categories; it is not a COCO instances file")
        for key in KEYS:
            if type(content.get(key)) is not list:
                what = f"{key} is a JSON {type(content[key]).__name__}, not a list" if key in content else f"no {key} list"
                raise DataError(f"{path}: {what}; it is not a COCO instances file")
        self.content, self.path = content, path
        self.warnings: list[tuple[str, type[Warning]]] = []
        self.images: dict[int, dict[str, Any]] = {}  # id -> image, filled by check_images

    def fail(self, text: str) -> DataError:
        return DataError(f"{self.path}: {text}")

    def where(self, ann: dict[str, Any]) -> str:
        return f"annotation {ann['id']} of {self.images[ann['image_id']]['file_name']}"

    def check_images(self) -> None:
        if not self.content["images"]:
            raise self.fail("lists no images (images is empty); a split needs its images, each with an id, "
                            "file_name, width and height")
        by_id = self.images
        for index, image in enumerate(self.content["images"]):
            if type(image) is not dict:
                raise self.fail(f"images[{index}] is {_shown(image)}, not an image {{id, file_name, width, height}}; "
                                "fix the entry")
            image_id, name = image.get("id"), image.get("file_name")
            if type(image_id) is not int:
                raise self.fail(f"images[{index}] ({_shown(name)}) has id {_shown(image_id)}; COCO image ids are "
                                "integers: renumber the images and their annotations' image_id")
            if type(name) is not str or not name:
                raise self.fail(f"image {image_id} has file_name {_shown(name)}; give the name of its file in the "
                                "split's image folder")
            for key in ("width", "height"):
                if type(image.get(key)) is not int or image[key] <= 0:
                    raise self.fail(f"image {image_id} ({name}) has {key} {_shown(image.get(key))}; it must be the "
                                    f"image's {key} in pixels, a positive integer")
            if image_id in by_id:
                raise self.fail(f"image id {image_id} is listed twice ({by_id[image_id]['file_name']} and {name}), so "
                                "one image would be lost and its annotations given to the other; give each image "
                                "its own id (and its annotations that image_id)")
            by_id[image_id] = image

    def categories(self) -> set[int]:
        if not self.content["categories"]:
            raise self.fail("declares no categories (categories is empty); list the categories, each with an "
                            "integer id and a name")
        ids: set[int] = set()
        for index, category in enumerate(self.content["categories"]):
            category_id = category.get("id") if type(category) is dict else None
            if type(category_id) is not int:
                raise self.fail(f"categories[{index}] is {_shown(category)}, without an integer id; each category "
                                "needs {id, name}")
            if category_id in ids:
                raise self.fail(f"category id {category_id} is declared twice; give each category its own id")
            ids.add(category_id)
        return ids

    def annotations(self, categories: set[int]) -> list[dict[str, Any]]:
        """The annotations to index: each checked, polygons cleaned, orphans and maskless ones dropped."""
        kept: list[dict[str, Any]] = []
        seen: set[int] = set()
        orphans: list[Any] = []  # ids of annotations of no listed image
        maskless: list[Any] = []  # ids of annotations left without a polygon
        dropped_polygons, first_orphan = 0, ""
        coordinates: list[Any] = []  # polygon coordinates not yet checked, and the annotations they are of
        owners: list[dict[str, Any]] = []
        for index, ann in enumerate(self.content["annotations"]):
            if type(ann) is not dict:
                raise self.fail(f"annotations[{index}] is {_shown(ann)}, not an annotation object; fix the entry")
            ann_id = ann.get("id")
            if type(ann_id) is not int:
                raise self.fail(f"annotations[{index}] has id {_shown(ann_id)}; give every annotation a unique "
                                "integer id")
            if ann_id in seen:
                raise self.fail(f"annotation id {ann_id} is used twice, so pycocotools' index would keep only one of "
                                "them (COCOeval scores it twice and the other never); give each annotation its own id")
            seen.add(ann_id)
            image_id = ann.get("image_id")
            image = self.images.get(image_id) if type(image_id) is int else None
            if image is None:
                first_orphan = first_orphan or f"annotation {ann_id} has image_id {_shown(image_id)}"
                orphans.append(ann_id)
                continue
            where = f"annotation {ann_id} of {image['file_name']}"
            category_id, iscrowd, area = ann.get("category_id"), ann.get("iscrowd", 0), ann.get("area")
            if type(category_id) is not int or category_id not in categories:
                raise self.fail(f"{where} has category_id {_shown(category_id)}, which the file does not declare "
                                "under categories; fix the id or add the category")
            if type(iscrowd) not in (int, bool) or iscrowd not in (0, 1):
                raise self.fail(f"{where} has iscrowd {_shown(iscrowd)}; it must be 0 (an object) or 1 (a crowd "
                                "region)")
            if area is not None and not (_finite(area) and area >= 0):
                raise self.fail(f"{where} has area {_shown(area)}; it must be its mask's number of pixels, or left "
                                "out to be computed")
            if "segmentation" not in ann:
                raise self.fail(f"{where} has no segmentation; instance segmentation needs a mask (polygons or RLE) "
                                "for every annotation")
            segm = ann["segmentation"]
            if type(segm) is list:
                if not all(type(polygon) is list for polygon in segm):
                    fix = "wrap the polygon in a list" if all(type(v) in NUMBERS for v in segm) else "fix it in the file"
                    raise self.fail(f"{where} has segmentation {_shown(segm)}, which is no list of polygons "
                                    f"[[x1, y1, x2, y2, ...], ...]; {fix}")
                valid = [polygon for polygon in segm if len(polygon) >= MIN_POLYGON and not len(polygon) % 2]
                if len(valid) < len(segm):  # what is dropped must still be polygons, not points [[x, y], ...]
                    self._check_coordinates([v for polygon in segm for v in polygon], [ann])
                    dropped_polygons += len(segm) - len(valid)
                    ann = {**ann, "segmentation": valid}
                if not valid:
                    maskless.append(ann_id)
                    continue
                for polygon in valid:
                    coordinates.extend(polygon)
                owners.append(ann)
                if len(coordinates) >= CHUNK:
                    self._check_coordinates(coordinates, owners)
                    coordinates, owners = [], []
            elif type(segm) is dict:
                problem = _rle_problem(segm, image["height"], image["width"])
                if problem:
                    raise self.fail(f"{where} {problem}; re-encode the mask at its image's size "
                                    "(pycocotools.mask.encode)")
            else:
                raise self.fail(f"{where} has segmentation {_shown(segm)}, which is neither polygons "
                                "[[x1, y1, ...], ...] nor an RLE {counts, size}; fix it in the file")
            kept.append(ann)
        self._check_coordinates(coordinates, owners)
        self._check_boxes(kept)
        no_area = [i for i, ann in enumerate(kept) if ann.get("area") is None]
        for i, ann in zip(no_area, _fill_areas([kept[i] for i in no_area])):
            kept[i] = ann
        self._report(len(self.content["annotations"]), kept, orphans, first_orphan, maskless, dropped_polygons)
        return kept

    def _check_coordinates(self, coordinates: list[Any], owners: list[dict[str, Any]]) -> None:
        if not coordinates or _all_finite(coordinates):
            return
        for ann in owners:  # the slow search, only when something is wrong
            for value in (v for polygon in ann["segmentation"] for v in polygon):
                if not _finite(value):
                    raise self.fail(f"{self.where(ann)} has a polygon coordinate {_shown(value)}, not a finite "
                                    "number; coordinates are pixels: fix the polygon in the file")

    def _check_boxes(self, kept: list[dict[str, Any]]) -> None:
        boxes = [ann.get("bbox") for ann in kept]
        if not boxes or _all_finite(boxes, width=4):
            return
        for ann, box in zip(kept, boxes):
            if not (type(box) is list and len(box) == 4 and all(_finite(v) for v in box)):
                what = "has no bbox" if box is None else f"has bbox {_shown(box)}"
                raise self.fail(f"{self.where(ann)} {what}; a bbox is [x, y, width, height], 4 numbers in pixels: "
                                "fix it in the file")

    def _report(self, total: int, kept: list[dict[str, Any]], orphans: list[Any], first_orphan: str,
                maskless: list[Any], dropped_polygons: int) -> None:
        if total and not kept:
            if len(orphans) == total:
                raise self.fail(f"none of its {total} annotations belongs to an image it lists ({first_orphan}, "
                                f"the images' ids run from {min(self.images)} to {max(self.images)}); the "
                                "annotations' image_id must be the ids of the images (integers, not strings)")
            raise self.fail(f"none of its {total} annotations has a usable mask ({len(maskless)} have an empty "
                            "segmentation or only polygons of fewer than 3 points, e.g. annotation "
                            f"{listed(maskless)}); Mask R-CNN learns from instance masks: export them (polygons or "
                            "RLE) with the boxes")
        lines = []
        if orphans:
            lines.append(f"{len(orphans)} annotation(s) whose image_id is not under images (annotation "
                         f"{listed(orphans)}); they belong to no image of this split")
        if dropped_polygons:
            lines.append(f"{dropped_polygons} polygon(s) of fewer than 3 points or with an odd number of coordinates, "
                         f"as detectron2 does; {len(maskless)} annotation(s) were left without a mask and dropped"
                         + (f" (annotation {listed(maskless)})" if maskless else ""))
        elif maskless:
            lines.append(f"{len(maskless)} annotation(s) with an empty segmentation (annotation {listed(maskless)}), "
                         "as detectron2 does: Mask R-CNN needs a mask")
        self.warnings += [(f"{self.path}: dropped {line}", DroppedAnnotationsWarning) for line in lines]


def check_instances(content: Any, path: Path) -> tuple[dict[str, Any], list[tuple[str, type[Warning]]]]:
    """An instances file's loaded JSON ``content``, checked, and the warning lines of what was dropped:
    ``(content to index, [(line, warning class)])``. The content returned holds the annotations kept
    (polygons cleaned, a missing ``area`` filled in); ``content`` itself is left as it was."""
    check = _Check(content, path)
    enabled = gc.isenabled()
    gc.disable()  # the cycle collector would walk the whole loaded file again and again; the check makes no cycles
    try:
        check.check_images()
        annotations = check.annotations(check.categories())
    finally:
        if enabled:
            gc.enable()
    return {**content, "annotations": annotations}, check.warnings


def open_instances(path: Path) -> COCO:
    """``path`` read, checked (:func:`check_instances`, its warnings issued) and indexed by pycocotools."""
    if not path.is_file():
        raise DataError(f"no annotation file {path}; COCO data needs annotations/instances_<split>.json")
    try:
        with path.open("rb") as f:
            content = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise DataError(f"cannot read {path} as JSON ({str(exc).splitlines()[0]}); re-export the annotation file") from None
    checked, lines = check_instances(content, path)
    for line, category in lines:
        warnings.warn(line, category, stacklevel=3)
    coco = COCO()
    coco.dataset = checked
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress
        coco.createIndex()
    return coco
