"""Detection's settings: the engine's, plus the detector's (cascade, protocol, keyword arguments, classes,
resizing) and the COCO splits to read; the recipes (``configs/detection/``) set values for a data set."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Optional

from ..engine.config import setting
from ..engine.errors import ConfigError
from ..long_range import LongRangeConfig
from .synthetic import SHAPES_NAME as SHAPES

__all__ = ["DEFAULT_PROTOCOL", "DETECTOR_KWARGS", "LEGACY_FALLBACK_PROTOCOL", "PROTOCOLS", "RESIZE_MODES",
           "SIZE_DIVISOR", "DetectionConfig", "canvas_side"]

RESIZE_MODES = ("lsj", "shortest_edge")
PROTOCOLS = ("vitdet", "torchvision")  # the detector's training protocols (detection.model.PROTOCOL_SETTINGS)
DEFAULT_PROTOCOL = "vitdet"  # a run's and build_maskrcnn's when nothing names one: the reference
LEGACY_FALLBACK_PROTOCOL = "torchvision"  # only for reading a checkpoint or run that names no protocol
# The detector's keyword arguments (build_maskrcnn's): its widths and torchvision's RPN and RoI-head settings.
DETECTOR_KWARGS = ("conv_dim", "fc_dim", "rpn_", "box_", "bbox_")
SIZE_DIVISOR = 32  # the pyramid's coarsest stride: a canvas side is a multiple of it


def canvas_side(max_size: int) -> int:
    """The smallest canvas that holds an image resized to long side ``max_size``."""
    return SIZE_DIVISOR * -(-max_size // SIZE_DIVISOR)


def _split_name(value: Optional[str]) -> bool:
    return value is None or (bool(value) and "/" not in value and "\\" not in value and value not in (".", ".."))


@dataclass
class DetectionConfig(LongRangeConfig):
    """A detection run: Mask R-CNN or Cascade Mask R-CNN on a timm backbone, COCO-layout data."""

    data: str = setting(SHAPES, help="a COCO-layout folder: COCO 2017 as downloaded (images/train2017/ or train2017/, "
                                     "annotations/instances_train2017.json, the same for val2017), or images/<split>/ "
                                     "with annotations/instances_<split>.json; or shapes, the offline set")
    model: str = setting("weightformer_tiny", help="the backbone: a timm model with forward_intermediates "
                                                   "(WeightFormer, DeiT, ...)")
    num_classes: Optional[int] = setting(None, help="number of categories (default: the COCO annotation file's)")
    cascade: bool = setting(False, help="Cascade Mask R-CNN (three box stages) instead of Mask R-CNN")
    # Keyword arguments of the detector (build_maskrcnn), apart from model_kwargs, the backbone's.
    detector_kwargs: dict[str, Any] = field(default_factory=dict)
    det_protocol: str = setting(DEFAULT_PROTOCOL, flag="--protocol", choices=PROTOCOLS,
                                help="vitdet: detectron2's, as ViTDet and Vim train (aligned RoIAlign, L1 box losses, "
                                     "1000 proposals, unweighted cascade stages); torchvision: torchvision's defaults "
                                     "with mmdet's stage weights (docs/dense.md)")
    det_resize: str = setting("lsj", choices=RESIZE_MODES, help="lsj: large-scale jitter to --img-size² crops "
                              "(ViTDet); shortest_edge: short side --img-size, long side at most --det-max-size, "
                              "flips only (the 1x schedule)")
    det_max_size: int = setting(1333, help="shortest_edge: the long side's limit in pixels")
    det_canvas: Optional[int] = setting(None, metavar="PIXELS", help="the square every image is padded to, in "
                                        "training and evaluation alike, so that its detections do not depend on "
                                        "its batch (default: the resized images' long side, img_size for lsj or "
                                        "det_max_size for shortest_edge, rounded up to a multiple of 32)")
    train_split: Optional[str] = setting(None, metavar="NAME", help="the training split: images/NAME/ (or NAME/) and "
                                         "annotations/instances_NAME.json (default: train2017, else train)")
    val_split: Optional[str] = setting(None, metavar="NAME", help="the validation split (default: val2017, else val)")

    RULES: ClassVar[tuple[tuple[str, Callable[[Any], bool], str], ...]] = (
        ("num_classes", lambda v: v is None or v >= 1, "at least 1, or null for the data's own"),
        ("det_resize", lambda v: v in RESIZE_MODES, "lsj or shortest_edge"),
        ("det_protocol", lambda v: v in PROTOCOLS, " or ".join(PROTOCOLS)),
        ("det_max_size", lambda v: v >= 1, "a positive number of pixels"),
        ("det_canvas", lambda v: v is None or (v >= SIZE_DIVISOR and v % SIZE_DIVISOR == 0),
         f"a multiple of {SIZE_DIVISOR} pixels, or null for the smallest that holds the images"),
        ("train_split", _split_name, "a split name such as train2017 (a folder name, not a path), or null to find it"),
        ("val_split", _split_name, "a split name such as val2017 (a folder name, not a path), or null to find it"),
    )

    def __post_init__(self) -> None:
        """Detector keywords given in ``model_kwargs`` (``--model-kwargs conv_dim=128``) move to ``detector_kwargs``."""
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
    """``(backbone kwargs, detector kwargs)`` of one mapping that holds both, by name (:data:`DETECTOR_KWARGS`)."""
    detector = {k: v for k, v in kwargs.items() if k.startswith(DETECTOR_KWARGS)}
    return {k: v for k, v in kwargs.items() if k not in detector}, detector
