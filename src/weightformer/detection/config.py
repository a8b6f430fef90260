"""Detection's settings: the engine's, plus the detector's (cascade, classes, resizing) and the COCO
splits to read. The values that suit a data set come from the task's recipes
(:mod:`weightformer.detection.recipes`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Optional

from ..engine.config import TrainConfig, setting
from ..engine.errors import ConfigError
from ..models.names import unknown_timm_model
from .synthetic import SHAPES_NAME as SHAPES

__all__ = ["RESIZE_MODES", "DetectionConfig"]

RESIZE_MODES = ("lsj", "shortest_edge")


def _split_name(value: Optional[str]) -> bool:
    return value is None or (bool(value) and "/" not in value and "\\" not in value and value not in (".", ".."))


@dataclass
class DetectionConfig(TrainConfig):
    """A detection run: Mask R-CNN or Cascade Mask R-CNN on a timm backbone, COCO-layout data."""

    data: str = setting(SHAPES, help="a COCO-layout folder: COCO 2017 as downloaded (images/train2017/ or "
                                     "train2017/, annotations/instances_train2017.json, the same for val2017), or "
                                     "images/<split>/ with annotations/instances_<split>.json; or shapes, the "
                                     "offline set")
    model: str = setting("weightformer_tiny", help="the backbone: a timm model with forward_intermediates "
                                                   "(WeightFormer, DeiT, ...)")
    num_classes: Optional[int] = setting(None, help="number of categories (default: those the COCO annotation "
                                                    "file declares)")
    cascade: bool = setting(False, help="Cascade Mask R-CNN (three box stages) instead of Mask R-CNN")
    # lsj: large-scale jitter to img_size² crops, evaluation with the long side at img_size (ViTDet's);
    # shortest_edge: short side img_size, long side at most det_max_size, flips only (the 1x schedule's).
    det_resize: str = setting("lsj", help="lsj: large-scale jitter to --img-size² crops (ViTDet); shortest_edge: "
                                          "short side --img-size, long side at most --det-max-size, flips only "
                                          "(the 1x schedule)", choices=RESIZE_MODES)
    det_max_size: int = setting(1333, help="shortest_edge: the long side's limit in pixels")
    # None: the first split of detection.data.SPLIT_NAMES the folder holds.
    train_split: Optional[str] = setting(None, metavar="NAME", help="the training split: images/NAME/ (or NAME/) and "
                                         "annotations/instances_NAME.json (default: train2017, else train)")
    val_split: Optional[str] = setting(None, metavar="NAME", help="the validation split, named as --train-split "
                                       "(default: val2017, else val)")

    RULES: ClassVar[tuple[tuple[str, Callable[[Any], bool], str], ...]] = (
        ("num_classes", lambda v: v is None or v >= 1, "at least 1, or null for the data's own"),
        ("det_resize", lambda v: v in RESIZE_MODES, "lsj or shortest_edge"),
        ("det_max_size", lambda v: v >= 1, "a positive number of pixels"),
        ("train_split", _split_name, "a split name such as train2017 (a folder name, not a path), or null to find it"),
        ("val_split", _split_name, "a split name such as val2017 (a folder name, not a path), or null to find it"),
    )

    def check(self) -> None:
        super().check()
        problem = unknown_timm_model(self.model)
        if problem:
            raise ConfigError(problem)
