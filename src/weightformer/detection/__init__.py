"""COCO detection and instance segmentation: Mask R-CNN and Cascade Mask R-CNN on torchvision's detectors.

:class:`DetectionTask` is the task (settings :class:`DetectionConfig`, ``weightformer det`` in :mod:`.cli`),
:func:`build_maskrcnn` the model, :class:`CocoDetection` the data (:func:`find_split` finds a split),
:class:`CocoEvaluator` the scoring; ``--data shapes`` is an offline data set (:mod:`.synthetic`). Names are
imported on first use (PEP 562), so the command line reads the task without importing torch.
"""

from ..lazy import lazy_exports

_EXPORTS = {
    "AgnosticBoxPredictor": "cascade", "CascadeRoIHeads": "cascade", "DetectionConfig": "config",
    "CocoDetection": "data", "DroppedBoxesWarning": "data", "collate": "data", "drop_crowd": "data",
    "LargeScaleJitter": "transforms", "SeededJitterDataset": "transforms", "find_split": "layout",
    "METRIC_NAMES": "evaluation", "CocoEvaluator": "evaluation", "evaluate": "evaluation",
    "evaluate_checkpoint": "evaluation", "build_maskrcnn": "model", "DetectionTask": "task",
    "build_detector": "task", "training_loss": "task", "draw_detections": "visualize",
    "save_visualizations": "visualize",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
