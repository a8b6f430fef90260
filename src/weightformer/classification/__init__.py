"""Image classification as a task (``weightformer train|eval|predict``, also ``weightformer cls``); the names are
imported on first use, so that the command line reads the task and its settings without torch."""

from ..lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "ClassificationConfig": "config", "evaluate_checkpoint": "evaluate", "ClassificationTask": "task",
})

__all__ = ["ClassificationConfig", "ClassificationTask", "evaluate_checkpoint"]
