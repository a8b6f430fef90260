"""Semantic segmentation: ADE20K-layout data, an UperNet model on a feature pyramid, inference and mIoU.

``build_upernet(backbone, num_classes)`` makes the model, :class:`SegmentationFolder` reads the
data, ``training_loss`` and ``evaluate`` are what a training loop calls.
"""

from .data import (
    IGNORE_INDEX,
    EvalTransform,
    SegmentationBatch,
    SegmentationFolder,
    TrainTransform,
    collate_segmentation,
    read_label,
    reduce_zero_label,
    scan_pairs,
)
from .inference import slide_inference, whole_inference
from .metrics import SegmentationMetric
from .model import build_upernet
from .task import evaluate, training_loss

__all__ = [
    "IGNORE_INDEX",
    "EvalTransform",
    "SegmentationBatch",
    "SegmentationFolder",
    "SegmentationMetric",
    "TrainTransform",
    "build_upernet",
    "collate_segmentation",
    "evaluate",
    "read_label",
    "reduce_zero_label",
    "scan_pairs",
    "slide_inference",
    "training_loss",
    "whole_inference",
]
