"""Settings: layering of defaults, files and flags; the shipped ImageNet configs hold the release's recipe."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from weightformer.classification import recipes
from weightformer.classification.config import ClassificationConfig
from weightformer.classification.task import ClassificationTask
from weightformer.engine import ConfigError, parse_model_kwargs, prepare_config, resolve_config
from weightformer.engine.config import scaled_learning_rates
from weightformer.models import WeightFormer

CONFIGS = Path(__file__).resolve().parent.parent / "configs" / "classification"


# The authors' release, github.com/LeapLabTHU/WeightFormer at cb55a4a: config.py's defaults under
# cfg/wfm_{t,s,b}.yaml, trained with `torchrun --nproc_per_node=8` (README) at DATA.BATCH_SIZE 256 per GPU.
RELEASE_GPUS = 8
RELEASE = dict(
    epochs=300, warmup_epochs=20, batch_size=256, opt="adamw", weight_decay=0.05, clip_grad=5.0,
    lr=5e-4, min_lr=5e-6, warmup_lr=5e-7,  # TRAIN.BASE_LR, MIN_LR, WARMUP_LR, per total batch of 512
    smoothing=0.1, mixup=0.8, cutmix=1.0, auto_augment="rand-m9-mstd0.5-inc1", reprob=0.25, color_jitter=0.4,
    hflip=0.5, train_scale=(0.08, 1.0), interpolation="bicubic", crop_pct=0.875, ema=False, seed=0, workers=8,
    no_aug=False,
)
# main.py: each of BASE_LR, WARMUP_LR and MIN_LR times DATA.BATCH_SIZE * world_size / 512.0.
RELEASE_EFFECTIVE = {name: RELEASE[name] * RELEASE["batch_size"] * RELEASE_GPUS / 512.0
                     for name in ("lr", "min_lr", "warmup_lr")}
VARIANTS = [  # variant, model, img_size (DATA.IMG_SIZE), drop_path_rate (MODEL.DROP_PATH_RATE), amp (AMP)
    ("t", "weightformer_tiny", 224, 0.0, "fp16"),
    ("s", "weightformer_small", 224, 0.2, "fp16"),
    ("b", "weightformer_base", 448, 0.2, "none"),
]


@pytest.fixture
def imagenet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An ImageFolder tree that counts as ImageNet-scale (the threshold lowered to its one image)."""
    (tmp_path / "imagenet" / "train" / "n01440764").mkdir(parents=True)
    (tmp_path / "imagenet" / "train" / "n01440764" / "a.JPEG").write_bytes(b"")
    monkeypatch.setattr(recipes, "FULL_SCALE_IMAGES", 1)
    return tmp_path / "imagenet"


def _resolve(overrides: dict, config_file: Path | None = None):
    prepared = prepare_config(overrides, str(config_file) if config_file else None, task=ClassificationTask)
    return prepared.cfg, prepared.applied


def _shipped(variant: str, data: Path):
    prepared = prepare_config({"data": str(data)}, str(CONFIGS / f"imagenet_weightformer_{variant}.yaml"),
                              task=ClassificationTask)
    assert prepared.recipe.recipe.path == CONFIGS / "imagenet_weightformer_t.yaml"
    return prepared.cfg, prepared.applied


@pytest.mark.parametrize("variant, model, img_size, drop_path, amp", VARIANTS)
def test_shipped_configs_are_the_release_recipe(variant: str, model: str, img_size: int, drop_path: float, amp: str,
                                                imagenet: Path):
    cfg, applied = _shipped(variant, imagenet)
    # no small-image defaults leak into an ImageNet run: the recipe is T's file, whose model kwargs S and B override
    assert set(applied) <= {"model_kwargs"} and applied.get("model_kwargs", {}).items() <= cfg.model_kwargs.items()
    assert {name: getattr(cfg, name) for name in RELEASE} == RELEASE
    assert (cfg.model, cfg.img_size, cfg.amp, cfg.crop_mode) == (model, img_size, amp, "squash")
    # timm's names: the release's MLP dropout (its drop_rate, 0.0) is proj_drop_rate; no head dropout.
    assert cfg.model_kwargs == {"drop_rate": 0.0, "proj_drop_rate": 0.0, "drop_path_rate": drop_path}


