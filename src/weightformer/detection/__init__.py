"""COCO detection and instance segmentation: Mask R-CNN and Cascade Mask R-CNN on torchvision's detectors.

:func:`build_maskrcnn` builds the model on a feature pyramid; :class:`CocoDetection` reads the COCO
layout; :class:`CocoEvaluator` scores predictions with pycocotools; :func:`draw_detections` draws
them; :func:`training_loss` and :func:`evaluate` are what a training engine calls.
"""

from .cascade import AgnosticBoxPredictor, CascadeRoIHeads
from .data import CocoDetection, DroppedBoxesWarning, LargeScaleJitter, collate, drop_crowd
from .evaluation import METRIC_NAMES, CocoEvaluator
from .model import build_maskrcnn
from .task import evaluate, training_loss
from .visualize import draw_detections, save_visualizations

__all__ = [
    "METRIC_NAMES",
    "AgnosticBoxPredictor",
    "CascadeRoIHeads",
    "CocoDetection",
    "CocoEvaluator",
    "DroppedBoxesWarning",
    "LargeScaleJitter",
    "build_maskrcnn",
    "collate",
    "draw_detections",
    "drop_crowd",
    "evaluate",
    "save_visualizations",
    "training_loss",
]
