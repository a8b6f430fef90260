"""The tasks this package ships, registered with the engine by import path; weights naming no task are classifiers."""

from .engine.registry import register_task

# name -> (import path of its Task, the weightformer subcommand that runs it)
BUILTIN_TASKS = {
    "classification": ("weightformer.classification.task:ClassificationTask", "cls"),
    "detection": ("weightformer.detection.task:DetectionTask", "det"),
    "segmentation": ("weightformer.segmentation.task:SegmentationTask", "seg"),
    "generation": ("weightformer.generation.task:GenerationTask", "gen"),
}

for _name, (_path, _) in BUILTIN_TASKS.items():
    register_task(_path, name=_name, default=_name == "classification")
