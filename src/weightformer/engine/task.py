"""What a task adds to the shared training loop: its data, its model, the loss of a step, its evaluation.

The loop in :mod:`weightformer.engine.loop` keeps everything else, once: samplers and loaders,
the optimizer and schedule, AMP, clipping, EMA, atomic checkpoints and exact resume, signals,
torchrun, ``metrics.jsonl``, ``curves.png`` and progress output. A task never sees any of it.

A task's randomness must come only from the generators the loop seeds and checkpoints (torch,
NumPy, Python), or from per-sample seeds (see :class:`weightformer.data.SeededTransformDataset`),
so that a resumed run equals an uninterrupted one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Optional

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from .config import TrainConfig
from .distributed import DistInfo
from .state import load_weights

__all__ = ["Task", "TaskData"]


@dataclass
class TaskData:
    """A task's training and validation sets, how to batch them, and what the run should say about them."""

    train_set: Dataset  # with set_epoch(epoch) if its augmentation is seeded per epoch
    val_set: Dataset
    description: str  # e.g. "data mnist: 8000 train / 2000 val images at 28 px"
    collate_fn: Optional[Callable[[list[Any]], Any]] = None  # None: torch's default collate


class Task(ABC):
    """One kind of training (classification, detection, segmentation, generation).

    ``best_metric`` names the entry of :meth:`evaluate`'s result that picks ``best.pt`` (higher is
    better, or lower when ``higher_is_better`` is False, e.g. a loss); ``curve_metrics`` are the entries
    plotted in ``curves.png``.
    """

    name: ClassVar[str]
    command: ClassVar[str] = "weightformer"  # the command whose train/eval run this task
    output_prefix: ClassVar[str] = ""  # default run folder: runs/<prefix><data>_<model>
    best_metric: ClassVar[str]
    higher_is_better: ClassVar[bool] = True
    curve_metrics: ClassVar[tuple[str, ...]] = ()

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg

    @abstractmethod
    def build_data(self, dist_info: DistInfo) -> TaskData:
        """Open the data set and build the training and validation sets with their transforms."""

    @abstractmethod
    def build_model(self, data: TaskData, device: torch.device) -> tuple[nn.Module, dict[str, Any]]:
        """The model on ``device``, and the plain-value ``meta`` that rebuilds it from a checkpoint."""

    def check_checkpoint(self, meta: dict[str, Any], source: str, resuming: bool = True) -> None:
        """Raise CheckpointError if a checkpoint with ``meta`` cannot continue this run (``resuming``)
        or start it (``--init``)."""

    def init_weights(self, model: nn.Module, ckpt: Mapping[str, Any], source: str) -> str:
        """Load ``--init`` weights (an already-read checkpoint of any format) into ``model`` for a new
        run, and return what was loaded, as a clause of the run's announcement. Default: the whole
        model, a classifier of another size left as initialised (fine-tuning on other classes)."""
        self.check_checkpoint(dict(ckpt.get("meta") or {}), source, resuming=False)
        fresh = load_weights(model, ckpt, source=source, ignore_classifier=True)
        return f"; the classifier ({', '.join(fresh)}) does not fit these classes and starts fresh" if fresh else ""

    def param_groups(self, model: nn.Module) -> Optional[list[dict[str, Any]]]:
        """Optimizer parameter groups (e.g. layer-wise LR decay through ``lr_scale``), or None for
        timm's default: weight decay on all but norms and biases."""
        return None

    @abstractmethod
    def training_loss(self, model: nn.Module, batch: Any, device: torch.device) -> tuple[Tensor, int]:
        """The loss of one batch (run under the loop's autocast) and the number of samples in it."""

    @abstractmethod
    def evaluate(self, model: nn.Module, loader: DataLoader, device: torch.device, amp: str,
                 dist_info: DistInfo) -> dict[str, float]:
        """Metrics over the whole validation split (summed over ranks), including :attr:`best_metric`."""

    @abstractmethod
    def summary(self, metrics: dict[str, Any]) -> str:
        """One line of the main metrics, as printed after each epoch."""

    def next_command(self, checkpoint: Path) -> str:
        """The command a finished run suggests, for its best (else last) checkpoint."""
        return f"{self.command} eval --checkpoint {checkpoint}"

    def format_score(self, value: float) -> str:
        """The best metric's value as the run's last lines print it."""
        return f"{self.best_metric} {value:.4g}"
