"""Training settings: one dataclass of plain values, layered from defaults, data set, file and flags.

Resolution order, later wins: the dataclass defaults (the paper's ImageNet recipe), a built-in
data set's defaults (for ``mnist``: a small model for 28 px digits), the config saved in the
checkpoint being resumed, the ``--config`` YAML file, then command-line flags.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

import yaml

from ..data import builtin_defaults
from .errors import ConfigError

__all__ = ["TrainConfig", "load_config_file", "parse_model_kwargs", "resolve_config"]


@dataclass
class TrainConfig:
    """Every setting of a training run. Defaults are the paper's ImageNet recipe for WeightFormer-T."""

    # data
    data: str = "mnist"  # a built-in data set name, or an ImageFolder tree with train/ and val/
    img_size: Optional[int] = None  # None: the data set's size (28 for mnist), else 224
    workers: int = 8  # data-loading processes per training process
    verify_images: bool = True  # open every image once at start-up and skip unreadable ones
    # model
    model: str = "weightformer_tiny"  # any timm model name
    model_kwargs: dict[str, Any] = field(default_factory=dict)  # passed to timm.create_model
    # optimisation
    epochs: int = 300
    max_steps: Optional[int] = None  # stop after this many optimizer steps (the schedule is unchanged)
    batch_size: int = 128  # per process
    lr: float = 5e-4  # for a total batch of 512; the run uses lr * batch_size * world_size / 512
    min_lr: float = 1e-5
    warmup_lr: float = 1e-6
    warmup_epochs: int = 20
    weight_decay: float = 0.05  # not applied to norms and biases
    opt: str = "adamw"
    clip_grad: Optional[float] = 5.0  # max gradient norm; None disables clipping
    # regularisation and augmentation
    no_aug: bool = False  # train on the eval transform (resize, crop, normalise); mixup still applies
    smoothing: float = 0.1
    mixup: float = 0.8
    cutmix: float = 1.0
    auto_augment: Optional[str] = "rand-m9-mstd0.5-inc1"
    reprob: float = 0.25  # random erasing probability
    color_jitter: float = 0.4
    hflip: float = 0.5
    train_scale: tuple[float, float] = (0.08, 1.0)  # RandomResizedCrop area range
    interpolation: str = "bicubic"
    crop_pct: float = 0.875  # eval: resize to img_size / crop_pct, centre-crop img_size
    crop_mode: Optional[str] = None  # eval resize: center, squash or border; None: the model's pretrained config
    ema: bool = False
    ema_decay: float = 0.99996
    # systems
    amp: str = "none"  # none, bf16 or fp16 (fp16 needs a GPU)
    compile: bool = False
    grad_checkpointing: bool = False  # recompute block activations in backward: less memory, ~30% slower
    device: str = "auto"  # auto (cuda if available), cuda or cpu
    deterministic: bool = False
    seed: int = 0
    output: Optional[str] = None  # None: runs/<data>_<model>
    resume: Optional[str] = None  # "auto" (last.pt in output, if any) or a checkpoint path
    init: Optional[str] = None  # start a new run from these weights (any checkpoint format)
    overwrite: bool = False  # start anew in an output folder that holds a run (its files are kept, renamed)
    log_interval: int = 50  # steps between plain log lines when stdout is not a terminal

    def to_dict(self) -> dict[str, Any]:
        """Plain, YAML- and checkpoint-safe values."""
        out = dataclasses.asdict(self)
        out["train_scale"] = list(self.train_scale)
        return out


FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
_HINTS = typing.get_type_hints(TrainConfig)
# Never taken from a resumed checkpoint: where the run lives, and the step limit that stopped it.
_NOT_INHERITED = ("output", "resume", "max_steps", "init", "overwrite")


def _check_value(name: str, value: Any) -> Any:
    """Coerce ``value`` to field ``name``'s type (int -> float, list -> tuple) or raise ConfigError."""
    hint = _HINTS[name]
    optional = typing.get_origin(hint) is typing.Union and type(None) in typing.get_args(hint)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"setting {name!r} cannot be empty (null); give it a value or drop it")
    base = [a for a in typing.get_args(hint) if a is not type(None)][0] if optional else hint
    origin = typing.get_origin(base) or base
    if origin is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if origin is tuple and isinstance(value, (list, tuple)) and len(value) == 2:
        return (float(value[0]), float(value[1]))
    if origin is int and isinstance(value, bool) or not isinstance(value, origin):
        raise ConfigError(f"setting {name!r} must be of type {origin.__name__}, got {value!r}")
    return value


