"""COCO detection and instance segmentation: Mask R-CNN and Cascade Mask R-CNN on torchvision's detectors.

:class:`DetectionTask` is the whole task (its settings :class:`DetectionConfig`, its recipes in
:mod:`.recipes`, ``weightformer det train|eval|predict`` in :mod:`.cli`); :func:`build_maskrcnn` builds
the model on a feature pyramid; :class:`CocoDetection` reads the COCO layout (:func:`find_split`
finds a split); :class:`CocoEvaluator` scores predictions with pycocotools; :func:`evaluate_checkpoint`
and :func:`.predict.predict` evaluate a checkpoint and run it on images; :func:`draw_detections` draws
detections; ``--data shapes`` is an offline data set (:mod:`.synthetic`).

The names are imported from their submodules on first use (PEP 562), so that the command line reads
:class:`DetectionTask` and its settings without importing torch. (``predict`` is the submodule: the
package's attribute of that name could not be the function and the module both.)
"""

from .. import _lazy_exports

__getattr__, __dir__ = _lazy_exports(__name__, {
    "AgnosticBoxPredictor": "cascade", "CascadeRoIHeads": "cascade", "DetectionConfig": "config",
    "CocoDetection": "data", "DroppedBoxesWarning": "data", "collate": "data", "drop_crowd": "data",
    "LargeScaleJitter": "transforms", "SeededJitterDataset": "transforms", "find_split": "layout",
    "METRIC_NAMES": "evaluation", "CocoEvaluator": "evaluation", "evaluate": "evaluation",
    "evaluate_checkpoint": "evaluation", "build_maskrcnn": "model", "DetectionTask": "task",
    "build_detector": "task", "training_loss": "task", "draw_detections": "visualize",
    "save_visualizations": "visualize",
})

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
    "save_visualizations",
    "training_loss",
]
