"""Run settings: one dataclass of plain values per task, layered from a recipe, a checkpoint, a file and flags.

:class:`TrainConfig` holds what every run has; a task subclasses it with its own fields, each declared by
:func:`setting` with its help, flag and rule (``RULES``; :meth:`TrainConfig.check` for checks across fields).
:func:`resolve_config` layers, later winning: the defaults, the task's recipe (or a resumed run's saved config),
the ``--config`` YAML (``_base_`` inheritance, :func:`read_yaml_tree`), the flags; a bad value is a ConfigError.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Optional

import yaml

from .errors import ConfigError, brief

__all__ = ["ALIAS_LIMIT", "DuplicateKeyError", "NOT_INHERITED", "REFERENCE_BATCH", "TrainConfig", "check_keys",
           "SettingsLoader", "check_layer", "config_fields", "given_item", "load_yaml", "yaml_reason", "load_config_file",
           "parse_model_kwargs", "read_yaml_tree", "resolve_config", "scaled_learning_rates", "setting",
           "validate_config"]

SCHEDULES = ("cosine", "multistep", "poly")  # timm's schedulers that the loop offers
REFERENCE_BATCH = 512  # lr, min_lr and warmup_lr are given for this total batch and scaled linearly


def setting(default: Any = dataclasses.MISSING, *, help: Optional[str] = None, flag: Optional[str] = None,
            choices: Optional[tuple[Any, ...]] = None, metavar: Optional[str] = None,
            default_factory: Any = dataclasses.MISSING) -> Any:
    """A config field with what its command-line flag needs: ``help`` (a field without help has no flag
    of its own and is set with ``--set name=value``), the flag's name (default ``--field-name``; a
    ``--no-...`` name on a field that defaults to True turns it off), ``choices`` and ``metavar``."""
    return field(default=default, default_factory=default_factory,
                 metadata={"help": help, "flag": flag, "choices": choices, "metavar": metavar})


@dataclass
class TrainConfig:
    """The settings every run has. The defaults are neutral (AdamW, cosine, no warm-up, clipping or augmentation
    beyond flips); the task's recipe file for the data (``configs/<task>/``) sets the values that matter."""

    # data
    data: str = setting("", help="the data: a folder in the task's layout, or a built-in data set")
    img_size: Optional[int] = setting(
        None, help="training and evaluation resolution in pixels (default: the recipe's, else the data set's)")
    workers: int = setting(4, help="data-loading processes per training process")
    verify_images: bool = True  # open every image once at start-up and skip unreadable ones
    hflip: float = setting(0.5, help="probability of a horizontal flip in training")
    no_aug: bool = False  # train on the evaluation transform (only flips, where the task uses them)
    # model
    model: str = setting("", help="the model (a timm name for the backbone tasks)")
    # Keyword arguments of the model builder (timm.create_model's, for the backbone tasks).
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    # optimisation
    epochs: int = setting(100, help="length of the schedule in epochs")
    max_steps: Optional[int] = setting(
        None, help="stop after this many optimizer steps; the schedule is unchanged (smoke tests)")
    batch_size: int = setting(64, help="samples per step and process; capped at the samples a process sees")
    lr: float = setting(1e-3, help="learning rate for a total batch of 512, scaled linearly to the real one")
    min_lr: float = 0.0  # the schedule's final value
    warmup_lr: float = 0.0  # the value the linear warm-up starts from
    warmup_epochs: float = setting(0, help="epochs of linear warm-up (fractions allowed)")
    sched: str = "cosine"  # cosine; multistep (x decay_rate at each of decay_milestones); poly (power decay_rate)
    decay_milestones: tuple[float, ...] = ()  # multistep: the epochs (fractions allowed) of each decay
    decay_rate: float = 0.1  # multistep: the factor of each decay; poly: the power (timm's meanings)
    weight_decay: float = 0.05  # not applied to norms and biases
    layer_decay: Optional[float] = setting(None, help="layer-wise learning-rate decay of the backbone, e.g. 0.75")
    opt: str = "adamw"  # any name in timm.optim.list_optimizers(), optionally lookahead_<name>
    clip_grad: Optional[float] = None  # max gradient norm; None disables clipping
    ema: bool = setting(False, help="keep an EMA of the weights")
    ema_decay: float = 0.9999
    # systems
    amp: str = setting("none", help="mixed precision (fp16 needs a GPU)", choices=("none", "bf16", "fp16"))
    compile: bool = setting(False, help="torch.compile the model")
    compile_backend: str = "inductor"  # torch.compile's backend (aot_eager: graph capture without code generation)
    grad_checkpointing: bool = setting(False, help="recompute activations in backward: much less memory, ~30%% slower")
    device: str = setting("auto", help="auto: cuda if available", choices=("auto", "cuda", "cpu"))
    deterministic: bool = setting(
        False, help="deterministic algorithms; on CPU a resumed run then equals an uninterrupted one exactly")
    seed: int = setting(0, help="random seed, 0 to 2**32-1; each process adds its rank")
    output: Optional[str] = setting(None, help="run folder (default: runs/<prefix><data>_<model>)")
    resume: Optional[str] = setting(None, help="continue a run: auto (last.pt in --output, if any) or a last.pt file",
                                    metavar="{auto,PATH}")
    init: Optional[str] = setting(None, metavar="PATH", help="start a new run from the weights in PATH (any "
                                                             "checkpoint: ours, the authors', timm's, .safetensors)")
    overwrite: bool = setting(
        False, help="start anew in an --output folder that holds a run; its files move to previous-<time>/")
    log_interval: int = setting(50, help="steps between log lines when not on a terminal")

    @classmethod
    def same_model(cls, base: str, other: str) -> bool:
        """Whether settings chosen for model ``base`` (a recipe's ``model_kwargs``) fit model ``other``."""
        return base == other

    @classmethod
    def finish(cls, values: dict[str, Any]) -> dict[str, Any]:
        """The task's own rules on the merged settings before they are checked; the engine applies none."""
        return values

    # (setting, test of a value of the right type, what it must be), in order; each subclass's RULES apply too.
    RULES: ClassVar[tuple[tuple[str, Callable[[Any], bool], str], ...]] = (
        ("data", bool, "a data folder or a built-in data set (--data PATH)"),
        ("model", bool, "a model name (--model NAME)"),
        ("img_size", lambda v: v is None or v >= 1, "a positive number of pixels, or null for the recipe's size"),
        ("workers", lambda v: v >= 0, "0 (load in the training process) or more"),
        ("hflip", lambda v: 0 <= v <= 1, "a probability in [0, 1]"),
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
        ("layer_decay", lambda v: v is None or 0 < v <= 1, "in (0, 1], such as 0.75, or null for none"),
        ("clip_grad", lambda v: v is None or v > 0, "a positive gradient norm, or null for no clipping"),
        ("ema_decay", lambda v: 0 < v < 1, "in (0, 1), such as 0.9999"),
        ("amp", lambda v: v in ("none", "bf16", "fp16"), "none, bf16 or fp16"),
        ("device", lambda v: v in ("auto", "cuda", "cpu"), "auto, cuda or cpu"),
        ("seed", lambda v: 0 <= v <= 2**32 - 1, "in [0, 2**32 - 1]"),
        ("resume", lambda v: v is None or bool(v), "auto, a checkpoint path, or null"),
        ("init", lambda v: v is None or bool(v), "a checkpoint path, or null"),
        ("log_interval", lambda v: v >= 1, "at least 1"),
    )

    def check(self) -> None:
        """Checks beyond one value's rule (subclasses extend it); raise ConfigError."""
        if self.resume is not None and self.init is not None:
            raise ConfigError("--resume continues a run and --init starts one from weights; pass only one of them")
        _check_opt(self.opt)

    def to_dict(self) -> dict[str, Any]:
        """Plain, YAML- and checkpoint-safe values."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


def config_fields(config_class: type[TrainConfig]) -> dict[str, dataclasses.Field]:
    """The fields of ``config_class``, by name."""
    return {f.name: f for f in dataclasses.fields(config_class)}


# Never taken from a resumed checkpoint: where the run lives, and the step limit that stopped it.
NOT_INHERITED = ("output", "resume", "max_steps", "init", "overwrite")


def scaled_learning_rates(cfg: TrainConfig, world_batch: int) -> dict[str, float]:
    """``cfg``'s lr, min_lr and warmup_lr (given for 512) times ``world_batch / 512``, as the release scales them."""
    scale = world_batch / REFERENCE_BATCH
    return {name: getattr(cfg, name) * scale for name in ("lr", "min_lr", "warmup_lr")}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite(name: str, value: Any) -> float:
    """``value`` as a finite float, or ConfigError (bools, strings, inf and nan are refused)."""
    if not _is_number(value):
        raise ConfigError(f"setting {name!r} must be a number, got {brief(value)}")
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        number = math.inf
    if not math.isfinite(number):
        raise ConfigError(f"setting {name!r} must be a finite number, got {number!r}")
    return number


