"""COCO-layout instance data: a split's images in ``images/<split>/`` (or ``<split>/`` beside
``annotations/``) and its instances in ``annotations/instances_<split>.json``.

That covers COCO 2017 as downloaded (``train2017``/``val2017``, images under ``images/`` or not) and
the plain ``train``/``val`` names; :func:`find_split` picks a split by its role (training or
validation) when the user names none, and a folder that fits no layout is one :class:`DataError`
line listing what was looked for.

The data set checks the annotation file when it opens (:func:`check_instances`), so a bad file stops
a run before it starts, never inside the data loader an epoch later. What detectron2 and mmdetection
leave out of a COCO file, this leaves out too, with one :class:`DroppedAnnotationsWarning` line per
reason that counts what was dropped; everything else that a loader, the loss or pycocotools' COCOeval
would fail on, or would read as something the file does not say, is one :class:`DataError` line naming
the file, the annotation (or image) id, what is wrong and the fix.

Dropped, with a warning that counts them (what detectron2 / mmdetection users expect):

- polygons of fewer than 3 points or with an odd number of coordinates (detectron2 and mmdetection
  keep a polygon only with an even length of at least 6; pycocotools fails on the first in the data
  loader and silently truncates the second), and so an annotation left with no polygon at all, or
  with an empty ``segmentation`` list. Exports from annotation tools and resized masks commonly hold
  a few such slivers; refusing a whole file of 100k annotations over them would help no one, and the
  warning says how many there were;
- annotations whose ``image_id`` is not under ``images`` (pycocotools, COCOeval and detectron2 never see
  them: they belong to no image of the split, as in a file cut down to a subset of its images);
- boxes of zero or negative width or height (left out of the training targets only, as detectron2's
  filter of empty instances does; COCOeval still reads them from the file).

A split left with no annotation at all after these drops is a DataError (every annotation's
``image_id`` wrong, a box-only file without masks): it would train on nothing without a word.

A DataError (the file says something impossible, or what it says would be read wrongly):

- the file's shape: ``images``, ``annotations`` or ``categories`` missing or not a list, no image or no
  category at all, an entry that is not an object;
- an image without an integer ``id``, a ``file_name`` or a positive integer ``width`` and ``height``;
  two images of one id (pycocotools keeps the last silently: an image lost, its annotations given to
  the other); two categories of one id;
- an annotation without an integer ``id``, or two of one id (pycocotools' index keeps one, so COCOeval
  scores one annotation twice and the other never; detectron2 refuses such a file); a ``category_id``
  not declared; a ``bbox`` that is not 4 finite numbers (strings, ``null``, NaN); an ``iscrowd`` other
  than 0 or 1; an ``area`` that is not a number;
- a ``segmentation`` that is neither a list of polygons nor an RLE object (a flat list of numbers, a
  string); polygon coordinates that are not finite numbers; an RLE without a ``[height, width]``
  ``size``, whose counts are no run lengths, whose runs do not cover its size (a garbage RLE), or whose
  size is not its image's (pycocotools would decode it at its own size and the mask would be stretched
  over the image).

An annotation without ``area`` gets its mask's (:func:`_fill_areas`): COCOeval needs one for its size
buckets, and fails after a whole evaluation without it. The checks are a few cheap tests per
annotation and NumPy passes over all boxes and polygon coordinates: 100k COCO-like annotations check
in about 0.6 s on one CPU core, a fifth of what ``json.load`` takes for their file (COCO 2017's 860k
train annotations: about 5 s). Images without annotations stay, as negatives.

Division of work with the model: the data set returns float images in [0, 1] at their stored size
(or, with :class:`LargeScaleJitter`, 1024² training crops); the model's ``GeneralizedRCNNTransform``
resizes, normalises and batches them, and maps eval predictions back to the stored size.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import math
import random
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple, Optional

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from timm.data import IMAGENET_DEFAULT_MEAN
from torch import Tensor
from torch.utils.data import Dataset
from torchvision.transforms.functional import pil_to_tensor

from ..data.errors import DataError
from ..data.transforms import sample_seed, seeded_rng
from . import synthetic

__all__ = ["SPLIT_NAMES", "CocoDetection", "CocoSplit", "DroppedAnnotationsWarning", "DroppedBoxesWarning",
           "LargeScaleJitter", "SeededJitterDataset", "check_instances", "collate", "data_root", "drop_crowd",
           "find_split", "split_files"]

Target = dict[str, Tensor]
Transform = Callable[[Tensor, Target], tuple[Tensor, Target]]
INSTANCE_KEYS = ("boxes", "labels", "masks", "area", "iscrowd")  # target entries with one row per instance
NAMES_SHOWN = 3  # missing image names quoted in the error line
# The split names tried, in order, for each role when the user names none: COCO 2017's, then the plain ones.
SPLIT_NAMES = {"train": ("train2017", "train"), "val": ("val2017", "val")}
SPLIT_FLAGS = {"train": "--train-split", "val": "--val-split"}


class DroppedAnnotationsWarning(UserWarning):
    """Annotations (or polygons of one) that the data set left out, counted, one line per reason."""


class DroppedBoxesWarning(DroppedAnnotationsWarning):
    """Annotations with boxes of zero or negative width or height were left out."""


class CocoSplit(NamedTuple):
    """A split found on disk: its name, its image folder and its annotation file."""

    name: str
    image_dir: Path
    annotation_file: Path


def _image_dirs(root: Path, split: str) -> tuple[Path, Path]:
    """Where split ``split``'s images may be: ``images/<split>/``, or ``<split>/`` beside ``annotations/``."""
    return root / "images" / split, root / split


