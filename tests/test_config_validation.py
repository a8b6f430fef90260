"""Every setting is checked when the configuration is resolved: one-line ConfigError naming the
setting, the bad value and what is allowed, never a crash later in the run."""

from __future__ import annotations

import importlib.util
import math
import re
import typing
from pathlib import Path

import pytest

from weightformer.classification.config import ClassificationConfig
from weightformer.classification.task import ClassificationTask
from weightformer.engine import ConfigError, parse_model_kwargs, prepare_config
from weightformer.engine.config import resolve_config as resolve_layers
from weightformer.engine.config import validate_config

FLOAT_SETTINGS = [name for name, hint in typing.get_type_hints(ClassificationConfig).items()
                  if hint in (float, typing.Optional[float])]


def resolve_config(overrides: dict, config_file: Path | None = None, checkpoint_config: dict | None = None):
    """A classification run's settings, as ``weightformer train`` resolves them (the checkpoint's saved
    settings, when given, as the base layer)."""
    if checkpoint_config is not None:
        return resolve_layers(ClassificationConfig, checkpoint_config, (overrides,)), {}
    prepared = prepare_config(overrides, str(config_file) if config_file else None, task=ClassificationTask)
    return prepared.cfg, prepared.applied


def _error(overrides: dict) -> str:
    with pytest.raises(ConfigError) as info:
        resolve_config(overrides)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("overrides, message", [
    ({"seed": -1}, r"seed must be in \[0, 2\*\*32 - 1\], got -1$"),
    ({"seed": 2**32}, r"seed must be in \[0, 2\*\*32 - 1\], got 4294967296$"),
    ({"opt": "foo"}, r"opt 'foo' is not a timm optimizer; .*list_optimizers\(\).*: adabelief, .*adamw, .*sgd"),
    ({"opt": "adamww"}, r"did you mean adamw"),
    ({"opt": "lookahead_foo"}, r"opt 'lookahead_foo' is not a timm optimizer"),
    ({"interpolation": "foo"}, r"interpolation must be one of nearest, bilinear, bicubic, box, hamming, lanczos, "
                               r"got 'foo'"),
    ({"interpolation": "random"}, r"interpolation must be one of .*got 'random'"),  # timm's eval resize refuses it
    ({"auto_augment": "garbage"}, r"auto_augment 'garbage' is not a timm augmentation policy "
                                  r"\(Unknown AA policy garbage\); use a RandAugment string such as rand-m9"),
    ({"auto_augment": "rand-m9-w0"}, r"auto_augment 'rand-m9-w0' .*\(Unknown RandAugment config section\)"),
    ({"auto_augment": "rand-m9.5.5"}, r"auto_augment 'rand-m9.5.5' .*\(invalid literal for int"),
    ({"auto_augment": "randaug"}, r"auto_augment 'randaug' .*\(timm cannot parse it\).*or null for none"),
    ({"min_lr": -1}, r"min_lr must be 0 or more, got -1.0$"),
    ({"warmup_lr": -1e-6}, r"warmup_lr must be 0 or more, got -1e-06$"),
    ({"lr": 0}, r"lr must be positive, got 0.0$"),
    ({"train_scale": ["a", "b"]}, r"'train_scale' must be two numbers \[min, max\], got \['a', 'b'\]$"),
    ({"train_scale": [0.5]}, r"'train_scale' must be two numbers \[min, max\], got \[0.5\]$"),
    ({"train_scale": [0.1, 0.5, 1.0]}, r"'train_scale' must be two numbers"),
    ({"train_scale": [True, 1.0]}, r"'train_scale' must be two numbers"),
    ({"train_scale": 0.5}, r"'train_scale' must be two numbers \[min, max\], got 0.5$"),
    ({"train_scale": [0.9, 0.5]}, r"train_scale must be \[min, max\] .*0 < min <= max <= 1, got \(0.9, 0.5\)$"),
    ({"train_scale": [0.0, 1.0]}, r"train_scale must be .*got \(0.0, 1.0\)$"),
    ({"train_scale": [0.5, 1.5]}, r"train_scale must be .*got \(0.5, 1.5\)$"),
    ({"data": [1]}, r"setting 'data' must be of type str, got \[1\]$"),
    ({"model": 3}, r"setting 'model' must be of type str, got 3$"),
    ({"auto_augment": 9}, r"setting 'auto_augment' must be of type str, got 9$"),
    ({"ema": 1}, r"setting 'ema' must be of type bool, got 1$"),
    ({"lr": "fast"}, r"setting 'lr' must be a number, got 'fast'$"),
    ({"lr": True}, r"setting 'lr' must be a number, got True$"),
    ({"model_kwargs": {1: 2}}, r"setting 'model_kwargs' must map argument names to values"),
    ({"model_kwargs": [1]}, r"setting 'model_kwargs' must be of type dict"),
    ({"smoothing": 1.0}, r"smoothing must be in \[0, 1\).*got 1.0$"),
    ({"smoothing": -0.1}, r"smoothing must be in \[0, 1\)"),
    ({"reprob": 1.5}, r"reprob must be a probability in \[0, 1\], got 1.5$"),
    ({"hflip": -0.1}, r"hflip must be a probability in \[0, 1\], got -0.1$"),
    ({"mixup": -0.8}, r"mixup must be 0 \(off\) or a positive Beta alpha"),
    ({"cutmix": -1}, r"cutmix must be 0 \(off\) or a positive Beta alpha"),
    ({"color_jitter": -0.4}, r"color_jitter must be 0 \(off\) or more"),
    ({"crop_pct": 0}, r"crop_pct must be in \(0, 1\]"),
    ({"crop_pct": 1.2}, r"crop_pct must be in \(0, 1\], such as 0.875, got 1.2$"),
    ({"crop_mode": "stretch"}, r"crop_mode must be center, squash, border, or null"),
    ({"weight_decay": -0.05}, r"weight_decay must be 0 \(none\) or more, got -0.05$"),
    ({"ema_decay": 1.0}, r"ema_decay must be in \(0, 1\)"),
    ({"ema_decay": 0}, r"ema_decay must be in \(0, 1\)"),
    ({"clip_grad": 0}, r"clip_grad must be a positive gradient norm, or null for no clipping, got 0.0$"),
    ({"log_interval": 0}, r"log_interval must be at least 1, got 0$"),
    ({"warmup_epochs": -1}, r"warmup_epochs must be 0 \(no warm-up\) or more, got -1.0$"),
    ({"sched": "step"}, r"sched must be one of cosine, multistep, poly, got .step.$"),
    ({"decay_milestones": [11, 8]}, r"decay_milestones must be increasing positive epochs, e.g. \[8, 11\], got \(11.0, 8.0\)$"),
    ({"decay_milestones": [8, "x"]}, r"must be a list of numbers"),
    ({"epochs": 0}, r"epochs must be at least 1"),
    ({"max_steps": 0}, r"max_steps must be at least 1, or null"),
    ({"workers": -1}, r"workers must be 0 \(load in the training process\) or more"),
    ({"img_size": 0}, r"img_size must be a positive number of pixels"),
    ({"device": "tpu"}, r"device must be auto, cuda or cpu, got 'tpu'$"),
    ({"data": ""}, r"data must be a data folder or a built-in data set"),
    ({"model": ""}, r"model must be a model name \(--model NAME\)"),
    ({"model": "weightformer_tinny"}, r"'weightformer_tinny' is not a timm model; did you mean weightformer_tiny"),
    ({"resume": ""}, r"resume must be auto, a checkpoint path, or null"),
])
def test_bad_settings_are_refused_with_the_allowed_values(overrides: dict, message: str):
    error = _error(overrides)
    assert re.search(message, error), error


