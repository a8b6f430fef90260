"""Semantic segmentation: ADE20K-layout data, an UperNet model on a feature pyramid, inference and mIoU.

``build_upernet(backbone, num_classes)`` makes the model, :class:`SegmentationFolder` reads the
data (:func:`find_root` finds it in the layouts users have), ``training_loss`` and ``evaluate`` are
what a training loop calls, and :class:`SegmentationTask` runs them in the shared loop with its
settings (:class:`SegmentationConfig`) and recipes (``weightformer seg train|eval|predict``).
:func:`evaluate_checkpoint` and :func:`weightformer.segmentation.predict.predict` are ``seg eval``
and ``seg predict`` as functions. ``shapes`` (:mod:`~weightformer.segmentation.synthetic`) is a
small data set drawn offline.
"""

from .config import SegmentationConfig
from .data import (
    IGNORE_INDEX,
    EvalTransform,
    SegmentationBatch,
    SegmentationFolder,
    TrainTransform,
    collate_segmentation,
    find_root,
    read_label,
    reduce_zero_label,
    scan_pairs,
)
from .evaluation import evaluate, evaluate_checkpoint
from .inference import slide_inference, whole_inference
from .metrics import SegmentationMetric
from .model import build_upernet
from .synthetic import SHAPES_CLASSES, shapes_root, write_shapes
from .task import SegmentationTask, training_loss

__all__ = [
    "IGNORE_INDEX",
    "SHAPES_CLASSES",
    "EvalTransform",
    "SegmentationBatch",
    "SegmentationConfig",
    "SegmentationFolder",
    "SegmentationMetric",
    "SegmentationTask",
    "TrainTransform",
    "build_upernet",
    "collate_segmentation",
    "evaluate",
    "evaluate_checkpoint",
    "find_root",
    "read_label",
    "reduce_zero_label",
    "scan_pairs",
    "shapes_root",
    "slide_inference",
    "training_loss",
    "whole_inference",
    "write_shapes",
]