@pytest.mark.parametrize("variant", ["t", "s", "b"])
def test_shipped_configs_run_the_release_schedule_at_its_batch(variant: str, imagenet: Path):
    cfg, _ = _shipped(variant, imagenet)
    assert RELEASE_EFFECTIVE == {"lr": 2e-3, "min_lr": 2e-5, "warmup_lr": 2e-6}
    assert scaled_learning_rates(cfg, cfg.batch_size * RELEASE_GPUS) == RELEASE_EFFECTIVE


def test_the_imagenet_recipe_is_the_release_recipe_for_t_and_the_defaults_are_neutral():
    cfg = resolve_config(ClassificationConfig, recipes.recipe("imagenet_weightformer_t.yaml").values)
    assert {name: getattr(cfg, name) for name in RELEASE} == RELEASE
    assert (cfg.model, cfg.amp, cfg.crop_mode) == ("weightformer_tiny", "fp16", "squash")
    defaults = inspect.signature(WeightFormer).parameters  # the recipe's dropouts are the model's, all 0.0 in T
    assert [defaults[name].default for name in ("drop_rate", "proj_drop_rate", "drop_path_rate")] == \
        [cfg.model_kwargs[name] for name in ("drop_rate", "proj_drop_rate", "drop_path_rate")] == [0.0] * 3
    neutral = ClassificationConfig()  # no recipe: no augmentation beyond flips and crops, no warm-up, no clipping
    assert (neutral.mixup, neutral.cutmix, neutral.auto_augment, neutral.reprob, neutral.warmup_epochs,
            neutral.clip_grad, neutral.amp) == (0.0, 0.0, None, 0.0, 0, None, "none")


def test_every_learning_rate_scales_with_the_total_batch():
    cfg = ClassificationConfig(lr=1e-3, min_lr=1e-5, warmup_lr=1e-6)
    assert scaled_learning_rates(cfg, 512) == {"lr": 1e-3, "min_lr": 1e-5, "warmup_lr": 1e-6}
    assert scaled_learning_rates(cfg, 128) == {"lr": 2.5e-4, "min_lr": 2.5e-6, "warmup_lr": 2.5e-7}


def test_mnist_defaults_apply_under_flags():
    cfg, applied = _resolve({"epochs": 2, "model_kwargs": {"depth": 3}})
    assert cfg.data == "mnist" and cfg.epochs == 2 and cfg.img_size == 28
    assert cfg.model_kwargs["patch_size"] == 4 and cfg.model_kwargs["depth"] == 3
    assert "epochs" not in applied and "depth" not in applied["model_kwargs"]


def test_another_model_drops_the_weightformer_kwargs():
    cfg, _ = _resolve({"model": "deit_tiny_patch16_224", "model_kwargs": {"drop_path_rate": 0.1}})
    assert cfg.model_kwargs == {"drop_path_rate": 0.1}


def test_a_base_layer_is_overridden_by_flags_and_its_stale_keys_dropped():
    saved = {"data": "/data/x", "epochs": 5, "lr": 1e-3, "cascade": True}  # cascade: another task's setting
    cfg = resolve_config(ClassificationConfig, saved, ({"epochs": 7},))
    assert (cfg.data, cfg.epochs, cfg.lr) == ("/data/x", 7, 1e-3)


@pytest.mark.parametrize("overrides, message", [
    ({"amp": "fp8"}, "amp must be none, bf16 or fp16"),
    ({"epochs": "ten"}, "'epochs' must be of type int"),
    ({"mixupp": 0.1}, "did you mean 'mixup'"),
    ({"batch_size": 0}, "batch_size must be at least 1"),
])
def test_bad_settings_name_the_value(overrides: dict, message: str):
    with pytest.raises(ConfigError, match=message):
        _resolve(overrides)


def test_model_kwargs_are_yaml_values():
    assert parse_model_kwargs(["patch_size=4", "drop_path_rate=0.1", "act=gelu", "flag=true"]) == {
        "patch_size": 4, "drop_path_rate": 0.1, "act": "gelu", "flag": True}
    with pytest.raises(ConfigError, match="is not KEY=VALUE"):
        parse_model_kwargs(["patch_size"])


def test_config_file_errors(tmp_path: Path):
    with pytest.raises(ConfigError, match="does not exist"):
        _resolve({}, tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        _resolve({}, bad)
