"""The engine every task shares, and that knows no task: ``train(config, task=...)`` runs the loop
(checkpoints, exact resume, signals, torchrun, metrics) around a :class:`Task`; ``load_model`` reads any
checkpoint into its task's model; :mod:`.cli` builds each task's command line. Each name is imported from
its submodule on first use (PEP 562), so the command line reads :class:`TaskCLI`, the config classes and
the recipes without importing torch."""

from ..lazy import lazy_exports

# name -> the submodule that defines it
_EXPORTS = {
    "TrainConfig": "config", "load_config_file": "config", "parse_model_kwargs": "config",
    "resolve_config": "config", "scaled_learning_rates": "config", "setting": "config", "validate_config": "config",
    "autocast": "device", "pick_device": "device",
    "DistInfo": "distributed", "init_distributed": "distributed",
    "USER_ERRORS": "errors", "ConfigError": "errors",
    "Recipe": "recipes", "RecipeChoice": "recipes",
    "get_task": "registry", "register_task": "registry",
    "Command": "commands", "TaskCLI": "commands", "Task": "task", "TaskData": "task",
    "CHECKPOINT_FORMAT": "weights", "LoadedModel": "weights", "load_model": "weights",
    "load_model_state": "weights", "load_weights": "weights", "read_checkpoint": "weights",
    "PreparedRun": "loop", "StopFlag": "loop", "TrainResult": "loop", "prepare_config": "loop", "train": "loop",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
