"""Training and evaluation engine: ``train(config)``, ``evaluate(model, loader, device)``,
``evaluate_checkpoint(path)``, and the config they share."""

from .config import TrainConfig, load_config_file, parse_model_kwargs, resolve_config, scaled_learning_rates, validate_config
from .distributed import DistInfo, init_distributed
from .errors import USER_ERRORS, ConfigError
from .evaluate import evaluate, evaluate_checkpoint, format_eval
from .state import build_model, load_model_state, read_checkpoint
from .signals import StopFlag
from .loop import TrainResult, train

__all__ = [
    "USER_ERRORS",
    "ConfigError",
    "DistInfo",
    "StopFlag",
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
