"""Semantic segmentation (``weightformer seg``): ADE20K-layout data (or the offline ``shapes`` set), UperNet on a
feature pyramid, sliding-window inference and mIoU. Names are imported on first use (PEP 562), so the command
line reads :class:`SegmentationTask` and its settings without importing torch."""

from ..lazy import lazy_exports

_EXPORTS = {
    "SegmentationConfig": "config", "IGNORE_INDEX": "data", "EvalTransform": "data", "SegmentationBatch": "data",
    "SegmentationFolder": "data", "TrainTransform": "data", "collate_segmentation": "data", "find_root": "data",
    "read_label": "data", "reduce_zero_label": "data", "scan_pairs": "data", "evaluate": "evaluation",
    "evaluate_checkpoint": "evaluation", "slide_inference": "inference", "whole_inference": "inference",
    "SegmentationMetric": "metrics", "build_upernet": "model", "SHAPES_CLASSES": "synthetic",
    "shapes_root": "synthetic", "write_shapes": "synthetic", "SegmentationTask": "task", "training_loss": "task",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