@functools.lru_cache(maxsize=None)
def _type_hints(config_class: type[TrainConfig]) -> dict[str, Any]:
    return typing.get_type_hints(config_class)


def _check_value(config_class: type[TrainConfig], name: str, value: Any) -> Any:
    """Coerce ``value`` to field ``name``'s type (int -> float, list -> tuple) or raise ConfigError."""
    hint = _type_hints(config_class)[name]
    optional = typing.get_origin(hint) is typing.Union and type(None) in typing.get_args(hint)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"setting {name!r} cannot be empty (null); give it a value or drop it")
    base = [a for a in typing.get_args(hint) if a is not type(None)][0] if optional else hint
    origin = typing.get_origin(base) or base
    if origin is float:
        return _finite(name, value)
    if origin is tuple:  # tuple[float, ...]: any number of numbers; tuple[float, float]: [min, max]
        pair = typing.get_args(base)[-1] is not Ellipsis
        if not isinstance(value, (list, tuple)) or not all(_is_number(v) for v in value) or pair and len(value) != 2:
            wanted = "two numbers [min, max]" if pair else "a list of numbers, e.g. [8, 11]"
            raise ConfigError(f"setting {name!r} must be {wanted}, got {brief(value)}")
        return tuple(_finite(name, v) for v in value)
    if origin is int and isinstance(value, bool) or not isinstance(value, origin):
        raise ConfigError(f"setting {name!r} must be of type {origin.__name__}, got {brief(value)}")
    if origin is dict and not all(isinstance(key, str) for key in value):
        raise ConfigError(f"setting {name!r} must map argument names to values, e.g. {{patch_size: 4}}, got {brief(value)}")
    return value