@pytest.mark.skipif(importlib.util.find_spec("apex") is not None, reason="apex is installed")
def test_an_optimizer_timm_cannot_build_here_is_refused():
    # timm lists APEX's fused optimizers, but builds them only with CUDA and the apex package.
    assert _error({"opt": "fusedadam"}).startswith("opt 'fusedadam' cannot be used here (")


@pytest.mark.parametrize("name", FLOAT_SETTINGS)
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_non_finite_numbers_are_refused(name: str, value: float):
    assert f"setting {name!r} must be a finite number, got {value!r}" in _error({name: value})


def test_every_float_setting_is_covered():
    assert {"lr", "min_lr", "warmup_lr", "clip_grad", "ema_decay", "crop_pct", "smoothing"} <= set(FLOAT_SETTINGS)


def test_non_finite_train_scale_and_huge_integers_are_refused():
    assert "'train_scale' must be a finite number, got nan" in _error({"train_scale": [0.1, math.nan]})
    assert "'lr' must be a finite number, got inf" in _error({"lr": 10**400})


@pytest.mark.parametrize("overrides", [
    {"seed": 0}, {"seed": 2**32 - 1}, {"opt": "lookahead_adamw"}, {"opt": "SGD"}, {"interpolation": "bilinear"},
    {"auto_augment": "augmix-m5-w4-d2"}, {"auto_augment": "v0"}, {"auto_augment": None}, {"smoothing": 0},
    {"reprob": 1}, {"hflip": 0}, {"crop_pct": 1}, {"clip_grad": None}, {"warmup_epochs": 0}, {"min_lr": 0},
    {"train_scale": [1, 1]}, {"crop_mode": "squash"}, {"mixup": 0, "cutmix": 0},
])
def test_edge_values_are_accepted(overrides: dict):
    cfg, _ = resolve_config(overrides)
    for name, value in overrides.items():
        assert getattr(cfg, name) == (tuple(value) if isinstance(value, list) else value)


