"""Segmentation's settings: the engine's, plus the classes of the data and how evaluation predicts; the
recipes (``configs/segmentation/``) set values for a data set."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Optional

from ..engine.config import setting
from ..engine.errors import ConfigError
from ..long_range import LongRangeConfig
from .synthetic import SHAPES_NAME

IGNORE_INDEX = 255  # the label that no loss or metric counts (mmseg's); defined here, torch-free, for the CLI

__all__ = ["DEFAULT_PROTOCOL", "IGNORE_INDEX", "INFERENCE_MODES", "LAYER_DECAY_SCOPES", "PROTOCOL_KWARGS", "PROTOCOLS",
           "SegmentationConfig", "check_windows"]

INFERENCE_MODES = ("whole", "slide")  # --inference
PROTOCOLS = ("vim", "simple-pyramid")  # --protocol: the pyramid UperNet reads (segmentation.model)
DEFAULT_PROTOCOL = "simple-pyramid"
PROTOCOL_KWARGS = ("channels", "pyramid_channels", "out_indices")  # the head and neck model kwargs, per protocol
LAYER_DECAY_SCOPES = ("per-block", "stem-only")  # --layer-decay-scope


@dataclass
class SegmentationConfig(LongRangeConfig):
    """A segmentation run: an UperNet on a timm backbone, on ADE20K-layout data or the offline shapes set."""

    data: str = setting(SHAPES_NAME, help="ADE20K's ADEChallengeData2016 (or the folder it was unpacked in), any "
                                          "folder with images/{training,validation}/ and "
                                          "annotations/{training,validation}/, or shapes, the offline set")
    model: str = setting("weightformer_tiny", help="the backbone: any timm model name")
    num_classes: Optional[int] = setting(None, help="classes of the data (default: the data's: shapes' 4, ADE20K's "
                                                    "objectInfo150.txt, else the largest label in the annotations)")
    reduce_zero_label: bool = setting(True, flag="--no-reduce-zero-label", help="label 0 is a class (default: 0 is "
                                      "unlabelled and ignored, value v is class v-1)")
    seg_inference: str = setting("whole", flag="--inference", choices=INFERENCE_MODES,
                                 help="evaluate whole images, or overlapping crops")
    seg_crop: int = setting(512, flag="--crop", metavar="PX", help="sliding-window crop in pixels")
    seg_stride: int = setting(341, flag="--stride", metavar="PX", help="sliding-window stride in pixels")
    seg_protocol: str = setting(DEFAULT_PROTOCOL, flag="--protocol", choices=PROTOCOLS, help="the features UperNet "
                                "reads: vim, four blocks spread over the depth at strides 4-32 (BEiT's and Vim's ViT "
                                "UperNet, the paper's comparison), or simple-pyramid, ViTDet's pyramid on the last "
                                "block")
    seg_layer_decay: str = setting("per-block", flag="--layer-decay-scope", choices=LAYER_DECAY_SCOPES,
                                   help="what --layer-decay decays: per-block, block i of L at decay^(L-i) and the "
                                        "stem at decay^(L+1) (BEiT's rule, which Vim's config asks for), or "
                                        "stem-only, the stem alone at decay^(L+1) (what Vim's runs do: its blocks "
                                        "are named layers, which BEiT's rule does not match)")

    RULES: ClassVar[tuple[tuple[str, Callable[[Any], bool], str], ...]] = (
        ("num_classes", lambda v: v is None or 1 <= v <= IGNORE_INDEX,
         f"in [1, {IGNORE_INDEX}] (label {IGNORE_INDEX} is ignored), or null for the data's own"),
        ("seg_inference", lambda v: v in INFERENCE_MODES, " or ".join(INFERENCE_MODES)),
        ("seg_protocol", lambda v: v in PROTOCOLS, " or ".join(PROTOCOLS)),
        ("seg_layer_decay", lambda v: v in LAYER_DECAY_SCOPES, " or ".join(LAYER_DECAY_SCOPES)),
        ("seg_crop", lambda v: v >= 1, "a positive number of pixels"),
        ("seg_stride", lambda v: v >= 1, "a positive number of pixels"),
    )

    def check(self) -> None:
        super().check()
        check_windows(self.seg_inference, self.seg_crop, self.seg_stride)


def check_windows(mode: str, crop: int, stride: int) -> None:
    """Sliding windows must cover every pixel: a stride of at most the crop; ConfigError otherwise."""
    if mode == "slide" and stride > crop:
        raise ConfigError(f"sliding-window stride {stride} is larger than the crop {crop}: the windows would leave "
                          f"pixels out; pass a --stride of at most --crop")