def check_keys(config_class: type[TrainConfig], values: Mapping[Any, Any], source: str) -> None:
    fields = config_fields(config_class)
    for key in values:
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; valid settings: {', '.join(fields)}"
            raise ConfigError(f"unknown setting {brief(key)} in {source}{hint}")


def check_layer(config_class: type[TrainConfig], values: Mapping[str, Any], source: str) -> dict[str, Any]:
    """``values`` (a file's, the flags') with every key a field of ``config_class`` and every value
    coerced to its field's type, or ConfigError naming the first that is not."""
    check_keys(config_class, values, source)
    return {k: _check_value(config_class, k, v) for k, v in values.items()}


ALIAS_LIMIT = 100_000  # characters that aliases may add to a YAML document ("billion laughs" add billions)


class DuplicateKeyError(yaml.YAMLError):
    """A key given twice in one mapping of a YAML file."""


class SettingsLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's floats (``1e-3`` is a number, not the string YAML 1.1 makes of it)
    and YAML 1.2's unique keys (a key given twice in one mapping is a :class:`DuplicateKeyError`; merge keys,
    ``<<: *base``, still override), which refuses aliases that contain themselves or expand the document by
    more than ``ALIAS_LIMIT`` characters."""

    def compose_document(self) -> yaml.Node:
        node = super().compose_document()
        _check_aliases(node)
        return node

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, yaml.Mark] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key, mark = self.construct_object(key_node, deep=True), key_node.start_mark
                try:
                    first = seen.setdefault(key, mark)
                except TypeError:  # an unhashable key: the base loader says what is wrong with it
                    continue
                if first is not mark:
                    where = (f"line {mark.line + 1}, columns {first.column + 1} and {mark.column + 1}"
                             if first.line == mark.line else f"lines {first.line + 1} and {mark.line + 1}")
                    raise DuplicateKeyError(f"the key {brief(key)} is given twice, at {where} (YAML would keep only "
                                            f"the last); rename or remove one")
        return super().construct_mapping(node, deep=deep)


SettingsLoader.add_implicit_resolver(  # plain integers stay ints: YAML's int resolver, registered first, wins
    "tag:yaml.org,2002:float", re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?
                    |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                    |[-+]?\.(?:inf|Inf|INF)
                    |\.(?:nan|NaN|NAN))$""", re.X), list("-+0123456789."))