def split_files(root: str | Path, split: str) -> Optional[CocoSplit]:
    """Split ``split`` under ``root``, or None if its image folder or its annotation file is missing."""
    root = Path(root).expanduser()
    annotations = root / "annotations" / f"instances_{split}.json"
    image_dir = next((d for d in _image_dirs(root, split) if d.is_dir()), None)
    return CocoSplit(split, image_dir, annotations) if image_dir is not None and annotations.is_file() else None


def _looked_for(split: str) -> str:
    return f"images/{split}/ or {split}/ with annotations/instances_{split}.json"


def find_split(root: str | Path, role: str, split: Optional[str] = None) -> CocoSplit:
    """The split to use for ``role`` ("train" or "val"): ``split`` if given (and there), else the first
    of :data:`SPLIT_NAMES` that ``root`` holds. A folder holding none is one DataError line listing
    what was looked for."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DataError(f"data folder {root} does not exist; pass --data with a COCO-layout folder, or shapes "
                        "(the offline set)")
    names = (split,) if split else SPLIT_NAMES[role]
    for name in names:
        found = split_files(root, name)
        if found is not None:
            return found
    what = "training" if role == "train" else "validation"
    hint = (f"pass {SPLIT_FLAGS[role]} NAME for a split of another name" if not split
            else f"check the name, or drop {SPLIT_FLAGS[role]} to find {' or '.join(SPLIT_NAMES[role])}")
    raise DataError(f"{root} holds no COCO {what} split: looked for {'; '.join(_looked_for(n) for n in names)}; {hint}")


def data_root(data: str) -> Path:
    """The COCO-layout folder ``--data`` names: the offline ``shapes`` set (drawn on first use), or a path."""
    return synthetic.shapes_root() if data == synthetic.SHAPES_NAME else Path(data).expanduser()


# --------------------------------------------------------------------------------------------------
# Checking an instances file (see the module docstring for what is dropped and what is an error)
# --------------------------------------------------------------------------------------------------
NUMBERS = (int, float)  # what JSON numbers load as (a bool is no number here)
IDS_SHOWN = 5  # annotation ids quoted in a warning line
CHUNK = 1 << 21  # polygon coordinates checked per NumPy array
MIN_POLYGON = 6  # coordinates of the smallest polygon kept: 3 points, as detectron2 and mmdetection keep


def _shown(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _ids(ids: list[Any]) -> str:
    return ", ".join(str(i) for i in ids[:IDS_SHOWN]) + (", ..." if len(ids) > IDS_SHOWN else "")


def _finite_number(value: Any) -> bool:
    try:
        return type(value) in NUMBERS and math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def _all_finite_numbers(values: list[Any], width: Optional[int] = None) -> bool:
    """Whether ``values`` (a flat list, or rows of ``width``) are all finite JSON numbers: one NumPy pass."""
    try:
        array = np.array(values)
    except (ValueError, TypeError, OverflowError):  # ragged rows, huge ints
        return False
    shape_ok = array.ndim == 1 if width is None else (array.ndim == 2 and array.shape[1] == width)
    return shape_ok and array.dtype.kind in "iuf" and (array.dtype.kind != "f" or bool(np.isfinite(array).all()))


def _compressed_total(counts: str) -> Optional[int]:
    """The pixels covered by COCO's compressed RLE string ``counts`` (pycocotools' ``rleFrString``), or None
    if it is no such string."""
    runs: list[int] = []
    position, end = 0, len(counts)
    while position < end:
        value, shift, more = 0, 0, True
        while more:
            if position == end:
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
    return sum(runs)


def _rle_problem(segm: dict[str, Any], height: int, width: int) -> Optional[str]:
    """What is wrong with an RLE ``segmentation`` on a ``height`` x ``width`` image, or None."""
    size, counts = segm.get("size"), segm.get("counts")
    if not (type(size) is list and len(size) == 2 and all(type(v) is int for v in size)):
        return f"has an RLE mask whose size is {_shown(size)}, not [height, width]"
    if size != [height, width]:
        return (f"has an RLE mask of {size[0]}x{size[1]} pixels (height x width) on a {height}x{width} image (it "
                "would be stretched over the image)")
    total: Optional[int] = None
    if type(counts) is str:
        total = _compressed_total(counts)
    elif type(counts) is list and counts:
        try:
            runs = np.array(counts)
        except (ValueError, TypeError, OverflowError):  # ragged, huge
            runs = np.zeros(0)
        if runs.ndim == 1 and runs.dtype.kind in "iu" and (runs >= 0).all():  # "iu": no bools, floats or strings
            total = int(runs.sum())
    if total is None:
        return (f"has an RLE mask whose counts {_shown(counts)} are no run lengths (a list of non-negative "
                f"integers, or COCO's compressed string)")
    if total != height * width:
        return f"has an RLE mask whose runs cover {total} pixels, not the {height * width} of its {height}x{width} size"
    return None


def _polygon_areas(segms: list[list[list[float]]]) -> np.ndarray:
    """The area of each of ``segms`` (checked polygon lists), by the shoelace formula over all at once
    (pycocotools' rasterised count differs by boundary pixels, and rasterising costs far more)."""
    polygons = [polygon for segm in segms for polygon in segm]
    points = np.array([v for polygon in polygons for v in polygon], dtype=np.float64).reshape(-1, 2)
    sizes = np.array([len(polygon) // 2 for polygon in polygons])
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    following = np.arange(1, len(points) + 1)
    following[starts + sizes - 1] = starts  # each polygon's last point closes it
    x, y = points[:, 0], points[:, 1]
    polygon_areas = 0.5 * np.abs(np.add.reduceat(x * y[following] - x[following] * y, starts))
    firsts = np.concatenate([[0], np.cumsum([len(segm) for segm in segms])[:-1]])
    return np.add.reduceat(polygon_areas, firsts)


def _fill_areas(anns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``anns`` (checked, without ``area``) with their masks' area: COCO's ``area``, which COCOeval needs."""
    areas = [0.0] * len(anns)
    polygonal = [i for i, ann in enumerate(anns) if type(ann["segmentation"]) is list]
    if polygonal:
        for i, area in zip(polygonal, _polygon_areas([anns[i]["segmentation"] for i in polygonal]).tolist()):
            areas[i] = area
    for i, ann in enumerate(anns):
        segm = ann["segmentation"]
        if type(segm) is dict:  # RLE: its runs alternate 0s and 1s, starting with 0s
            areas[i] = float(sum(segm["counts"][1::2]) if type(segm["counts"]) is list else mask_utils.area(segm))
    return [{**ann, "area": area} for ann, area in zip(anns, areas)]


class _Instances:
    """One pass over an instances file's content: see :func:`check_instances`."""

    def __init__(self, content: Any, path: Path):
        self.path = path
        if not isinstance(content, dict):
            raise DataError(f"{path} holds a JSON {type(content).__name__}, not an object with images, annotations "
                            "and categories; it is not a COCO instances file")
        missing = [key for key in ("images", "annotations", "categories") if key not in content]
        if missing:
            raise DataError(f"{path} has no {', '.join(missing)} list; it is not a COCO instances file")
        for key in ("images", "annotations", "categories"):
            if type(content[key]) is not list:
                raise DataError(f"{path}: {key} is a JSON {type(content[key]).__name__}, not a list; it is not a "
                                f"COCO instances file")
        self.content = content
        self.warnings: list[tuple[str, type[Warning]]] = []
        self.image_ids: list[int] = []
        self.first_orphan = ""

    def fail(self, text: str) -> DataError:
        return DataError(f"{self.path}: {text}")

    def images(self) -> dict[int, dict[str, Any]]:
        entries = self.content["images"]
        if not entries:
            raise self.fail("lists no images (images is empty); a split needs its images, each with an id, "
                            "file_name, width and height")
        by_id: dict[int, dict[str, Any]] = {}
        for index, image in enumerate(entries):
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
                value = image.get(key)
                if type(value) is not int or value <= 0:
                    raise self.fail(f"image {image_id} ({name}) has {key} {_shown(value)}; it must be the image's "
                                    f"{key} in pixels, a positive integer")
            if image_id in by_id:
                raise self.fail(f"image id {image_id} is listed twice ({by_id[image_id]['file_name']} and {name}), so "
                                "one image would be lost and its annotations given to the other; give each image "
                                "its own id (and its annotations that image_id)")
            by_id[image_id] = image
        self.image_ids = list(by_id)
        return by_id

    def categories(self) -> set[int]:
        entries = self.content["categories"]
        if not entries:
            raise self.fail("declares no categories (categories is empty); list the categories, each with an "
                            "integer id and a name")
        ids: set[int] = set()
        for index, category in enumerate(entries):
            category_id = category.get("id") if type(category) is dict else None
            if type(category_id) is not int:
                raise self.fail(f"categories[{index}] is {_shown(category)}, without an integer id; each category "
                                "needs {id, name}")
            if category_id in ids:
                raise self.fail(f"category id {category_id} is declared twice; give each category its own id")
            ids.add(category_id)
        return ids

    def annotations(self, images: dict[int, dict[str, Any]], categories: set[int]) -> list[dict[str, Any]]:
        """The annotations to index: each checked, polygons cleaned, orphans and maskless ones dropped."""
        kept: list[dict[str, Any]] = []
        seen: set[int] = set()
        orphans: list[Any] = []  # ids of annotations of no listed image
        maskless: list[Any] = []  # ids of annotations left without a polygon
        dropped_polygons = 0
        no_area: list[int] = []  # indices into kept
        coordinates: list[Any] = []  # polygon coordinates not yet checked, and the annotations they are of
        owners: list[dict[str, Any]] = []
        entries = self.content["annotations"]
        for index, ann in enumerate(entries):
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
            image = images.get(image_id) if type(image_id) is int else None
            if image is None:
                if not orphans:
                    self.first_orphan = f"annotation {ann_id} has image_id {_shown(image_id)}"
                orphans.append(ann_id)
                continue
            category_id = ann.get("category_id")
            if type(category_id) is not int or category_id not in categories:
                raise self.fail(f"annotation {ann_id} of {image['file_name']} has category_id {_shown(category_id)}, "
                                "which the file does not declare under categories; fix the id or add the category")
            iscrowd = ann.get("iscrowd", 0)
            if type(iscrowd) not in (int, bool) or iscrowd not in (0, 1):
                raise self.fail(f"annotation {ann_id} of {image['file_name']} has iscrowd {_shown(iscrowd)}; it must "
                                "be 0 (an object) or 1 (a crowd region)")
            area = ann.get("area")
            if area is not None and not (_finite_number(area) and area >= 0):
                raise self.fail(f"annotation {ann_id} of {image['file_name']} has area {_shown(area)}; it must be "
                                "its mask's number of pixels, or left out to be computed")
            if "segmentation" not in ann:
                raise self.fail(f"annotation {ann_id} of {image['file_name']} has no segmentation; instance "
                                "segmentation needs a mask (polygons or RLE) for every annotation")
            segm = ann["segmentation"]
            if type(segm) is list:
                if not all(type(polygon) is list for polygon in segm):
                    flat = all(type(v) in NUMBERS for v in segm)
                    raise self.fail(f"annotation {ann_id} of {image['file_name']} has segmentation {_shown(segm)}, "
                                    "which is no list of polygons [[x1, y1, x2, y2, ...], ...]; "
                                    + ("wrap the polygon in a list" if flat else "fix it in the file"))
                valid = [polygon for polygon in segm if len(polygon) >= MIN_POLYGON and not len(polygon) % 2]
                if len(valid) < len(segm):  # rare: what is dropped must still be polygons, not points [[x, y], ...]
                    self._check_coordinates([v for polygon in segm for v in polygon], [ann], images)
                    dropped_polygons += len(segm) - len(valid)
                if not valid:
                    maskless.append(ann_id)
                    continue
                if len(valid) < len(segm):
                    ann = {**ann, "segmentation": valid}
                for polygon in valid:
                    coordinates.extend(polygon)
                owners.append(ann)
                if len(coordinates) >= CHUNK:
                    self._check_coordinates(coordinates, owners, images)
                    coordinates, owners = [], []
            elif type(segm) is dict:
                problem = _rle_problem(segm, image["height"], image["width"])
                if problem:
                    raise self.fail(f"annotation {ann_id} of {image['file_name']} {problem}; re-encode the mask at "
                                    "its image's size (pycocotools.mask.encode)")
            else:
                raise self.fail(f"annotation {ann_id} of {image['file_name']} has segmentation {_shown(segm)}, which "
                                "is neither polygons [[x1, y1, ...], ...] nor an RLE {counts, size}; fix it in the "
                                "file")
            if area is None:
                no_area.append(len(kept))
            kept.append(ann)
        self._check_coordinates(coordinates, owners, images)
        self._check_boxes(kept, images)
        if no_area:
            for position, ann in zip(no_area, _fill_areas([kept[i] for i in no_area])):
                kept[position] = ann
        self._report(len(entries), kept, orphans, maskless, dropped_polygons)
        return kept

    def _check_coordinates(self, coordinates: list[Any], owners: list[dict[str, Any]],
                           images: dict[int, dict[str, Any]]) -> None:
        if not coordinates or _all_finite_numbers(coordinates):
            return
        for ann in owners:  # the slow search, only when something is wrong
            for value in (v for polygon in ann["segmentation"] for v in polygon):
                if not _finite_number(value):
                    raise self.fail(f"annotation {ann['id']} of {images[ann['image_id']]['file_name']} has a polygon "
                                    f"coordinate {_shown(value)}, not a finite number; coordinates are pixels: fix the "
                                    "polygon in the file")

    def _check_boxes(self, kept: list[dict[str, Any]], images: dict[int, dict[str, Any]]) -> None:
        boxes = [ann.get("bbox") for ann in kept]
        if not boxes or _all_finite_numbers(boxes, width=4):
            return
        for ann, box in zip(kept, boxes):
            if not (type(box) is list and len(box) == 4 and all(_finite_number(v) for v in box)):
                what = "has no bbox" if box is None else f"has bbox {_shown(box)}"
                raise self.fail(f"annotation {ann['id']} of {images[ann['image_id']]['file_name']} {what}; a bbox is "
                                "[x, y, width, height], 4 numbers in pixels: fix it in the file")

    def _report(self, total: int, kept: list[dict[str, Any]], orphans: list[Any], maskless: list[Any],
                dropped_polygons: int) -> None:
        if total and not kept:
            if len(orphans) == total:
                raise self.fail(f"none of its {total} annotations belongs to an image it lists ({self.first_orphan}, "
                                f"the images' ids run from {min(self.image_ids)} to {max(self.image_ids)}); the "
                                "annotations' image_id must be the ids of the images (integers, not strings)")
            raise self.fail(f"none of its {total} annotations has a usable mask ({len(maskless)} have an empty "
                            "segmentation or only polygons of fewer than 3 points, e.g. annotation "
                            f"{_ids(maskless)}); Mask R-CNN learns from instance masks: export them (polygons or RLE) "
                            "with the boxes")
        if orphans:
            self.warnings.append((f"{self.path}: dropped {len(orphans)} annotation(s) whose image_id is not under "
                                  f"images (annotation {_ids(orphans)}); they belong to no image of this split",
                                  DroppedAnnotationsWarning))
        if dropped_polygons:
            self.warnings.append((f"{self.path}: dropped {dropped_polygons} polygon(s) of fewer than 3 points or with "
                                  f"an odd number of coordinates, as detectron2 does; {len(maskless)} annotation(s) "
                                  f"were left without a mask and dropped"
                                  + (f" (annotation {_ids(maskless)})" if maskless else ""),
                                  DroppedAnnotationsWarning))
        elif maskless:
            self.warnings.append((f"{self.path}: dropped {len(maskless)} annotation(s) with an empty segmentation "
                                  f"(annotation {_ids(maskless)}), as detectron2 does: Mask R-CNN needs a mask",
                                  DroppedAnnotationsWarning))


def check_instances(content: Any, path: Path) -> tuple[dict[str, Any], list[tuple[str, type[Warning]]]]:
    """An instances file's loaded JSON ``content``, checked (see the module docstring), and the warning
    lines of what was dropped: ``(content to index, [(line, warning class)])``. The content returned
    holds the annotations kept (polygons cleaned, a missing ``area`` filled in); ``content`` itself is
    left as it was. A problem is one :class:`DataError` line naming ``path``."""
    check = _Instances(content, path)
    with _no_gc():
        images = check.images()
        categories = check.categories()
        annotations = check.annotations(images, categories)
    return {**content, "annotations": annotations}, check.warnings


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """Without the cycle collector, which would walk the whole loaded file (millions of objects) again and
    again as the check makes its copies; the check makes no cycles."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _open_coco(path: Path) -> COCO:
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


class CocoDetection(Dataset):
    """COCO instances of one split, as (image (3, H, W) float in [0, 1], target) pairs.

    The target holds boxes (N, 4) float xyxy in pixels, labels (N,) int64 in 1..K (the categories in
    order of id; see :attr:`category_ids`), masks (N, H, W) uint8 decoded from polygons or RLE,
    image_id (int64), area (N,) (the annotation's area in the stored image, COCO's size buckets) and
    iscrowd (N,) int64. An image without annotations gives N = 0: boxes (0, 4), masks (0, H, W).
    Crowd regions stay, flagged by iscrowd; :func:`drop_crowd` takes them out before a loss.
    ``split`` names the split (``val2017``, ``val``, ...); its images are in ``images/<split>/`` or
    ``<split>/``. ``transforms``: a callable ``(image, target) -> (image, target)``, e.g. :class:`LargeScaleJitter`.
    """

    def __init__(self, root: str | Path, split: str, transforms: Optional[Transform] = None):
        self.root = Path(root).expanduser()
        self.split = split
        self.image_dir = next((d for d in _image_dirs(self.root, split) if d.is_dir()), self.root / "images" / split)
        self.annotation_file = self.root / "annotations" / f"instances_{split}.json"
        self.transforms = transforms
        if not self.image_dir.is_dir():
            raise DataError(f"no image folder for split {split} in {self.root}: looked for {_looked_for(split)}")
        self.coco = _open_coco(self.annotation_file)
        self.category_ids = sorted(self.coco.cats)  # label i + 1 is category_ids[i]
        self._label_of = {c: i + 1 for i, c in enumerate(self.category_ids)}
        self.class_names = ["__background__"] + [self.coco.cats[c].get("name", str(c)) for c in self.category_ids]
        self.image_ids = sorted(self.coco.imgs)
        self._check_images()
        self._annotations = self._valid_annotations()

    @property
    def num_classes(self) -> int:
        """Categories plus the background: what :func:`build_maskrcnn` takes as ``num_classes``."""
        return len(self.category_ids) + 1

    def label_to_category(self, label: int) -> int:
        """The COCO category id of model label ``label`` (1..K)."""
        return self.category_ids[label - 1]

    def _check_images(self) -> None:
        on_disk = {p.name for p in self.image_dir.iterdir()}
        names = (self.coco.imgs[i]["file_name"] for i in self.image_ids)
        missing = [n for n in names if n not in on_disk and not (self.image_dir / n).is_file()]  # is_file: names with folders
        if missing:
            shown = ", ".join(missing[:NAMES_SHOWN]) + (", ..." if len(missing) > NAMES_SHOWN else "")
            raise DataError(f"{self.annotation_file.name} names {len(missing)} image(s) not in {self.image_dir} "
                            f"({shown}); add the images or remove their entries from the file")

    def _valid_annotations(self) -> dict[int, list[dict[str, Any]]]:
        """Each image's annotations with a positive box (the file was checked as it was opened)."""
        anns = [a for i in self.image_ids for a in self.coco.imgToAnns.get(i, [])]
        xywh = np.asarray([a["bbox"] for a in anns], dtype=np.float64).reshape(-1, 4)
        # x + w > x in float32, as the model will see the box: drops zero, negative and vanishing sizes
        positive = ((xywh[:, :2] + xywh[:, 2:]).astype(np.float32) > xywh[:, :2].astype(np.float32)).all(axis=1)
        if not positive.all():
            warnings.warn(f"{self.annotation_file}: dropped {int((~positive).sum())} annotation(s) whose box has "
                          "zero or negative width or height", DroppedBoxesWarning, stacklevel=3)
        kept: dict[int, list[dict[str, Any]]] = {i: [] for i in self.image_ids}
        for ann, keep in zip(anns, positive.tolist()):
            if keep:
                kept[ann["image_id"]].append(ann)
        return kept

    def __len__(self) -> int:
        return len(self.image_ids)

    def __getitem__(self, index: int) -> tuple[Tensor, Target]:
        image_id = self.image_ids[index]
        info = self.coco.imgs[image_id]
        path = self.image_dir / info["file_name"]
        try:
            with Image.open(path) as pil:
                image = pil_to_tensor(pil.convert("RGB"))  # (3, H, W) uint8
        except OSError as exc:  # PIL raises OSError subclasses for unreadable files
            raise DataError(f"cannot read image {path} ({exc}); replace the file or remove its entry") from None
        height, width = image.shape[-2:]
        if (height, width) != (info["height"], info["width"]):
            raise DataError(f"{path} is {width}x{height} but {self.annotation_file.name} says "
                            f"{info['width']}x{info['height']}; fix its width and height")
        anns = self._annotations[image_id]
        boxes = torch.tensor([a["bbox"] for a in anns], dtype=torch.float32).reshape(-1, 4)
        boxes[:, 2:] += boxes[:, :2]  # xywh -> xyxy
        masks = [torch.from_numpy(self.coco.annToMask(a)) for a in anns]
        target = {
            "boxes": boxes,
            "labels": torch.tensor([self._label_of[a["category_id"]] for a in anns], dtype=torch.int64),
            "masks": torch.stack(masks) if masks else torch.zeros((0, height, width), dtype=torch.uint8),
            "image_id": torch.tensor(image_id, dtype=torch.int64),
            "area": torch.tensor([float(a.get("area", 0.0)) for a in anns], dtype=torch.float32),
            "iscrowd": torch.tensor([int(a.get("iscrowd", 0)) for a in anns], dtype=torch.int64),
        }
        image = image.float() / 255
        if self.transforms is not None:
            image, target = self.transforms(image, target)
        return image, target


def drop_crowd(target: Target) -> Target:
    """``target`` without its crowd regions: a detector must not learn them as objects. COCO's
    evaluation still reads them from the annotation file, to ignore detections that fall on them."""
    keep = target["iscrowd"] == 0
    return {k: v[keep] if k in INSTANCE_KEYS else v for k, v in target.items()}


def collate(batch: list[tuple[Tensor, Target]]) -> tuple[list[Tensor], list[Target]]:
    """A list of images (sizes may differ) and a list of targets, as torchvision's detectors take them."""
    images, targets = zip(*batch)
    return list(images), list(targets)


def horizontal_flip(image: Tensor, target: Target) -> tuple[Tensor, Target]:
    """The image, its masks and its boxes mirrored left to right."""
    width = image.shape[-1]
    target = dict(target)
    target["masks"] = target["masks"].flip(-1)
    target["boxes"] = torch.stack([width - target["boxes"][:, 2], target["boxes"][:, 1],
                                   width - target["boxes"][:, 0], target["boxes"][:, 3]], dim=1)
    return image.flip(-1), target


class RandomFlip:
    """Flip with probability ``flip`` and nothing else: the model's own transform resizes the image
    (short side ``min_size``, long side at most ``max_size``), the 1× schedule's training pipeline."""

    def __init__(self, flip: float = 0.5):
        self.flip = flip

    def __call__(self, image: Tensor, target: Target) -> tuple[Tensor, Target]:
        return horizontal_flip(image, target) if random.random() < self.flip else (image, dict(target))


class LargeScaleJitter:
    """Large-scale jitter (Ghiasi et al., 2021), ViTDet's training augmentation.

    Flip with probability ``flip``, resize so the image fits a square of side ``s * size`` with
    ``s ~ U(scale_range)``, take a random ``size``² crop, pad to ``size``² with the ImageNet mean
    (which normalises to zero, like the model's own batch padding). Instances left with no box area
    are dropped. Draws from Python's ``random``, so ``weightformer.data.seeded_rng`` fixes a sample.
    """

    def __init__(self, size: int = 1024, scale_range: tuple[float, float] = (0.1, 2.0), flip: float = 0.5):
        self.size = size
        self.scale_range = scale_range
        self.flip = flip

    def __call__(self, image: Tensor, target: Target) -> tuple[Tensor, Target]:
        target = dict(target)
        height, width = image.shape[-2:]
        if random.random() < self.flip:
            image, target = horizontal_flip(image, target)
        scale = random.uniform(*self.scale_range) * self.size / max(height, width)
        new_h, new_w = max(1, round(height * scale)), max(1, round(width * scale))
        image = F.interpolate(image[None], size=(new_h, new_w), mode="bilinear", align_corners=False)[0]
        masks = target["masks"]  # (N, H, W); interpolate rejects N = 0
        masks = (F.interpolate(masks[None], size=(new_h, new_w), mode="nearest")[0] if len(masks)
                 else masks.new_zeros((0, new_h, new_w)))
        boxes = target["boxes"] * torch.tensor([new_w / width, new_h / height] * 2)
        top = random.randint(0, max(0, new_h - self.size))
        left = random.randint(0, max(0, new_w - self.size))
        image = image[:, top:top + self.size, left:left + self.size]
        masks = masks[:, top:top + self.size, left:left + self.size]
        crop_h, crop_w = image.shape[-2:]
        boxes = boxes - torch.tensor([left, top, left, top], dtype=boxes.dtype)
        boxes[:, 0::2] = boxes[:, 0::2].clamp(0, crop_w)
        boxes[:, 1::2] = boxes[:, 1::2].clamp(0, crop_h)
        pad = (0, self.size - crop_w, 0, self.size - crop_h)
        mean = torch.tensor(IMAGENET_DEFAULT_MEAN, dtype=image.dtype)[:, None, None]
        image = F.pad(image - mean, pad) + mean
        masks = F.pad(masks, pad)
        keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
        target.update(boxes=boxes, masks=masks)
        target.update({k: target[k][keep] for k in INSTANCE_KEYS})
        return image, target


class SeededJitterDataset(Dataset):
    """``transforms(*base[i])`` with the randomness fixed by (seed, epoch, i), as
    :class:`weightformer.data.SeededTransformDataset` does for classification: the augmentation of a
    sample does not depend on workers or on where a run resumed. The loop calls :meth:`set_epoch`."""

    def __init__(self, base: CocoDetection, transforms: Transform, seed: int):
        self.base = base
        self.transforms = transforms
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> tuple[Tensor, Target]:
        image, target = self.base[index]
        with seeded_rng(sample_seed(self.seed, self.epoch, index)):
            return self.transforms(image, target)