def _check_keys(values: Mapping[str, Any], source: str) -> None:
    for key in values:
        if key not in FIELDS:
            close = difflib.get_close_matches(key, FIELDS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; valid settings: {', '.join(FIELDS)}"
            raise ConfigError(f"unknown setting {key!r} in {source}{hint}")


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping of :class:`TrainConfig` settings."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; check the --config path")
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML ({str(exc).splitlines()[0]})") from exc
    if not isinstance(values, dict):
        raise ConfigError(f"config file {path} must hold a mapping of settings, got {type(values).__name__}")
    _check_keys(values, str(path))
    return values


def parse_model_kwargs(items: list[str]) -> dict[str, Any]:
    """``["patch_size=4", "drop_path_rate=0.1"]`` -> ``{"patch_size": 4, "drop_path_rate": 0.1}`` (YAML values)."""
    kwargs: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"model argument {item!r} is not KEY=VALUE; write e.g. patch_size=4")
        try:
            kwargs[key.strip()] = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise ConfigError(f"cannot read the value of model argument {item!r} ({exc})") from exc
    return kwargs


def resolve_config(
    overrides: Mapping[str, Any] | None = None,
    config_file: str | Path | None = None,
    checkpoint_config: Mapping[str, Any] | None = None,
) -> tuple[TrainConfig, dict[str, Any]]:
    """Layer defaults, data-set defaults, ``checkpoint_config``, ``config_file`` and ``overrides``.

    ``model_kwargs`` mappings are merged key by key rather than replaced. Returns the config and
    the data-set defaults that took effect (for the start-of-run message).
    """
    overrides = dict(overrides or {})
    _check_keys(overrides, "the arguments")
    from_file = load_config_file(config_file) if config_file else {}
    from_checkpoint = {k: v for k, v in (checkpoint_config or {}).items() if k in FIELDS and k not in _NOT_INHERITED}
    layers = [from_checkpoint, from_file, overrides]
    data = next((layer["data"] for layer in reversed(layers) if "data" in layer), FIELDS["data"].default)
    data_defaults = builtin_defaults(data)
    values: dict[str, Any] = {}
    model_kwargs: dict[str, Any] = {}
    for layer in [data_defaults, *layers]:
        for key, value in layer.items():
            if key == "model_kwargs":
                if not isinstance(value, Mapping):
                    raise ConfigError(f"model_kwargs must be a mapping such as {{patch_size: 4}}, got {value!r}")
                model_kwargs.update(value)
            else:
                values[key] = value
    if data_defaults and any("model" in layer and layer["model"] != data_defaults["model"] for layer in layers):
        # A different architecture: the small-image kwargs were chosen for WeightFormer, drop them.
        model_kwargs = {k: v for k, v in model_kwargs.items() if k not in data_defaults["model_kwargs"]}
        for layer in layers:
            model_kwargs.update(layer.get("model_kwargs", {}))
    values["model_kwargs"] = model_kwargs
    cfg = TrainConfig(**{key: _check_value(key, value) for key, value in values.items()})
    _validate(cfg)
    applied = {
        k: v for k, v in data_defaults.items() if k != "model_kwargs" and not any(k in layer for layer in layers)
    }
    kept = {k: v for k, v in data_defaults.get("model_kwargs", {}).items() if cfg.model_kwargs.get(k) == v}
    if kept:
        applied["model_kwargs"] = kept
    return cfg, applied


def _validate(cfg: TrainConfig) -> None:
    if cfg.amp not in ("none", "bf16", "fp16"):
        raise ConfigError(f"amp must be none, bf16 or fp16, got {cfg.amp!r}")
    if cfg.device not in ("auto", "cuda", "cpu"):
        raise ConfigError(f"device must be auto, cuda or cpu, got {cfg.device!r}")
    for name in ("epochs", "batch_size"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{name} must be at least 1, got {getattr(cfg, name)}")
    if cfg.max_steps is not None and cfg.max_steps < 1:
        raise ConfigError(f"max_steps must be at least 1, got {cfg.max_steps}")
    if not cfg.lr > 0:
        raise ConfigError(f"lr must be positive, got {cfg.lr}")
    if cfg.workers < 0:
        raise ConfigError(f"workers must be 0 (load in the training process) or more, got {cfg.workers}")
    if cfg.img_size is not None and cfg.img_size < 1:
        raise ConfigError(f"img_size must be positive, got {cfg.img_size}")
    if not cfg.data:
        raise ConfigError("data is empty; pass --data PATH or a built-in name such as mnist")