def _check_aliases(root: yaml.Node) -> None:
    """YAMLError if an alias in the node graph ``root`` contains itself, or if writing every alias out would add
    more than ``ALIAS_LIMIT`` characters (a scalar counts its length + 1, a collection 1), before anything is built."""
    sizes: dict[int, Optional[int]] = {}  # id(node) -> its size with aliases written out; None while inside it
    written = 0  # the size with each node counted once

    def size(node: yaml.Node) -> int:
        nonlocal written
        if id(node) in sizes:
            if sizes[id(node)] is None:
                raise yaml.YAMLError(f"the value anchored at line {node.start_mark.line + 1} holds an alias to "
                                     f"itself; write the value out")
            return sizes[id(node)]
        sizes[id(node)] = None
        if isinstance(node, yaml.ScalarNode):
            own, children = len(node.value) + 1, []
        else:
            own, children = 1, node.value if isinstance(node, yaml.SequenceNode) else [n for kv in node.value for n in kv]
        written += own
        sizes[id(node)] = total = own + sum(size(child) for child in children)
        return total

    if size(root) - written > ALIAS_LIMIT:
        raise yaml.YAMLError(f"its aliases (*name) expand it by more than {ALIAS_LIMIT:,} characters; write the "
                             f"values out")


def load_yaml(text: str) -> Any:
    """YAML text as Python values (safe: plain data only), read by :class:`SettingsLoader`; every YAML the
    project reads from a user goes through here."""
    try:
        return yaml.load(text, Loader=SettingsLoader)  # noqa: S506 (a SafeLoader subclass)
    except RecursionError:
        raise yaml.YAMLError("its values are nested too deeply to read") from None


def yaml_reason(exc: yaml.YAMLError) -> str:
    """One line saying what is wrong with some YAML, and where."""
    problem, mark = getattr(exc, "problem", None), getattr(exc, "problem_mark", None)
    if problem and mark is not None:
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    return str(exc).strip().splitlines()[0]


def _read_mapping(path: Path, role: str) -> dict[str, Any]:
    """The mapping in YAML file ``path`` (``role`` names it in errors: "config file", "_base_ of ...")."""
    if path.is_dir():
        raise ConfigError(f"{role} {path} is a folder; pass a YAML file, e.g. --config {path / 'run.yaml'}")
    if not path.is_file():
        raise ConfigError(f"{role} {path} does not exist; check the path")
    try:
        values = load_yaml(path.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{role} {path} is not a text file (not UTF-8); pass a YAML file of settings") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{role} {path} is not valid YAML ({yaml_reason(exc)})") from exc
    if not isinstance(values, dict):
        raise ConfigError(f"{role} {path} must hold a mapping of settings, got {type(values).__name__}")
    return values


