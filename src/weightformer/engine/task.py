"""What a task is: everything one kind of model adds to the shared engine, from recipe to prediction.

The engine (:mod:`weightformer.engine.loop`) keeps what every run shares, once: samplers and loaders,
the optimizer and schedule, AMP, clipping, EMA, atomic checkpoints and exact resume, signals,
torchrun, ``metrics.jsonl``, ``curves.png``, progress output, the one weights reader
(:func:`weightformer.engine.load_model`) and the command line (:mod:`weightformer.engine.cli`). A
:class:`Task` says the rest:

- **its settings**: ``config_class``, a subclass of :class:`~weightformer.engine.TrainConfig` holding
  the task's own fields, their help, flags and rules;
- **its recipes** (:meth:`Task.recipes`, :meth:`Task.choose_recipe`): which defaults suit which data;
- **training**: the data (:meth:`build_data`), the model and its ``meta`` (:meth:`build_model`), the
  loss of a step, the evaluation over the validation split;
- **after training**: the model a checkpoint's ``meta`` describes (:meth:`model_from_meta`), and its
  commands (:meth:`Task.commands`): evaluation and prediction, each a thin layer over a library
  function of the task's package.

A task's randomness must come only from the generators the loop seeds and checkpoints (torch,
NumPy, Python), or from per-sample seeds (see :class:`weightformer.data.SeededTransformDataset`),
so that a resumed run equals an uninterrupted one.

This module imports no torch, and a task's module should not either at its top: the command line
is built from the class attributes, :meth:`Task.recipes`, ``config_class`` and :meth:`Task.commands`
alone, so ``--help`` and a bad flag answer at once; what trains, evaluates or loads imports torch
where it runs.
"""

from __future__ import annotations

import argparse
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping, Optional, Sequence

from ..checkpoint import CheckpointError
from .config import TrainConfig
from .errors import ConfigError
from .recipes import Recipe, RecipeChoice

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn
    from torch.utils.data import DataLoader, Dataset

    from .distributed import DistInfo

__all__ = ["Command", "Task", "TaskData"]


@dataclass
class TaskData:
    """A task's training and validation sets, how to batch them, and what the run should say about them."""

    train_set: Dataset  # with set_epoch(epoch) if its augmentation is seeded per epoch
    val_set: Dataset
    description: str  # e.g. "data mnist: 8000 train / 2000 val images at 28 px"
    collate_fn: Optional[Callable[[list[Any]], Any]] = None  # None: torch's default collate


@dataclass(frozen=True)
class Command:
    """A subcommand of a task's command line besides ``train`` (``eval``, ``predict``, ``sample``).

    ``add_arguments`` adds its flags (the shared ones come from :mod:`weightformer.engine.cli`);
    ``run`` does the work from the parsed arguments and returns the exit code.
    """

    name: str
    help: str
    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