def test_a_config_built_by_hand_is_checked_and_coerced():
    cfg = validate_config(ClassificationConfig(data="/data/x", lr=1, train_scale=[0.5, 1]))
    assert (cfg.lr, cfg.train_scale) == (1.0, (0.5, 1.0)) and isinstance(cfg.lr, float)
    with pytest.raises(ConfigError, match="'lr' must be a finite number, got inf"):
        validate_config(ClassificationConfig(lr=math.inf))
    with pytest.raises(ConfigError, match=r"opt 'foo' is not a timm optimizer"):
        validate_config(ClassificationConfig(opt="foo"))


def test_bad_values_in_a_config_file_or_checkpoint_are_refused(tmp_path: Path):
    path = tmp_path / "run.yaml"
    path.write_text("lr: .inf\n")
    with pytest.raises(ConfigError, match="'lr' must be a finite number, got inf"):
        resolve_config({}, path)
    with pytest.raises(ConfigError, match=r"setting 'data' must be of type str, got \[1\]"):
        resolve_config({}, checkpoint_config={"data": [1]})


def test_config_file_that_is_binary_or_a_folder(tmp_path: Path):
    binary = tmp_path / "weights.pt"
    binary.write_bytes(b"PK\x03\x04\x80\xff\xfe\x00" * 8)
    with pytest.raises(ConfigError, match=r"^config file .*weights.pt is not a text file \(not UTF-8\); pass a YAML"):
        resolve_config({}, binary)
    with pytest.raises(ConfigError, match=r"^config file .* is a folder; pass a YAML file"):
        resolve_config({}, tmp_path)


def test_config_file_errors_are_one_line(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("lr: [1\nepochs: 2\n")
    with pytest.raises(ConfigError) as info:
        resolve_config({}, bad)
    assert "is not valid YAML" in str(info.value) and "line " in str(info.value) and "\n" not in str(info.value)
    numbers = tmp_path / "numbers.yaml"
    numbers.write_text("1: 2\n")
    with pytest.raises(ConfigError, match="unknown setting 1 in"):
        resolve_config({}, numbers)


def test_key_value_errors_name_the_flag():
    with pytest.raises(ConfigError, match=r"^--set 'garbage' is not KEY=VALUE; write e.g. --set weight_decay=0.1$"):
        parse_model_kwargs(["garbage"], flag="--set")
    with pytest.raises(ConfigError, match=r"^--model-arg '=4' is not KEY=VALUE; write e.g. --model-arg patch_size=4$"):
        parse_model_kwargs(["=4"], flag="--model-arg")
    with pytest.raises(ConfigError, match=r"^--model-kwargs 'patch_size' is not KEY=VALUE"):
        parse_model_kwargs(["patch_size"])  # the default flag, for existing callers
    with pytest.raises(ConfigError) as info:
        parse_model_kwargs(["train_scale=[0.1"], flag="--set")
    message = str(info.value)
    assert message.startswith("--set 'train_scale=[0.1': the value is not valid YAML (") and "\n" not in message