def _merged(under: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` on ``under``: mappings merge key by key (one holding ``_delete_: true`` replaces instead),
    anything else (lists too) is replaced."""
    out = dict(under)
    for key, value in over.items():
        if isinstance(value, dict):
            keep = isinstance(out.get(key), dict) and not value.get("_delete_")
            value = _merged(out[key] if keep else {}, {k: v for k, v in value.items() if k != "_delete_"})
        out[key] = value
    return out


def read_yaml_tree(path: str | Path, role: str = "config file", _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The mapping in YAML file ``path`` over its ``_base_`` files' (mmdetection's rules: paths relative to the
    file, later over earlier, bases may have bases, mappings merge unless ``_delete_: true``); a base's
    ``recipe`` key is not inherited."""
    path = Path(path).expanduser()
    if path.resolve() in _seen:
        cycle = " -> ".join(p.name for p in (*_seen, path.resolve()))
        raise ConfigError(f"{role} {path}: _base_ files inherit in a cycle ({cycle}); remove one _base_")
    values = _read_mapping(path, role)
    bases = values.pop("_base_", [])
    bases = [bases] if isinstance(bases, str) else bases
    if not isinstance(bases, list) or not all(isinstance(b, str) and b for b in bases):
        raise ConfigError(f"{role} {path}: _base_ must be a file name or a list of them, got {brief(bases)}")
    merged: dict[str, Any] = {}
    for base in bases:
        inherited = read_yaml_tree(path.parent / base, f"_base_ of {path}", (*_seen, path.resolve()))
        inherited.pop("recipe", None)
        merged = _merged(merged, inherited)
    return _merged(merged, values)


def load_config_file(path: str | Path, config_class: Optional[type[TrainConfig]] = None) -> dict[str, Any]:
    """The settings in YAML file ``path`` with its bases, less a ``recipe`` key; each a field of ``config_class``."""
    values = read_yaml_tree(path)
    values.pop("recipe", None)
    if config_class is not None:
        check_keys(config_class, values, str(path))
    return values


def parse_model_kwargs(items: list[str], flag: str = "--model-kwargs") -> dict[str, Any]:
    """``["patch_size=4", "drop_path_rate=0.1"]`` -> ``{"patch_size": 4, "drop_path_rate": 0.1}`` (YAML
    values); ``flag``, the option they came from (``--model-kwargs``, ``--set``), is named in errors. One key
    given two different values is a ConfigError naming both."""
    example = f"{flag} {'weight_decay=0.1' if flag == '--set' else 'patch_size=4'}"
    kwargs: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"{flag} {brief(item)} is not KEY=VALUE; write e.g. {example}")
        try:
            value = load_yaml(raw)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{flag} {brief(item)}: the value is not valid YAML ({yaml_reason(exc)}); "
                              f"write e.g. {example}") from exc
        if key in kwargs and kwargs[key] != value:
            raise ConfigError(f"{flag} {given_item(items, key)} and {flag} {brief(item)} give {key!r} two values; "
                              f"pass one")
        kwargs[key] = value
    return kwargs


def given_item(items: list[str], key: str) -> str:
    """The first ``KEY=VALUE`` of ``items`` that sets ``key``, for a message."""
    return brief(next(item for item in items if item.partition("=")[0].strip() == key))


def resolve_config(config_class: type[TrainConfig], base: Mapping[str, Any] | None = None,
                   layers: tuple[Mapping[str, Any], ...] = ()) -> TrainConfig:
    """``config_class``'s defaults, then ``base`` (a recipe's values or a resumed run's config; keys that are no
    field are dropped), then each of ``layers`` (a file's values, the flags: keys must be fields), then
    :meth:`TrainConfig.finish`, checked. Mappings merge key by key, but a layer naming a model that ``base``'s
    settings do not fit (:meth:`TrainConfig.same_model`) drops ``base``'s ``model_kwargs``."""
    fields = config_fields(config_class)
    base = {k: v for k, v in (base or {}).items() if k in fields}
    checked = [{k: _check_value(config_class, k, v) for k, v in layer.items()} for layer in (base, *layers)]
    base_model = checked[0].get("model")
    other_model = base_model is not None and any(
        "model" in layer and not config_class.same_model(base_model, layer["model"]) for layer in checked[1:])
    values: dict[str, Any] = {"model_kwargs": {}}
    for index, layer in enumerate(checked):
        for key, value in layer.items():
            if key == "model_kwargs" and index == 0 and other_model:
                continue
            values[key] = {**values.get(key, {}), **value} if isinstance(value, dict) else value
    return validate_config(config_class(**config_class.finish(values)))


def validate_config(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` (built by hand, or by :func:`resolve_config`) with every value checked and coerced, or ConfigError."""
    config_class = type(cfg)
    cfg = config_class(**{name: _check_value(config_class, name, getattr(cfg, name)) for name in config_fields(config_class)})
    for klass in reversed(config_class.__mro__):
        for name, ok, allowed in vars(klass).get("RULES", ()):
            value = getattr(cfg, name)
            if not ok(value):
                raise ConfigError(f"{name} must be {allowed}, got {brief(value)}")
    cfg.check()
    return cfg


def _check_opt(opt: str) -> None:
    """``opt`` must be an optimizer timm's create_optimizer_v2 can build here."""
    from timm.optim import get_optimizer_class, list_optimizers  # here: building a command line needs no torch

    names = list_optimizers()
    base = opt.lower().removeprefix("lookahead_")
    if base not in names:
        close = difflib.get_close_matches(base, names, n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ConfigError(f"opt {opt!r} is not a timm optimizer; {hint}choose one of timm.optim.list_optimizers(), "
                          f"optionally prefixed lookahead_: {', '.join(names)}")
    try:
        get_optimizer_class(base)
    except (ImportError, AssertionError) as exc:  # apex/bitsandbytes missing, or no CUDA for them
        raise ConfigError(f"opt {opt!r} cannot be used here ({exc}); choose another, such as adamw") from exc