class Task(ABC):
    """One kind of training (classification, detection, segmentation, generation, or yours).

    Class attributes: ``name`` is what a checkpoint's ``meta["task"]`` says; ``cli_name`` the
    subcommand of ``weightformer`` that runs it (``weightformer det ...``); ``config_class`` its
    settings; ``best_metric`` the entry of :meth:`evaluate` that picks ``best.pt`` (higher is better,
    or lower when ``higher_is_better`` is False, e.g. a loss); ``curve_metrics`` the entries plotted in
    ``curves.png``. A task whose model wraps a timm backbone (the dense tasks) names its submodule in
    ``backbone_path`` (``""``: the model is the backbone): ``--init`` from another task's checkpoint
    then loads only the backbone, and ``layer_decay`` decays the backbone's blocks.
    """

    name: ClassVar[str]
    cli_name: ClassVar[str]
    description: ClassVar[str] = ""  # one line: what the task is, for its command's --help
    config_class: ClassVar[type[TrainConfig]] = TrainConfig
    output_prefix: ClassVar[str] = ""  # default run folder: runs/<prefix><data>_<model>
    best_metric: ClassVar[str]
    higher_is_better: ClassVar[bool] = True
    curve_metrics: ClassVar[tuple[str, ...]] = ()
    backbone_path: ClassVar[Optional[str]] = None  # e.g. "pyramid.backbone"; None: no backbone to single out

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg

    # ---------------------------------------------------------------------------------------------
    # The task as a whole (class methods: no run needed)
    # ---------------------------------------------------------------------------------------------
    @classmethod
    def command(cls) -> str:
        """The command line that runs this task: ``weightformer det``."""
        return f"weightformer {cls.cli_name}"

    @classmethod
    @abstractmethod
    def recipes(cls) -> Sequence[Recipe]:
        """Every recipe of the task, the one a plain ``train`` uses first (shown in ``--help``)."""

    @classmethod
    @abstractmethod
    def choose_recipe(cls, data: str, settings: Mapping[str, Any]) -> RecipeChoice:
        """The recipe for ``data`` (the run's ``--data``), given the user's other ``settings`` (the
        config file's and the flags', e.g. ``init``), and the reason, for the run's first line."""

    @classmethod
    @abstractmethod
    def model_from_meta(cls, meta: Mapping[str, Any]) -> nn.Module:
        """The model (randomly initialised) that a checkpoint's ``meta`` describes."""

    @classmethod
    def meta_for_weights(cls, checkpoint: str, state: Mapping[str, Tensor], model: Optional[str],
                         model_kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """``meta`` for weights that carry none (the authors' files, timm's, a bare state dict), with the
        ``model`` the user named. Tasks whose checkpoints always come from ``train`` refuse them."""
        raise CheckpointError(f"{checkpoint} holds weights without the description of a {cls.name} model; pass "
                              f"a last.pt or best.pt written by {cls.command()} train")

    @classmethod
    def override_meta(cls, meta: dict[str, Any], model_kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """``meta`` with the user's model kwargs over its own (for a model built to run elsewhere)."""
        return {**meta, "model_kwargs": {**meta.get("model_kwargs", {}), **model_kwargs}} if model_kwargs else meta

    @classmethod
    def commands(cls) -> Sequence[Command]:
        """The task's subcommands beside ``train`` (evaluation, prediction)."""
        return ()

    @classmethod
    def add_train_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Flags of ``train`` that are not settings (e.g. detection's ``--visualize``); settings get
        their flags from ``config_class``."""

    @classmethod
    def check_train_arguments(cls, args: argparse.Namespace) -> None:
        """Check the flags of :meth:`add_train_arguments` before the run; raise ConfigError."""

    @classmethod
    def after_training(cls, result: Any, args: argparse.Namespace) -> None:
        """What ``train`` does after a finished run with the flags of :meth:`add_train_arguments`."""

    # ---------------------------------------------------------------------------------------------
    # Training
    # ---------------------------------------------------------------------------------------------
    @abstractmethod
    def build_data(self, dist_info: DistInfo) -> TaskData:
        """Open the data set and build the training and validation sets with their transforms."""

    @abstractmethod
    def build_model(self, data: TaskData, device: torch.device) -> tuple[nn.Module, dict[str, Any]]:
        """The model on ``device``, and the plain-value ``meta`` that rebuilds it from a checkpoint
        (:meth:`model_from_meta`); ``meta["task"]`` must be :attr:`name`."""

    def check_checkpoint(self, meta: dict[str, Any], source: str, resuming: bool = True) -> None:
        """Raise CheckpointError if a checkpoint of this task with ``meta`` cannot continue this run
        (``resuming``) or start it (``--init``). (Its task was checked before.)"""

    def init_weights(self, model: nn.Module, ckpt: Mapping[str, Any], source: str) -> str:
        """Load ``--init`` weights (an already-read checkpoint of any format) into ``model`` for a new
        run, and return what was loaded, as a clause of the run's announcement. A checkpoint of this
        task (or any, without a backbone inside the model) fills the whole model, a classifier of another
        size left as initialised (fine-tuning on other classes); any other (a classifier's: ours, the
        authors', timm's) fills only the backbone."""
        from .weights import checkpoint_task, load_backbone_weights, load_weights

        meta = dict(ckpt.get("meta") or {})
        if self.backbone_path and meta.get("task") != self.name:  # another task's, or a classifier's weights
            return load_backbone_weights(model, self.backbone_path, self.cfg.model, ckpt, source)
        checkpoint_task(ckpt, source, type(self))
        self.check_checkpoint(meta, source, resuming=False)
        fresh = load_weights(model, ckpt, source=source, ignore_classifier=True)
        return f"; the classifier ({', '.join(fresh)}) does not fit these classes and starts fresh" if fresh else ""

    def param_groups(self, model: nn.Module) -> Optional[list[dict[str, Any]]]:
        """Optimizer parameter groups, or None for timm's default: weight decay on all but norms and
        biases. With ``backbone_path`` and ``layer_decay``, the backbone's blocks get layer-wise LR
        decay through ``lr_scale`` (the rest of the model the full rate)."""
        if self.cfg.layer_decay is None:
            return None
        if self.backbone_path is None:
            raise ConfigError(f"--layer-decay: {self.name} models have no backbone blocks to decay; drop it")
        from ..models.layer_decay import layer_decay_param_groups

        try:
            return layer_decay_param_groups(model, self.backbone_path or model, self.cfg.weight_decay,
                                            self.cfg.layer_decay)
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

    @classmethod
    def next_command(cls, checkpoint: Path) -> str:
        """What to run on a checkpoint of this task: what a finished run suggests for its best (else last)
        checkpoint, and what the wrong-task message of another task's command points to."""
        return f"{cls.command()} eval --checkpoint {checkpoint}"

    def format_score(self, value: float) -> str:
        """The best metric's value as the run's last lines print it."""
        return f"{self.best_metric} {value:.4g}"
