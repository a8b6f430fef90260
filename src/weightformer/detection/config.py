"""Detection's settings: the engine's, plus the detector's (cascade, protocol, its own keyword arguments,
classes, resizing) and the COCO splits to read. The values that suit a data set come from the task's
recipes (``configs/detection/``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Optional

from ..engine.config import setting
from ..engine.errors import ConfigError
from ..long_range import LongRangeConfig
from .synthetic import SHAPES_NAME as SHAPES

__all__ = ["DEFAULT_PROTOCOL", "DETECTOR_KWARGS", "LEGACY_FALLBACK_PROTOCOL", "PROTOCOLS", "RESIZE_MODES",
           "DetectionConfig"]

RESIZE_MODES = ("lsj", "shortest_edge")
# The detector's training protocols (weightformer.detection.model.PROTOCOL_SETTINGS has what each sets):
# vitdet, detectron2's as ViTDet and Vim run it; torchvision, torchvision's parts at their defaults.
PROTOCOLS = ("vitdet", "torchvision")
DEFAULT_PROTOCOL = "vitdet"  # a run's and build_maskrcnn's when nothing names one: the reference
LEGACY_FALLBACK_PROTOCOL = "torchvision"  # only for reading a checkpoint or run that names no protocol
# The detector's keyword arguments (build_maskrcnn's): the pyramid's and box head's widths, and
# torchvision's RPN (rpn_*) and RoI-head (box_*) settings.
DETECTOR_KWARGS = ("conv_dim", "fc_dim", "rpn_", "box_", "bbox_")


def _split_name(value: Optional[str]) -> bool:
    return value is None or (bool(value) and "/" not in value and "\\" not in value and value not in (".", ".."))


@dataclass
class DetectionConfig(LongRangeConfig):
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
    # Keyword arguments of the detector (build_maskrcnn), apart from model_kwargs, the backbone's.
    detector_kwargs: dict[str, Any] = field(default_factory=dict)
    det_protocol: str = setting(DEFAULT_PROTOCOL, flag="--protocol", choices=PROTOCOLS,
                                help="vitdet: detectron2's Mask R-CNN and Cascade Mask R-CNN as ViTDet and Vim run "
                                     "them (aligned RoIAlign, L1 box losses, 1000 proposals, unweighted cascade stages "
                                     "with 1/3 of the gradient, no final norm before the pyramid); torchvision: "
                                     "torchvision's parts at their defaults with mmdet's stage weights (docs/dense.md)")
    # lsj: large-scale jitter to img_size² crops, evaluation with the long side at img_size (ViTDet's);
    # shortest_edge: short side img_size, long side at most det_max_size, flips only (the 1x schedule's).
    det_resize: str = setting("lsj", help="lsj: large-scale jitter to --img-size² crops (ViTDet); shortest_edge: "
                                          "short side --img-size, long side at most --det-max-size, flips only "
                                          "(the 1x schedule)", choices=RESIZE_MODES)
    det_max_size: int = setting(1333, help="shortest_edge: the long side's limit in pixels")
    # None: the first split of detection.layout.SPLIT_NAMES the folder holds.
    train_split: Optional[str] = setting(None, metavar="NAME", help="the training split: images/NAME/ (or NAME/) and "
                                         "annotations/instances_NAME.json (default: train2017, else train)")
    val_split: Optional[str] = setting(None, metavar="NAME", help="the validation split, named as --train-split "
                                       "(default: val2017, else val)")

    RULES: ClassVar[tuple[tuple[str, Callable[[Any], bool], str], ...]] = (
        ("num_classes", lambda v: v is None or v >= 1, "at least 1, or null for the data's own"),
        ("det_resize", lambda v: v in RESIZE_MODES, "lsj or shortest_edge"),
        ("det_protocol", lambda v: v in PROTOCOLS, " or ".join(PROTOCOLS)),
        ("det_max_size", lambda v: v >= 1, "a positive number of pixels"),
        ("train_split", _split_name, "a split name such as train2017 (a folder name, not a path), or null to find it"),
        ("val_split", _split_name, "a split name such as val2017 (a folder name, not a path), or null to find it"),
    )

    def __post_init__(self) -> None:
        """Detector keywords given in ``model_kwargs`` (``--model-kwargs conv_dim=128``, a run saved with
        one mapping for both) move to ``detector_kwargs``, over its values."""
        if isinstance(self.model_kwargs, dict) and isinstance(self.detector_kwargs, dict):
            self.model_kwargs, detector = split_model_kwargs(self.model_kwargs)
            self.detector_kwargs = {**self.detector_kwargs, **detector}

    def check(self) -> None:
        super().check()
        backbone, _ = split_model_kwargs(self.detector_kwargs)
        if backbone:
            raise ConfigError(f"detector_kwargs {sorted(backbone)} are not the detector's; its keywords are conv_dim, "
                              f"fc_dim, rpn_*, box_* and bbox_* (build_maskrcnn's), the backbone's go in model_kwargs")


def split_model_kwargs(kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(backbone kwargs, detector kwargs)`` of one mapping that holds both, by name (:data:`DETECTOR_KWARGS`):
    how a checkpoint or run saved without ``detector_kwargs`` maps to the two."""
    detector = {k: v for k, v in kwargs.items() if k.startswith(DETECTOR_KWARGS)}
    return {k: v for k, v in kwargs.items() if k not in detector}, detector
