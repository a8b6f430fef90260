"""The engine every task shares: ``train(config, task=...)`` runs the loop (checkpoints, exact resume,
signals, torchrun, metrics) around a :class:`Task`'s data, model, loss and evaluation;
``evaluate_checkpoint(path)`` evaluates a classifier; the config they share."""

from .config import TrainConfig, load_config_file, parse_model_kwargs, resolve_config, scaled_learning_rates, validate_config
from .distributed import DistInfo, init_distributed
from .errors import USER_ERRORS, ConfigError
from .evaluate import evaluate, evaluate_checkpoint, format_eval
from .state import build_model, load_model_state, read_checkpoint
from .signals import StopFlag
from .task import Task, TaskData
from .loop import TrainResult, train

__all__ = [
    "USER_ERRORS",
    "ConfigError",
    "DistInfo",
    "StopFlag",
    "Task",
    "TaskData",
    "TrainConfig",
    "TrainResult",
    "build_model",
    "evaluate",
    "evaluate_checkpoint",
    "format_eval",
    "init_distributed",
    "load_config_file",
    "load_model_state",
    "parse_model_kwargs",
    "read_checkpoint",
    "resolve_config",
    "scaled_learning_rates",
    "train",
    "validate_config",
]
