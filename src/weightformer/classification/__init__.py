"""Image classification as a task, a peer of the others: its settings (:mod:`.config`), recipes
(:mod:`.recipes`), timm model builder (:mod:`.model`), evaluation (:mod:`.evaluate`), prediction
(:mod:`.predict`) and commands (``weightformer train|eval|predict``, also ``weightformer cls``).

The names are imported from their submodules on first use (PEP 562), so that the command line reads
:class:`ClassificationTask` and its settings without importing torch.
"""

from .. import _lazy_exports

__getattr__, __dir__ = _lazy_exports(__name__, {
    "ClassificationConfig": "config", "evaluate_checkpoint": "evaluate", "ClassificationTask": "task",
})

__all__ = ["ClassificationConfig", "ClassificationTask", "evaluate_checkpoint"]
