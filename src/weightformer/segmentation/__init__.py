"""Semantic segmentation: ADE20K-layout data, an UperNet model on a feature pyramid, inference and mIoU.

``build_upernet(backbone, num_classes)`` makes the model, :class:`SegmentationFolder` reads the
data (:func:`find_root` finds it in the layouts users have), ``training_loss`` and ``evaluate`` are
what a training loop calls, and :class:`SegmentationTask` runs them in the shared loop with its
settings (:class:`SegmentationConfig`) and recipes (``weightformer seg train|eval|predict``).
:func:`evaluate_checkpoint` and :func:`weightformer.segmentation.predict.predict` are ``seg eval``
and ``seg predict`` as functions. ``shapes`` (:mod:`~weightformer.segmentation.synthetic`) is a
small data set drawn offline.

The names are imported from their submodules on first use (PEP 562), so that the command line reads
:class:`SegmentationTask` and its settings without importing torch.
"""

from .. import _lazy_exports

__getattr__, __dir__ = _lazy_exports(__name__, {
    "SegmentationConfig": "config", "IGNORE_INDEX": "data", "EvalTransform": "data", "SegmentationBatch": "data",
    "SegmentationFolder": "data", "TrainTransform": "data", "collate_segmentation": "data", "find_root": "data",
    "read_label": "data", "reduce_zero_label": "data", "scan_pairs": "data", "evaluate": "evaluation",
    "evaluate_checkpoint": "evaluation", "slide_inference": "inference", "whole_inference": "inference",
    "SegmentationMetric": "metrics", "build_upernet": "model", "SHAPES_CLASSES": "synthetic",
    "shapes_root": "synthetic", "write_shapes": "synthetic", "SegmentationTask": "task", "training_loss": "task",
})

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
