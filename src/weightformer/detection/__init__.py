"""COCO detection and instance segmentation: Mask R-CNN and Cascade Mask R-CNN on torchvision's detectors.

:class:`DetectionTask` is the whole task (its settings :class:`DetectionConfig`, its recipes in
:mod:`.recipes`, ``weightformer det train|eval|predict`` in :mod:`.cli`); :func:`build_maskrcnn` builds
the model on a feature pyramid; :class:`CocoDetection` reads the COCO layout (:func:`find_split`
finds a split); :class:`CocoEvaluator` scores predictions with pycocotools; :func:`evaluate_checkpoint`
and :func:`predict` evaluate a checkpoint and run it on images; :func:`draw_detections` draws
detections; ``--data shapes`` is an offline data set (:mod:`.synthetic`).
"""

from .cascade import AgnosticBoxPredictor, CascadeRoIHeads
from .config import DetectionConfig
from .data import CocoDetection, DroppedBoxesWarning, LargeScaleJitter, SeededJitterDataset, collate, drop_crowd, find_split
from .evaluation import METRIC_NAMES, CocoEvaluator, evaluate, evaluate_checkpoint
from .model import build_maskrcnn
from .predict import predict
from .task import DetectionTask, build_detector, training_loss
from .visualize import draw_detections, save_visualizations

__all__ = [
    "METRIC_NAMES",
    "AgnosticBoxPredictor",
    "CascadeRoIHeads",
    "CocoDetection",
    "CocoEvaluator",
    "DetectionConfig",
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
    "evaluate_checkpoint",
    "find_split",
    "predict",
    "save_visualizations",
    "training_loss",
]
