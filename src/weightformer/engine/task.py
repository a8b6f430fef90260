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
from ..models.layer_decay import layer_decay_param_groups
from .errors import ConfigError
from .state import load_backbone_weights, load_weights

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
    plotted in ``curves.png``. A task whose model wraps a timm backbone (the dense tasks) names its
    submodule in ``backbone_path``: ``--init`` from another task's checkpoint then loads only the
    backbone, and ``layer_decay`` decays the backbone's blocks.
    """

    name: ClassVar[str]
    command: ClassVar[str] = "weightformer"  # the command whose train/eval run this task
    output_prefix: ClassVar[str] = ""  # default run folder: runs/<prefix><data>_<model>
    best_metric: ClassVar[str]
    higher_is_better: ClassVar[bool] = True
    curve_metrics: ClassVar[tuple[str, ...]] = ()
    backbone_path: ClassVar[Optional[str]] = None  # e.g. "pyramid.backbone"; None: the model is the backbone

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
        run, and return what was loaded, as a clause of the run's announcement. A checkpoint of this
        task (or any, without ``backbone_path``) fills the whole model, a classifier of another size
        left as initialised (fine-tuning on other classes); any other (a classifier's: ours, the
        authors', timm's) fills only the backbone."""
        if self.backbone_path is not None and (ckpt.get("meta") or {}).get("task") != self.name:
            return load_backbone_weights(model, self.backbone_path, self.cfg.model, ckpt, source)
        self.check_checkpoint(dict(ckpt.get("meta") or {}), source, resuming=False)
        fresh = load_weights(model, ckpt, source=source, ignore_classifier=True)
        return f"; the classifier ({', '.join(fresh)}) does not fit these classes and starts fresh" if fresh else ""

    def param_groups(self, model: nn.Module) -> Optional[list[dict[str, Any]]]:
        """Optimizer parameter groups, or None for timm's default: weight decay on all but norms and
        biases. With ``backbone_path`` and ``layer_decay``, the backbone's blocks get layer-wise LR
        decay through ``lr_scale`` (the rest of the model the full rate)."""
        if self.backbone_path is None or self.cfg.layer_decay is None:
            return None
        try:
            return layer_decay_param_groups(model, self.backbone_path, self.cfg.weight_decay, self.cfg.layer_decay)
        except ValueError as exc:
            raise ConfigError(f"--layer-decay: {exc}") from None

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
