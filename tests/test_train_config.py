"""Settings: layering of defaults, files and flags; the shipped ImageNet configs hold the paper's recipe."""

from __future__ import annotations

from pathlib import Path

import pytest

from weightformer.engine import ConfigError, parse_model_kwargs, resolve_config

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


@pytest.mark.parametrize("variant, model, drop_path, img_size", [
    ("t", "weightformer_tiny", 0.0, 224),
    ("s", "weightformer_small", 0.2, 224),
    ("b", "weightformer_base", 0.2, 448),
])
def test_shipped_configs_are_the_papers_recipe(variant: str, model: str, drop_path: float, img_size: int):
    cfg, applied = resolve_config({"data": "/data/imagenet"}, CONFIGS / f"imagenet_weightformer_{variant}.yaml")
    assert applied == {}  # no small-image defaults leak into an ImageNet run
    assert (cfg.model, cfg.img_size, cfg.model_kwargs["drop_path_rate"]) == (model, img_size, drop_path)
    assert (cfg.epochs, cfg.opt, cfg.lr, cfg.weight_decay, cfg.warmup_epochs) == (300, "adamw", 5e-4, 0.05, 20)
    assert (cfg.auto_augment, cfg.mixup, cfg.cutmix, cfg.smoothing, cfg.reprob) == ("rand-m9-mstd0.5-inc1", 0.8, 1.0, 0.1, 0.25)
    assert cfg.clip_grad == 5.0 and cfg.amp in ("bf16", "fp16") and not cfg.no_aug


def test_mnist_defaults_apply_under_flags():
    cfg, applied = resolve_config({"epochs": 2, "model_kwargs": {"depth": 3}})
    assert cfg.data == "mnist" and cfg.epochs == 2 and cfg.img_size == 28
    assert cfg.model_kwargs["patch_size"] == 4 and cfg.model_kwargs["depth"] == 3
    assert "epochs" not in applied and "depth" not in applied["model_kwargs"]


def test_another_model_drops_the_weightformer_kwargs():
    cfg, _ = resolve_config({"model": "deit_tiny_patch16_224", "model_kwargs": {"drop_path_rate": 0.1}})
    assert cfg.model_kwargs == {"drop_path_rate": 0.1}


def test_checkpoint_config_is_the_base_when_resuming():
    saved = {"data": "/data/x", "epochs": 5, "max_steps": 3, "output": "/old", "lr": 1e-3}
    cfg, _ = resolve_config({"epochs": 7}, checkpoint_config=saved)
    assert (cfg.data, cfg.epochs, cfg.lr, cfg.max_steps, cfg.output) == ("/data/x", 7, 1e-3, None, None)


@pytest.mark.parametrize("overrides, message", [
    ({"amp": "fp8"}, "amp must be none, bf16 or fp16"),
    ({"epochs": "ten"}, "'epochs' must be of type int"),
    ({"mixupp": 0.1}, "did you mean 'mixup'"),
    ({"batch_size": 0}, "batch_size must be at least 1"),
])
def test_bad_settings_name_the_value(overrides: dict, message: str):
    with pytest.raises(ConfigError, match=message):
        resolve_config(overrides)


def test_model_kwargs_are_yaml_values():
    assert parse_model_kwargs(["patch_size=4", "drop_path_rate=0.1", "act=gelu", "flag=true"]) == {
        "patch_size": 4, "drop_path_rate": 0.1, "act": "gelu", "flag": True}
    with pytest.raises(ConfigError, match="is not KEY=VALUE"):
        parse_model_kwargs(["patch_size"])


def test_config_file_errors(tmp_path: Path):
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_config({}, tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        resolve_config({}, bad)
