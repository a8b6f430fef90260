"""Training settings: one dataclass of plain values, layered from defaults, data set, file and flags.

Resolution order, later wins: the dataclass defaults (the release's ImageNet recipe for
WeightFormer-T), a built-in data set's defaults (for ``mnist``: a small model for 28 px digits), the
config saved in the checkpoint being resumed, the ``--config`` YAML file, then command-line flags.
Every value is then checked (:func:`validate_config`): a bad one is a one-line ConfigError.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import timm
import yaml
from timm.data import create_transform
from timm.data.transforms import _str_to_torch_interpolation
from timm.optim import get_optimizer_class, list_optimizers

from ..data import builtin_defaults
from .errors import ConfigError

__all__ = [
    "TrainConfig", "load_config_file", "parse_model_kwargs", "resolve_config", "scaled_learning_rates", "validate_config",
]

SCHEDULES = ("cosine", "multistep", "poly")  # timm's schedulers that the loop offers
REFERENCE_BATCH = 512  # lr, min_lr and warmup_lr are given for this total batch and scaled linearly


@dataclass
class TrainConfig:
    """Every setting of a training run. Defaults are the release's ImageNet recipe for WeightFormer-T.

    The recipe is that of the authors' code (github.com/LeapLabTHU/WeightFormer: config.py defaults
    and cfg/wfm_t.yaml), trained there on 8 GPUs x 256 images.
    """

    # data
    data: str = "mnist"  # a built-in data set name, or an ImageFolder tree with train/ and val/
    img_size: Optional[int] = None  # None: the data set's size (28 for mnist), else 224
    workers: int = 8  # data-loading processes per training process
    verify_images: bool = True  # open every image once at start-up and skip unreadable ones
    # model
    model: str = "weightformer_tiny"  # any timm model name
    # Passed to timm.create_model, with timm's meanings: drop_rate is dropout before the classifier
    # head, proj_drop_rate dropout inside each MLP (the release's DROP_RATE), drop_path_rate the
    # stochastic depth of the last block. WeightFormer's defaults (all 0.0) are the release's T.
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    # optimisation
    epochs: int = 300
    max_steps: Optional[int] = None  # stop after this many optimizer steps (the schedule is unchanged)
    batch_size: int = 256  # per process; the release used 8 GPUs x 256 = 2048
    # The three learning rates are for a total batch of 512; the run scales each of them linearly,
    # to value * batch_size * world_size / 512 (see scaled_learning_rates), as the release does.
    lr: float = 5e-4
    min_lr: float = 5e-6  # the cosine schedule's final value
    warmup_lr: float = 5e-7  # the value the linear warm-up starts from
    warmup_epochs: float = 20  # fractions allowed: ViTDet warms up for 250 steps, 0.136 of its epochs
    sched: str = "cosine"  # cosine; multistep (x decay_rate at each of decay_milestones); poly (power decay_rate)
    decay_milestones: tuple[float, ...] = ()  # multistep: the epochs (fractions allowed) of each decay
    decay_rate: float = 0.1  # multistep: the factor of each decay; poly: the power (timm's meanings)
    weight_decay: float = 0.05  # not applied to norms and biases
    opt: str = "adamw"  # any name in timm.optim.list_optimizers(), optionally lookahead_<name>
    clip_grad: Optional[float] = 5.0  # max gradient norm; None disables clipping
    # regularisation and augmentation
    no_aug: bool = False  # train on the eval transform (resize, crop, normalise); mixup still applies
    smoothing: float = 0.1
    mixup: float = 0.8  # Beta alpha; 0 turns mixup off
    cutmix: float = 1.0  # Beta alpha; 0 turns cutmix off
    auto_augment: Optional[str] = "rand-m9-mstd0.5-inc1"  # a timm RandAugment/AugMix/AutoAugment string
    reprob: float = 0.25  # random erasing probability
    color_jitter: float = 0.4  # timm applies it only without auto_augment (or with a "3a" policy)
    hflip: float = 0.5
    train_scale: tuple[float, float] = (0.08, 1.0)  # RandomResizedCrop area range
    interpolation: str = "bicubic"
    crop_pct: float = 0.875  # eval: resize to img_size / crop_pct, centre-crop img_size
    crop_mode: Optional[str] = None  # eval resize: center, squash or border; None: the model's pretrained config
    ema: bool = False  # the release keeps no EMA
    ema_decay: float = 0.99996
    # dense tasks (detection, segmentation)
    num_classes: Optional[int] = None  # None: the data's (COCO categories; 150 for ADE20K-layout segmentation)
    reduce_zero_label: bool = True  # segmentation: label 0 is "unlabelled" and ignored, 1..K become 0..K-1
    layer_decay: Optional[float] = None  # layer-wise LR decay of the backbone, e.g. 0.75; None: off
    cascade: bool = False  # detection: Cascade Mask R-CNN (3 stages) instead of Mask R-CNN
    seg_inference: str = "whole"  # segmentation evaluation: whole images, or slide (overlapping crops)
    seg_crop: int = 512  # sliding-window crop
    seg_stride: int = 341  # sliding-window stride
    det_resize: str = "lsj"  # detection: lsj (jitter, img_size² crops; ViTDet) or shortest_edge (the 1x schedule's)
    det_max_size: int = 1333  # detection, shortest_edge: the long side's limit (the short side is img_size)
    # generation
    vae: Optional[str] = None  # a local diffusers AutoencoderKL folder: train in its latent space; None: pixels
    min_snr_gamma: Optional[float] = None  # weight L_simple by min(SNR_t, gamma)/SNR_t (Min-SNR); None: DiT's uniform
    # systems
    amp: str = "none"  # none, bf16 or fp16 (fp16 needs a GPU); the release's T and S use fp16
    compile: bool = False
    grad_checkpointing: bool = False  # recompute block activations in backward: less memory, ~30% slower
    device: str = "auto"  # auto (cuda if available), cuda or cpu
    deterministic: bool = False
    seed: int = 0  # 0 .. 2**32 - 1; each process adds its rank
    output: Optional[str] = None  # None: runs/<data>_<model>
    resume: Optional[str] = None  # "auto" (last.pt in output, if any) or a checkpoint path
    init: Optional[str] = None  # start a new run from these weights (any checkpoint format)
    overwrite: bool = False  # start anew in an output folder that holds a run (its files are kept, renamed)
    log_interval: int = 50  # steps between plain log lines when stdout is not a terminal

    def to_dict(self) -> dict[str, Any]:
        """Plain, YAML- and checkpoint-safe values."""
        out = dataclasses.asdict(self)
        out["train_scale"] = list(self.train_scale)
        out["decay_milestones"] = list(self.decay_milestones)
        return out


FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
_HINTS = typing.get_type_hints(TrainConfig)
# Never taken from a resumed checkpoint: where the run lives, and the step limit that stopped it.
_NOT_INHERITED = ("output", "resume", "max_steps", "init", "overwrite")


def scaled_learning_rates(cfg: TrainConfig, world_batch: int) -> dict[str, float]:
    """The run's learning rates for a total batch of ``world_batch`` images per step.

    ``cfg.lr``, ``cfg.min_lr`` and ``cfg.warmup_lr`` are for a total batch of 512; each is scaled by
    ``world_batch / 512``, as the release scales BASE_LR, MIN_LR and WARMUP_LR. Returns
    ``{"lr": ..., "min_lr": ..., "warmup_lr": ...}``.
    """
    scale = world_batch / REFERENCE_BATCH
    return {name: getattr(cfg, name) * scale for name in ("lr", "min_lr", "warmup_lr")}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite(name: str, value: Any) -> float:
    """``value`` as a finite float, or ConfigError (bools, strings, inf and nan are refused)."""
    if not _is_number(value):
        raise ConfigError(f"setting {name!r} must be a number, got {value!r}")
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        number = math.inf
    if not math.isfinite(number):
        raise ConfigError(f"setting {name!r} must be a finite number, got {number!r}")
    return number


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
    if origin is float:
        return _finite(name, value)
    if origin is tuple and typing.get_args(base)[-1] is Ellipsis:  # any number of numbers
        if not isinstance(value, (list, tuple)) or not all(_is_number(v) for v in value):
            raise ConfigError(f"setting {name!r} must be a list of numbers, e.g. [8, 11], got {value!r}")
        return tuple(_finite(name, v) for v in value)
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != 2 or not all(_is_number(v) for v in value):
            raise ConfigError(f"setting {name!r} must be two numbers [min, max], got {value!r}")
        return (_finite(name, value[0]), _finite(name, value[1]))
    if origin is int and isinstance(value, bool) or not isinstance(value, origin):
        raise ConfigError(f"setting {name!r} must be of type {origin.__name__}, got {value!r}")
    if origin is dict and not all(isinstance(key, str) for key in value):
        raise ConfigError(f"setting {name!r} must map argument names to values, e.g. {{patch_size: 4}}, got {value!r}")
    return value


def _check_keys(values: Mapping[Any, Any], source: str) -> None:
    for key in values:
        if key not in FIELDS:
            close = difflib.get_close_matches(str(key), FIELDS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; valid settings: {', '.join(FIELDS)}"
            raise ConfigError(f"unknown setting {key!r} in {source}{hint}")


def _yaml_reason(exc: yaml.YAMLError) -> str:
    """One line saying what is wrong with some YAML, and where."""
    problem, mark = getattr(exc, "problem", None), getattr(exc, "problem_mark", None)
    if problem and mark is not None:
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    return str(exc).strip().splitlines()[0]


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping of :class:`TrainConfig` settings."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config file {path} is a folder; pass a YAML file, e.g. --config {path / 'run.yaml'}")
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; check the --config path")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not a text file (not UTF-8); pass a YAML file of settings") from exc
    try:
        values = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML ({_yaml_reason(exc)})") from exc
    if not isinstance(values, dict):
        raise ConfigError(f"config file {path} must hold a mapping of settings, got {type(values).__name__}")
    _check_keys(values, str(path))
    return values


_FLAG_EXAMPLES = {"--set": "mixup=0"}


def parse_model_kwargs(items: list[str], flag: str = "--model-kwargs") -> dict[str, Any]:
    """``["patch_size=4", "drop_path_rate=0.1"]`` -> ``{"patch_size": 4, "drop_path_rate": 0.1}`` (YAML values).

    ``flag`` is the command-line option the items came from (``--model-kwargs``, ``--model-arg``,
    ``--set``), named in the error messages.
    """
    example = f"{flag} {_FLAG_EXAMPLES.get(flag, 'patch_size=4')}"
    kwargs: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{flag} {item!r} is not KEY=VALUE; write e.g. {example}")
        try:
            kwargs[key.strip()] = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise ConfigError(
                f"{flag} {item!r}: the value is not valid YAML ({_yaml_reason(exc)}); write e.g. {example}"
            ) from exc
    return kwargs


def resolve_config(
    overrides: Mapping[str, Any] | None = None,
    config_file: str | Path | None = None,
    checkpoint_config: Mapping[str, Any] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> tuple[TrainConfig, dict[str, Any]]:
    """Layer defaults, data-set defaults, ``checkpoint_config``, ``config_file`` and ``overrides``.

    ``defaults`` replaces the built-in data set's defaults as the layer above the dataclass's own
    (a task's defaults for its offline data, say).

    ``model_kwargs`` mappings are merged key by key rather than replaced. Every value is checked
    (type, range, and the names timm accepts) before anything uses it; a bad one raises
    ConfigError. Returns the config and the data-set defaults that took effect (for the
    start-of-run message).
    """
    overrides = dict(overrides or {})
    _check_keys(overrides, "the arguments")
    from_file = load_config_file(config_file) if config_file else {}
    from_checkpoint = {k: v for k, v in (checkpoint_config or {}).items() if k in FIELDS and k not in _NOT_INHERITED}
    layers = [{k: _check_value(k, v) for k, v in layer.items()} for layer in (from_checkpoint, from_file, overrides)]
    data = next((layer["data"] for layer in reversed(layers) if "data" in layer), FIELDS["data"].default)
    data_defaults = dict(defaults) if defaults is not None else builtin_defaults(data)
    values: dict[str, Any] = {}
    model_kwargs: dict[str, Any] = {}
    for layer in [data_defaults, *layers]:
        for key, value in layer.items():
            if key == "model_kwargs":
                model_kwargs.update(value)
            else:
                values[key] = value
    if data_defaults and any("model" in layer and layer["model"] != data_defaults["model"] for layer in layers):
        # A different architecture: the small-image kwargs were chosen for WeightFormer, drop them.
        model_kwargs = {k: v for k, v in model_kwargs.items() if k not in data_defaults.get("model_kwargs", {})}
        for layer in layers:
            model_kwargs.update(layer.get("model_kwargs", {}))
    values["model_kwargs"] = model_kwargs
    cfg = validate_config(TrainConfig(**values))
    applied = {
        k: v for k, v in data_defaults.items() if k != "model_kwargs" and not any(k in layer for layer in layers)
    }
    kept = {k: v for k, v in data_defaults.get("model_kwargs", {}).items() if cfg.model_kwargs.get(k) == v}
    if kept:
        applied["model_kwargs"] = kept
    return cfg, applied


# What timm's transforms accept for both the train and eval pipelines (str_to_interp_mode's keys).
_INTERPOLATIONS = tuple(_str_to_torch_interpolation)


def _probability(value: float) -> bool:
    return 0 <= value <= 1


# (setting, test of a value of the right type, what the value must be), checked in this order.
_RULES: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("data", bool, "a built-in data set such as mnist, or an ImageFolder path (--data PATH)"),
    ("model", bool, "a timm model name such as weightformer_tiny"),
    ("img_size", lambda v: v is None or v >= 1, "a positive number of pixels, or null for the data set's own size"),
    ("workers", lambda v: v >= 0, "0 (load in the training process) or more"),
    ("epochs", lambda v: v >= 1, "at least 1"),
    ("max_steps", lambda v: v is None or v >= 1, "at least 1, or null for no limit"),
    ("batch_size", lambda v: v >= 1, "at least 1"),
    ("lr", lambda v: v > 0, "positive"),
    ("min_lr", lambda v: v >= 0, "0 or more"),
    ("warmup_lr", lambda v: v >= 0, "0 or more"),
    ("warmup_epochs", lambda v: v >= 0, "0 (no warm-up) or more"),
    ("sched", lambda v: v in SCHEDULES, f"one of {', '.join(SCHEDULES)}"),
    ("decay_milestones", lambda v: all(a < b for a, b in zip((0.0, *v), v)), "increasing positive epochs, e.g. [8, 11]"),
    ("decay_rate", lambda v: v > 0, "positive: the multistep factor (e.g. 0.1) or the poly power (e.g. 1.0)"),
    ("weight_decay", lambda v: v >= 0, "0 (none) or more"),
    ("clip_grad", lambda v: v is None or v > 0, "a positive gradient norm, or null for no clipping"),
    ("smoothing", lambda v: 0 <= v < 1, "in [0, 1): 0 for none, 0.1 for the paper's"),
    ("mixup", lambda v: v >= 0, "0 (off) or a positive Beta alpha such as 0.8"),
    ("cutmix", lambda v: v >= 0, "0 (off) or a positive Beta alpha such as 1.0"),
    ("reprob", _probability, "a probability in [0, 1]"),
    ("color_jitter", lambda v: v >= 0, "0 (off) or more, such as 0.4"),
    ("hflip", _probability, "a probability in [0, 1]"),
    ("train_scale", lambda v: 0 < v[0] <= v[1] <= 1, "[min, max] image-area fractions with 0 < min <= max <= 1"),
    ("crop_pct", lambda v: 0 < v <= 1, "in (0, 1], such as 0.875"),
    ("crop_mode", lambda v: v in (None, "center", "squash", "border"), "center, squash, border, or null (the model's)"),
    ("ema_decay", lambda v: 0 < v < 1, "in (0, 1), such as 0.99996"),
    ("amp", lambda v: v in ("none", "bf16", "fp16"), "none, bf16 or fp16"),
    ("device", lambda v: v in ("auto", "cuda", "cpu"), "auto, cuda or cpu"),
    ("seed", lambda v: 0 <= v <= 2**32 - 1, "in [0, 2**32 - 1]"),
    ("resume", lambda v: v is None or bool(v), "auto, a checkpoint path, or null"),
    ("init", lambda v: v is None or bool(v), "a checkpoint path, or null"),
    ("log_interval", lambda v: v >= 1, "at least 1"),
    ("num_classes", lambda v: v is None or v >= 1, "at least 1, or null for the data's own"),
    ("layer_decay", lambda v: v is None or 0 < v <= 1, "in (0, 1], such as 0.75, or null for none"),
    ("seg_inference", lambda v: v in ("whole", "slide"), "whole or slide"),
    ("seg_crop", lambda v: v >= 1, "a positive number of pixels"),
    ("seg_stride", lambda v: v >= 1, "a positive number of pixels"),
    ("det_resize", lambda v: v in ("lsj", "shortest_edge"), "lsj or shortest_edge"),
    ("det_max_size", lambda v: v >= 1, "a positive number of pixels"),
    ("min_snr_gamma", lambda v: v is None or v > 0, "a positive SNR cap such as 5, or null for DiT's uniform weighting"),
)


def validate_config(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with every value checked and coerced (ints to floats, lists to tuples), or ConfigError.

    :func:`resolve_config` calls it; call it on a :class:`TrainConfig` built by hand.
    """
    cfg = TrainConfig(**{name: _check_value(name, getattr(cfg, name)) for name in FIELDS})
    for name, ok, allowed in _RULES:
        value = getattr(cfg, name)
        if not ok(value):
            raise ConfigError(f"{name} must be {allowed}, got {value!r}")
    if cfg.resume is not None and cfg.init is not None:
        raise ConfigError("--resume continues a run and --init starts one from weights; pass only one of them")
    if not timm.is_model(cfg.model):
        close = difflib.get_close_matches(cfg.model, timm.list_models(), n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ConfigError(f"model {cfg.model!r} is not a timm model; {hint}list names with timm.list_models('*vit*')")
    _check_opt(cfg.opt)
    if cfg.interpolation not in _INTERPOLATIONS:
        raise ConfigError(f"interpolation must be one of {', '.join(_INTERPOLATIONS)}, got {cfg.interpolation!r}")
    _check_auto_augment(cfg.auto_augment)
    return cfg


def _check_opt(opt: str) -> None:
    """``opt`` must be an optimizer timm's create_optimizer_v2 can build here."""
    names = list_optimizers()
    base = opt.lower().removeprefix("lookahead_")
    if base not in names:
        close = difflib.get_close_matches(base, names, n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ConfigError(
            f"opt {opt!r} is not a timm optimizer; {hint}choose one of timm.optim.list_optimizers(), "
            f"optionally prefixed lookahead_: {', '.join(names)}"
        )
    try:
        get_optimizer_class(base)
    except (ImportError, AssertionError) as exc:  # apex/bitsandbytes missing, or no CUDA for them
        raise ConfigError(f"opt {opt!r} cannot be used here ({exc}); choose another, such as adamw") from exc


def _check_auto_augment(policy: Optional[str]) -> None:
    """``policy`` must parse with timm's RandAugment/AugMix/AutoAugment parsers (as create_transform calls them)."""
    if not policy:
        return
    try:
        create_transform(32, is_training=True, auto_augment=policy)
    except (AssertionError, ValueError) as exc:  # how timm's parsers reject a policy string
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else "timm cannot parse it"
        raise ConfigError(
            f"auto_augment {policy!r} is not a timm augmentation policy ({reason}); use a RandAugment string "
            f"such as rand-m9-mstd0.5-inc1, an AugMix string such as augmix-m5-w4-d2, an AutoAugment policy "
            f"(original, originalr, v0, v0r, 3a), or null for none"
        ) from exc
