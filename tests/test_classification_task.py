"""Classification as a whole task: its recipes by data, the Python API equal to its command line, and
``--resume auto`` alone continuing a run on a user's folder with that run's settings."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conftest_train import make_image_folder
from weightformer.classification import recipes
from weightformer.classification.task import ClassificationTask
from weightformer.cli import main
from weightformer.engine import prepare_config
from weightformer.engine.cli import build_parser, train_overrides

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("data"), train_per_class=6, val_per_class=2)


def _cli_settings(argv: list[str]):
    """What ``weightformer train ARGV`` resolves: the flags as the command parses them, then the engine."""
    args = build_parser(ClassificationTask, "weightformer").parse_args(["train", *argv])
    del args.command
    return prepare_config(train_overrides(args, ClassificationTask), getattr(args, "config_file", None),
                          task=ClassificationTask)


@pytest.mark.parametrize("argv, overrides", [
    ([], {}),
    (["--epochs", "3", "--model-kwargs", "depth=2", "--set", "mixup=0.2", "--ema"],
     {"epochs": 3, "model_kwargs": {"depth": 2}, "mixup": 0.2, "ema": True}),
    (["--data", "DATA", "--lr", "1e-3", "--model-arg", "embed_dim=32", "--layer-decay", "0.8"],
     {"data": "DATA", "lr": 1e-3, "model_kwargs": {"embed_dim": 32}, "layer_decay": 0.8}),
])
def test_the_python_api_resolves_what_the_command_line_resolves(argv, overrides, folder: Path):
    argv = [str(folder) if a == "DATA" else a for a in argv]
    overrides = {k: str(folder) if v == "DATA" else v for k, v in overrides.items()}
    by_cli = _cli_settings(argv)
    by_python = prepare_config(overrides, task=ClassificationTask)
    assert by_cli.cfg == by_python.cfg and by_cli.recipe == by_python.recipe


def test_a_small_folder_gets_the_small_data_recipe_and_init_the_fine_tuning_one(folder: Path, tmp_path: Path):
    small = prepare_config({"data": str(folder)}, task=ClassificationTask)
    assert small.recipe.recipe.name == "small-data" and "holds 12 images of 20 px" in small.recipe.reason
    assert (small.cfg.batch_size, small.cfg.mixup, small.cfg.epochs) == (32, 0.0, 100)
    # 20 px images keep their size (rounded to the 4 px patch) instead of 2x2 tokens at 224 px and patch 16
    assert small.cfg.img_size == 20 and small.cfg.model_kwargs["patch_size"] == 4
    tuned = prepare_config({"data": str(folder), "init": str(tmp_path / "w.pt")}, task=ClassificationTask)
    assert tuned.recipe.recipe == recipes.recipe("fine-tune.yaml") and "--init" in tuned.recipe.reason
    assert prepare_config({}, task=ClassificationTask).recipe.recipe.name == "offline"  # mnist


def test_the_first_line_names_the_recipe_and_resume_auto_alone_continues_the_run(folder: Path, tmp_path: Path,
                                                                                 capsys):
    run = tmp_path / "run"
    assert main(["train", "--data", str(folder), "--output", str(run), "--img-size", "16", "--workers", "0",
                 "--model-kwargs", "patch_size=4", "embed_dim=16", "depth=2", "--epochs", "2", "--batch-size", "4",
                 "--max-steps", "2", "--device", "cpu"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("recipe small-data:") and "holds 12 images" in first and "no --init" in first
    assert main(["train", "--output", str(run), "--resume", "auto", "--max-steps", "4"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("recipe resumed:") and "resumed from" in out
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["data"] == str(folder) and saved["img_size"] == 16 and saved["batch_size"] == 4
    assert saved["model_kwargs"] == {"patch_size": 4, "embed_dim": 16, "depth": 2, "drop_path_rate": 0.0}


def test_train_help_speaks_of_classification_and_its_recipes(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    assert "any timm model name" in text and "offline" in text and "small-data" in text and "imagenet" in text
