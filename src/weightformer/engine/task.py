"""What a task is (settings, recipes, data, model, loss, evaluation, the model a checkpoint's ``meta`` describes);
its command line is its :class:`~.commands.TaskCLI`. A task draws randomness only from the generators the loop seeds
and checkpoints, or per-sample seeds (:class:`weightformer.data.SeededTransformDataset`), so a resumed run equals
an uninterrupted one. No torch at a task module's top: ``--help`` reads only the class and its recipes."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from importlib import import_module
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping, Optional, Sequence

from ..checkpoint import CheckpointError
from .config import TrainConfig
from .errors import ConfigError
from .recipes import Recipe, RecipeChoice

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn
    from torch.utils.data import DataLoader, Dataset

    from .commands import TaskCLI
    from .distributed import DistInfo

__all__ = ["Task", "TaskData"]


@dataclass
class TaskData:
    """A task's training and validation sets, how to batch them, and what they tell the model."""

    train_set: Dataset  # with set_epoch(epoch) if its augmentation is seeded per epoch
    val_set: Dataset
    description: str  # one line for the run, e.g. "data D: 8000 train / 2000 val images at 28 px"
    collate_fn: Optional[Callable[[list[Any]], Any]] = None  # None: torch's default collate
    meta: dict[str, Any] = field(default_factory=dict)  # the data's part of the model's meta: classes, channels


class Task(ABC):
    """One kind of training. ``name`` is what a checkpoint's ``meta["task"]`` says; ``best_metric`` the entry
    of :meth:`evaluate` that picks ``best.pt``; ``curve_metrics`` those plotted in ``curves.png``. A model
    that wraps a timm backbone names it in ``backbone_path`` (``""``: the model is the backbone): ``--init``
    from another task's checkpoint then loads only the backbone, and ``layer_decay`` decays its blocks."""

    name: ClassVar[str]
    config_class: ClassVar[type[TrainConfig]] = TrainConfig
    recipes_module: ClassVar[str]  # import path of the module with the task's recipes() and choose_recipe()
    output_prefix: ClassVar[str] = ""  # default run folder: runs/<prefix><data>_<model>
    best_metric: ClassVar[str]
    higher_is_better: ClassVar[bool] = True
    curve_metrics: ClassVar[tuple[str, ...]] = ()
    backbone_path: ClassVar[Optional[str]] = None  # e.g. "pyramid.backbone"; None: no backbone to single out
    cli: ClassVar[TaskCLI]  # how the task is offered on the command line

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg

    @classmethod
    def recipes(cls) -> Sequence[Recipe]:
        """Every recipe of the task, the one a plain ``train`` uses first (shown in ``--help``)."""
        return import_module(cls.recipes_module).recipes()

    @classmethod
    def choose_recipe(cls, data: str, settings: Mapping[str, Any]) -> RecipeChoice:
        """The recipe for ``data`` given the user's other ``settings``, and the reason, for the run's first line."""
        return import_module(cls.recipes_module).choose_recipe(data, settings)

    @classmethod
    @abstractmethod
    def model_from_meta(cls, meta: Mapping[str, Any]) -> nn.Module:
        """The model (randomly initialised) that a checkpoint's ``meta`` describes."""

    @classmethod
    def meta_for_weights(cls, checkpoint: str, state: Mapping[str, Tensor], model: Optional[str],
                         model_kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """``meta`` for weights that carry none (the authors' files, timm's), with the ``model`` the user named."""
        raise CheckpointError(f"{checkpoint} holds weights without the description of a {cls.name} model; pass "
                              f"a last.pt or best.pt written by {cls.cli.program} train")

    @classmethod
    def upgrade_checkpoint(cls, checkpoint: dict[str, Any], version: int) -> dict[str, Any]:
        """A checkpoint of this task of an older format ``version`` with its ``meta`` and ``config`` made current."""
        return checkpoint

    @abstractmethod
    def build_data(self, dist_info: DistInfo) -> TaskData:
        """Open the data set and build the training and validation sets with their transforms."""

    @abstractmethod
    def build_model(self, data: TaskData, device: torch.device) -> tuple[nn.Module, dict[str, Any]]:
        """The model on ``device`` and the plain-value ``meta`` (``task``: :attr:`name`) that rebuilds it."""

    def check_checkpoint(self, saved: Mapping[str, Any], meta: Mapping[str, Any], source: str,
                         resuming: bool = True) -> None:
        """Raise CheckpointError if a checkpoint of this task with meta ``saved`` cannot continue
        (``resuming``) or start (``--init``) this run, whose model's meta is ``meta``."""

    def init_weights(self, model: nn.Module, meta: Mapping[str, Any], ckpt: Mapping[str, Any], source: str) -> str:
        """Load ``--init`` weights (a read checkpoint of any format) into ``model`` (its meta ``meta``) and
        return what was loaded, as a clause of the run's announcement. A checkpoint of this task (or any,
        without a backbone inside the model) fills the whole model, a classifier of another size left as
        initialised; any other fills only the backbone (another task's backbone too, from inside its model)."""
        from ..checkpoint import strip_wrapper_prefixes
        from .registry import get_task
        from .weights import checkpoint_task, load_weights, model_state_from

        saved = dict(ckpt.get("meta") or {})
        # the backbone inside another task's model ("" for a classifier, which is its backbone; None: none)
        inside = get_task(saved["task"]).backbone_path if saved.get("task") not in (None, self.name) else None
        if self.backbone_path is not None and (inside or (self.backbone_path and saved.get("task") != self.name)):
            if saved.get("model") not in (None, self.cfg.model):
                raise CheckpointError(f"{source} holds a {saved['model']}, and this run's backbone is "
                                      f"{self.cfg.model}; pass --model {saved['model']} (with its model kwargs) or "
                                      f"another checkpoint")
            if inside:  # its backbone's weights, under the backbone's own names
                state = strip_wrapper_prefixes(model_state_from(ckpt, False, source))
                ckpt = {k.removeprefix(f"{inside}."): v for k, v in state.items() if k.startswith(f"{inside}.")}
            backbone = model.get_submodule(self.backbone_path) if self.backbone_path else model
            load_weights(backbone, ckpt, source=source, ignore_classifier=True)
            fresh = "the neck and heads start" if self.backbone_path else "the classifier starts"
            return f"; only its backbone ({self.cfg.model}): {fresh} fresh"
        checkpoint_task(ckpt, source, type(self))
        self.check_checkpoint(saved, meta, source, resuming=False)
        fresh = load_weights(model, ckpt, source=source, ignore_classifier=True)
        return f"; the classifier ({', '.join(fresh)}) does not fit these classes and starts fresh" if fresh else ""

    def param_groups(self, model: nn.Module) -> Optional[list[dict[str, Any]]]:
        """Optimizer parameter groups, or None for timm's default (no weight decay on norms and biases);
        with ``layer_decay``, the backbone's blocks get layer-wise LR decay through ``lr_scale``."""
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
