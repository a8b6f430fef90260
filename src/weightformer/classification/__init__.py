"""Image classification as a task, a peer of the others: its settings (:mod:`.config`), recipes
(:mod:`.recipes`), timm model builder (:mod:`.model`), evaluation (:mod:`.evaluate`), prediction
(:mod:`.predict`) and commands (``weightformer train|eval|predict``, also ``weightformer cls``)."""

from .config import ClassificationConfig
from .evaluate import evaluate_checkpoint
from .task import ClassificationTask

__all__ = ["ClassificationConfig", "ClassificationTask", "evaluate_checkpoint"]
