"""The engine every task shares, and that knows no task: ``train(config, task=...)`` runs the loop
(checkpoints, exact resume, signals, torchrun, metrics) around a :class:`Task`; ``load_model``
reads any checkpoint into its task's model; :mod:`.cli` builds each task's command line; the
settings every run has (:class:`TrainConfig`) and the recipes that fill them."""

from .config import TrainConfig, load_config_file, parse_model_kwargs, resolve_config, scaled_learning_rates, setting, validate_config
from .device import autocast, pick_device
from .distributed import DistInfo, init_distributed
from .errors import USER_ERRORS, ConfigError
from .recipes import Recipe, RecipeChoice
from .registry import get_task, register_task, task_names
from .signals import StopFlag
from .task import Command, Task, TaskData
from .weights import LoadedModel, load_model, load_model_state, load_weights, read_checkpoint
from .loop import PreparedRun, TrainResult, prepare_config, train

__all__ = [
    "USER_ERRORS",
    "Command",
    "ConfigError",
    "DistInfo",
    "LoadedModel",
    "PreparedRun",
    "Recipe",
    "RecipeChoice",
    "StopFlag",
    "Task",
    "TaskData",
    "TrainConfig",
    "TrainResult",
    "autocast",
    "get_task",
    "init_distributed",
    "load_config_file",
    "load_model",
    "load_model_state",
    "load_weights",
    "parse_model_kwargs",
    "pick_device",
    "prepare_config",
    "read_checkpoint",
    "register_task",
    "resolve_config",
    "scaled_learning_rates",
    "setting",
    "task_names",
    "train",
    "validate_config",
]
