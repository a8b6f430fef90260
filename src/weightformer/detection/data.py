"""COCO instances of one split as a data set (:class:`CocoDetection`), its annotation file checked as it opens
(:mod:`.annotations`). Images stay at their stored size: the model's ``GeneralizedRCNNTransform`` resizes,
normalises and batches them; training augmentations are in :mod:`.transforms`."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torch.utils.data import Dataset
from torchvision.transforms.functional import pil_to_tensor

from ..data.errors import DataError
from .annotations import DroppedAnnotationsWarning, listed, open_instances
from .layout import locate_split, looked_for

__all__ = ["INSTANCE_KEYS", "CocoDetection", "DroppedBoxesWarning", "Target", "collate", "drop_crowd"]

Target = dict[str, Tensor]
Transform = Callable[[Tensor, Target], tuple[Tensor, Target]]
INSTANCE_KEYS = ("boxes", "labels", "masks", "area", "iscrowd")  # target entries with one row per instance


class DroppedBoxesWarning(DroppedAnnotationsWarning):
    """Annotations with boxes of zero or negative width or height were left out of the training targets."""


class CocoDetection(Dataset):
    """COCO instances of split ``split`` (images in ``images/<split>/`` or ``<split>/``), as (image (3, H, W)
    float in [0, 1], target) pairs. The target holds boxes (N, 4) float xyxy in pixels, labels (N,) int64 in
    1..K (categories in order of id: :attr:`category_ids`), masks (N, H, W) uint8, image_id, area (N,) and
    iscrowd (N,) (crowds stay: :func:`drop_crowd`); N may be 0. ``transforms``: ``(image, target) -> (image,
    target)``, e.g. :class:`LargeScaleJitter`."""

    def __init__(self, root: str | Path, split: str, transforms: Optional[Transform] = None):
        self.root = Path(root).expanduser()
        self.split, self.image_dir, self.annotation_file = locate_split(self.root, split)
        self.transforms = transforms
        if not self.image_dir.is_dir():
            raise DataError(f"no image folder for split {split} in {self.root}: looked for {looked_for(split)}")
        self.coco = open_instances(self.annotation_file)
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

    def drop_unannotated(self) -> int:
        """Leave out the images with no non-crowd object (detectron2's ``filter_empty_annotations``, which
        training applies and evaluation does not); returns how many were left out."""
        kept = [i for i in self.image_ids if any(not a.get("iscrowd", 0) for a in self._annotations[i])]
        dropped, self.image_ids = len(self.image_ids) - len(kept), kept
        return dropped

    def _check_images(self) -> None:
        on_disk = {p.name for p in self.image_dir.iterdir()}
        names = (self.coco.imgs[i]["file_name"] for i in self.image_ids)
        # is_file: names with folders
        missing = [n for n in names if n not in on_disk and not (self.image_dir / n).is_file()]
        if missing:
            raise DataError(f"{self.annotation_file.name} names {len(missing)} image(s) not in {self.image_dir} "
                            f"({listed(missing, 3)}); add the images or remove their entries from the file")

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
        labels = [self._label_of[a["category_id"]] for a in anns]
        target = {"boxes": boxes, "labels": torch.tensor(labels, dtype=torch.int64),
                  "masks": torch.stack(masks) if masks else torch.zeros((0, height, width), dtype=torch.uint8),
                  "image_id": torch.tensor(image_id, dtype=torch.int64),
                  "area": torch.tensor([float(a.get("area", 0.0)) for a in anns], dtype=torch.float32),
                  "iscrowd": torch.tensor([int(a.get("iscrowd", 0)) for a in anns], dtype=torch.int64)}
        image = image.float() / 255
        if self.transforms is not None:
            image, target = self.transforms(image, target)
        return image, target


def drop_crowd(target: Target) -> Target:
    """``target`` without its crowd regions, which a detector must not learn as objects (COCOeval reads them
    from the annotation file, to ignore detections on them)."""
    keep = target["iscrowd"] == 0
    return {k: v[keep] if k in INSTANCE_KEYS else v for k, v in target.items()}


def collate(batch: list[tuple[Tensor, Target]]) -> tuple[list[Tensor], list[Target]]:
    """A list of images (sizes may differ) and a list of targets, as torchvision's detectors take them."""
    images, targets = zip(*batch)
    return list(images), list(targets)
