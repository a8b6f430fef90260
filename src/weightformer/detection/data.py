"""COCO-layout instance data: a split's images in ``images/<split>/`` (or ``<split>/`` beside
``annotations/``) and its instances in ``annotations/instances_<split>.json``.

That covers COCO 2017 as downloaded (``train2017``/``val2017``, images under ``images/`` or not) and
the plain ``train``/``val`` names; :func:`find_split` picks a split by its role (training or
validation) when the user names none, and a folder that fits no layout is one :class:`DataError`
line listing what was looked for.

The data set checks the annotation file when it opens, so a bad file stops a run before it starts
with one :class:`DataError` line: an image the file names but the folder lacks, an annotation whose
category is not declared, an annotation without a box or segmentation. Boxes of zero or negative
width or height are dropped with one warning line; images without annotations stay, as negatives.

Division of work with the model: the data set returns float images in [0, 1] at their stored size
(or, with :class:`LargeScaleJitter`, 1024² training crops); the model's ``GeneralizedRCNNTransform``
resizes, normalises and batches them, and maps eval predictions back to the stored size.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import warnings
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from pycocotools.coco import COCO
from timm.data import IMAGENET_DEFAULT_MEAN
from torch import Tensor
from torch.utils.data import Dataset
from torchvision.transforms.functional import pil_to_tensor

from ..data.errors import DataError
from ..data.transforms import sample_seed, seeded_rng
from . import synthetic

__all__ = ["SPLIT_NAMES", "CocoDetection", "CocoSplit", "DroppedBoxesWarning", "LargeScaleJitter", "SeededJitterDataset",
           "collate", "data_root", "drop_crowd", "find_split", "split_files"]

Target = dict[str, Tensor]
Transform = Callable[[Tensor, Target], tuple[Tensor, Target]]
INSTANCE_KEYS = ("boxes", "labels", "masks", "area", "iscrowd")  # target entries with one row per instance
NAMES_SHOWN = 3  # missing image names quoted in the error line
# The split names tried, in order, for each role when the user names none: COCO 2017's, then the plain ones.
SPLIT_NAMES = {"train": ("train2017", "train"), "val": ("val2017", "val")}
SPLIT_FLAGS = {"train": "--train-split", "val": "--val-split"}


class DroppedBoxesWarning(UserWarning):
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


def _open_coco(path: Path) -> COCO:
    if not path.is_file():
        raise DataError(f"no annotation file {path}; COCO data needs annotations/instances_<split>.json")
    try:
        with path.open("rb") as f:
            content = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"cannot read {path} as JSON ({str(exc).splitlines()[0]}); re-export the annotation file") from None
    missing = [key for key in ("images", "annotations", "categories") if not isinstance(content, dict) or key not in content]
    if missing:
        raise DataError(f"{path} has no {', '.join(missing)} list; it is not a COCO instances file")
    coco = COCO()
    coco.dataset = content
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
        """Each image's annotations with a positive box; raises on undeclared categories."""
        anns = [a for i in self.image_ids for a in self.coco.imgToAnns.get(i, [])]
        for ann in anns:
            where = f"annotation {ann.get('id')} of {self.coco.imgs[ann['image_id']]['file_name']}"
            if ann.get("category_id") not in self.coco.cats:
                raise DataError(f"{where} has category_id {ann.get('category_id')}, which {self.annotation_file.name} "
                                "does not declare under categories; fix the id or add the category")
            if "segmentation" not in ann or not (isinstance(ann.get("bbox"), list) and len(ann["bbox"]) == 4):
                raise DataError(f"{where} lacks a segmentation or an [x, y, width, height] bbox; "
                                "instance segmentation needs both")
        xywh = np.asarray([a["bbox"] for a in anns], dtype=np.float64).reshape(-1, 4)
        # x + w > x in float32, as the model will see the box: drops zero, negative and vanishing sizes
        positive = ((xywh[:, :2] + xywh[:, 2:]).astype(np.float32) > xywh[:, :2].astype(np.float32)).all(axis=1)
        if not positive.all():
            warnings.warn(f"{self.annotation_file.name}: dropped {int((~positive).sum())} annotation(s) whose box has "
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
