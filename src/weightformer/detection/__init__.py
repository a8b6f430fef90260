"""COCO detection and instance segmentation: Mask R-CNN and Cascade Mask R-CNN on torchvision's detectors.

:func:`build_maskrcnn` builds the model on a feature pyramid; :class:`CocoDetection` reads the COCO
layout; :class:`CocoEvaluator` scores predictions with pycocotools; :func:`draw_detections` draws
them; :class:`DetectionTask` is what the training engine runs; ``weightformer det`` is its command line
(:mod:`.cli`), and ``--data shapes`` an offline data set (:mod:`.synthetic`).
"""

from .cascade import AgnosticBoxPredictor, CascadeRoIHeads
from .data import CocoDetection, DroppedBoxesWarning, LargeScaleJitter, SeededJitterDataset, collate, drop_crowd
from .evaluation import METRIC_NAMES, CocoEvaluator
from .model import build_maskrcnn
from .task import DetectionTask, build_detector, evaluate, training_loss
from .visualize import draw_detections, save_visualizations

__all__ = [
    "METRIC_NAMES",
    "AgnosticBoxPredictor",
    "CascadeRoIHeads",
    "CocoDetection",
    "CocoEvaluator",
    "DetectionTask",
    "DroppedBoxesWarning",
    "LargeScaleJitter",
    "SeededJitterDataset",
    "build_detector",
    "build_maskrcnn",
    "collate",
    "draw_detections",
    "drop_crowd",
    "evaluate",
    "save_visualizations",
    "training_loss",
]
