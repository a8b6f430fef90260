"""Semantic segmentation: ADE20K-layout data, an UperNet model on a feature pyramid, inference and mIoU.

``build_upernet(backbone, num_classes)`` makes the model, :class:`SegmentationFolder` reads the
data, ``training_loss`` and ``evaluate`` are what a training loop calls, and
:class:`SegmentationTask` runs them in the shared loop (``weightformer seg train|eval|predict``,
:mod:`weightformer.segmentation.cli`). ``shapes`` (:mod:`~weightformer.segmentation.synthetic`)
is a small data set drawn offline.
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
from .synthetic import SHAPES_CLASSES, shapes_root, write_shapes
from .task import SegmentationTask, evaluate, training_loss

__all__ = [
    "IGNORE_INDEX",
    "SHAPES_CLASSES",
    "EvalTransform",
    "SegmentationBatch",
    "SegmentationFolder",
    "SegmentationMetric",
    "SegmentationTask",
    "TrainTransform",
    "build_upernet",
    "collate_segmentation",
    "evaluate",
    "read_label",
    "reduce_zero_label",
    "scan_pairs",
    "shapes_root",
    "slide_inference",
    "training_loss",
    "whole_inference",
    "write_shapes",
]
