"""Detection as a whole task: the recipe a folder gets and why, the layouts read (COCO 2017 as downloaded,
today's names, any names through flags), ``--resume auto`` alone, and the Python API equal to the CLI."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from test_detection_cli import TINY
from weightformer.cli import main
from weightformer.data import DataError
from weightformer.detection import DetectionConfig, DetectionTask, find_split, recipes, synthetic
from weightformer.engine import prepare_config
from weightformer.engine.cli import build_parser, train_overrides
from weightformer.engine.distributed import init_distributed

pytestmark = pytest.mark.usefixtures("one_thread")

COCO_2017 = {"train2017": 4, "val2017": 2}
TINY_KWARGS = dict(item.split("=") for item in TINY[1:TINY.index("--img-size")])  # KEY=VALUE strings


def _kwargs(config: dict) -> dict:
    """The backbone's and the detector's keyword arguments of a saved config, in one mapping as TINY gives them."""
    return {**config["model_kwargs"], **config["detector_kwargs"]}


@pytest.fixture(scope="module")
def coco2017(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """COCO 2017 as downloaded, both ways at once: val2017/ under images/, train2017/ beside annotations/."""
    root = synthetic.write_shapes(tmp_path_factory.mktemp("coco") / "coco", seed=1, split_sizes=COCO_2017)
    (root / "images" / "train2017").rename(root / "train2017")
    return root


def _first_line(capsys) -> str:
    return capsys.readouterr().out.splitlines()[0]


# -------------------------------------------------------------------------------------------------
# (a) --resume auto alone continues a COCO-2017 run with its own settings
# -------------------------------------------------------------------------------------------------
def test_resume_auto_alone_continues_a_coco_2017_run_with_its_own_settings(coco2017: Path, tmp_path: Path, capsys):
    run = tmp_path / "run"
    assert main(["det", "train", "--data", str(coco2017), "--output", str(run), "--epochs", "2", "--max-steps", "1",
                 "--set", "clip_grad=2.5", *TINY]) == 0
    first = _first_line(capsys)
    assert first.startswith("recipe small-data:") and "holds 4 training images" in first and "no --init" in first
    saved = torch.load(run / "last.pt", weights_only=True)
    assert saved["global_step"] == 1

    assert main(["det", "train", "--output", str(run), "--resume", "auto"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("recipe resumed:") and f"resumed from {run / 'last.pt'}" in out
    after = torch.load(run / "last.pt", weights_only=True)
    assert after["global_step"] == 4  # 2 epochs of 4 images at batch 2
    assert after["meta"] == saved["meta"] and after["meta"]["data"] == str(coco2017.resolve())
    # the run's own model kwargs, nothing merged in from a recipe (the shapes job's have embed_dim 64, rpn_* ...)
    assert _kwargs(after["config"]) == _kwargs(saved["config"]) == {k: int(v) for k, v in TINY_KWARGS.items()}
    unchanged = {k: v for k, v in saved["config"].items() if k not in ("max_steps", "resume")}
    assert {k: after["config"][k] for k in unchanged} == unchanged
    assert after["config"]["clip_grad"] == 2.5 and after["config"]["img_size"] == 64


def test_the_resume_command_det_train_prints_after_sigterm_continues_a_coco_2017_run(coco2017: Path, tmp_path: Path,
                                                                                       capsys, monkeypatch):
    """SIGTERM (what a scheduler sends) stops a run on a COCO-2017 folder after its step; the command it
    prints, run exactly as printed, continues that run with its own settings (not the shapes job's)."""
    run = tmp_path / "run"
    original, steps = DetectionTask.training_loss, []

    def loss_then_sigterm(self, model, batch, device):
        steps.append(1)
        if len(steps) == 1:
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None), "the run handles SIGTERM"
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, model, batch, device)

    monkeypatch.setattr(DetectionTask, "training_loss", loss_then_sigterm)
    assert main(["det", "train", "--data", str(coco2017), "--output", str(run), "--epochs", "2",
                 "--set", "clip_grad=2.5", *TINY]) == 143
    monkeypatch.undo()
    out = capsys.readouterr().out
    assert "SIGTERM received" in out
    printed = [line[len("resume with: "):] for line in out.splitlines() if line.startswith("resume with: ")]
    assert printed == [f"weightformer det train --output {run} --resume auto"]
    saved = torch.load(run / "last.pt", weights_only=True)
    assert saved["global_step"] == 1

    command = shlex.split(printed[0])
    assert command[0] == "weightformer" and main(command[1:]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("recipe resumed:") and f"resumed from {run / 'last.pt'}" in out
    after = torch.load(run / "last.pt", weights_only=True)
    assert after["global_step"] == 4  # 2 epochs of 4 images at batch 2: the run's own
    assert after["meta"] == saved["meta"] and after["meta"]["data"] == str(coco2017.resolve())
    assert {k: v for k, v in after["config"].items() if k != "resume"} == \
        {k: v for k, v in saved["config"].items() if k != "resume"}
    assert _kwargs(after["config"]) == {k: int(v) for k, v in TINY_KWARGS.items()}
    assert after["config"]["clip_grad"] == 2.5 and after["config"]["img_size"] == 64


# -------------------------------------------------------------------------------------------------
# (b) the Python API resolves what the command line does
# -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["shapes", "coco2017"])
def test_prepare_config_equals_what_det_train_flags_parse_to(layout: str, coco2017: Path, tmp_path: Path):
    data = {} if layout == "shapes" else {"data": str(coco2017), "val_split": "val2017"}
    data_flags = [] if layout == "shapes" else ["--data", str(coco2017), "--val-split", "val2017"]
    argv = ["train", *data_flags, "--output", str(tmp_path / "run"), "--epochs", "3", "--cascade", "--det-resize",
            "shortest_edge", "--det-max-size", "200", "--model-kwargs", "depth=2", "--set", "clip_grad=1.0",
            "--visualize", "2"]
    args = build_parser(DetectionTask).parse_args(argv)
    del args.command
    from_flags = prepare_config(train_overrides(args, DetectionTask), task=DetectionTask)
    settings = {**data, "output": str(tmp_path / "run"), "epochs": 3, "cascade": True, "det_resize": "shortest_edge",
                "det_max_size": 200, "model_kwargs": {"depth": 2}, "clip_grad": 1.0}
    from_python = prepare_config(settings, task=DetectionTask)
    assert isinstance(from_python.cfg, DetectionConfig)
    assert from_python.cfg == from_flags.cfg and from_python.recipe == from_flags.recipe
    recipe = from_python.recipe.recipe
    assert recipe.name == ("offline" if layout == "shapes" else "small-data")
    assert from_python.cfg.model_kwargs == {**recipe.values["model_kwargs"], "depth": 2}
    assert from_python.cfg.data == ("shapes" if layout == "shapes" else str(coco2017))
    assert (from_python.cfg.epochs, from_python.cfg.batch_size, from_python.cfg.lr) == (3, 4, 0.08)


# -------------------------------------------------------------------------------------------------
# (c) the recipe a folder gets, and why
# -------------------------------------------------------------------------------------------------
def test_a_small_folder_without_init_learns_from_scratch_at_its_images_size(coco2017: Path):
    choice = DetectionTask.choose_recipe(str(coco2017), {})
    assert choice.recipe.name == "small-data"
    assert "holds 4 training images" in choice.reason and "no --init" in choice.reason
    side = choice.recipe.values["img_size"]
    assert side in (96, 128) and f"img_size {side}" in choice.reason  # the shapes images are 96 to 128 px
    offline = recipes.recipe("shapes.yaml").values  # the model that learns
    assert {k: choice.recipe.values[k] for k in ("model_kwargs", "detector_kwargs")} == \
        {k: offline[k] for k in ("model_kwargs", "detector_kwargs")}
    assert choice.line().startswith("recipe small-data: ")


def test_init_and_many_images_get_vitdets_recipe(coco2017: Path, monkeypatch):
    monkeypatch.setattr(recipes, "count_files", lambda folder, extensions: 118_287)  # COCO train2017's size
    choice = DetectionTask.choose_recipe(str(coco2017), {"init": "backbone.pth"})
    assert choice.recipe.path.name == recipes.COCO
    assert "118287 training images" in choice.reason and "--init" in choice.reason
    cfg = prepare_config({"data": str(coco2017), "init": "backbone.pth"}, task=DetectionTask).cfg
    assert (cfg.img_size, cfg.epochs, cfg.lr, cfg.layer_decay, cfg.decay_milestones) == (1024, 100, 8e-4, 0.777,
                                                                                          (88.9, 96.3))
    assert (cfg.cascade, cfg.amp, cfg.det_protocol) == (True, "fp16", "vitdet")  # ViTDet's Cascade, with AMP
    # as many images without --init: a from-scratch backbone gets the recipe that learns from scratch
    assert DetectionTask.choose_recipe(str(coco2017), {}).recipe.name == "small-data"


def test_init_on_a_small_folder_fine_tunes_the_init_backbone_as_it_is(coco2017: Path):
    choice = DetectionTask.choose_recipe(str(coco2017), {"init": "backbone.pth"})
    assert choice.recipe.name == "fine-tune"
    assert "holds 4 training images, fewer than the 10000" in choice.reason and "--init" in choice.reason
    cfg = prepare_config({"data": str(coco2017), "init": "backbone.pth"}, task=DetectionTask).cfg
    assert cfg.model_kwargs == {"drop_path_rate": 0.1}  # no embed_dim or depth: the --init weights must fit


def test_image_side_is_the_median_long_side_on_the_pyramids_grid(tmp_path: Path):
    for index, size in enumerate([(640, 480), (500, 375), (640, 427), (12, 12)]):
        Image.fromarray(np.zeros((size[1], size[0], 3), np.uint8)).save(tmp_path / f"{index}.jpg")
    (tmp_path / "notes.txt").write_text("not an image")
    assert recipes.image_side(tmp_path) == 576  # median of 640, 500, 640, 12 = 570 -> 576
    assert recipes.image_side(tmp_path, sample=1) == 640
    big = tmp_path / "big"
    big.mkdir()
    Image.fromarray(np.zeros((8, 4000, 3), np.uint8)).save(big / "wide.png")
    assert recipes.image_side(big) == recipes.SIDE_RANGE[1]
    assert recipes.image_side(tmp_path / "none") is None


# -------------------------------------------------------------------------------------------------
# (d) the layouts read, and the one line for a folder that fits none
# -------------------------------------------------------------------------------------------------
def test_coco_2017_as_downloaded_is_read(coco2017: Path):
    train, val = find_split(coco2017, "train"), find_split(coco2017, "val")
    assert (train.name, train.image_dir) == ("train2017", coco2017 / "train2017")
    assert (val.name, val.image_dir) == ("val2017", coco2017 / "images" / "val2017")
    task = DetectionTask(DetectionConfig(data=str(coco2017), img_size=64, workers=0))
    data = task.build_data(init_distributed("cpu"))
    assert (len(data.train_set), len(data.val_set)) == (4, 2)
    assert "4 train (train2017) / 2 val (val2017)" in data.description
    image, target = data.train_set[0]
    assert image.shape == (3, 64, 64) and target["boxes"].shape[1] == 4


def test_todays_layout_and_any_split_names_through_flags(tmp_path: Path, capsys):
    today = synthetic.write_shapes(tmp_path / "today", seed=2, split_sizes={"train": 2, "val": 1})
    assert [find_split(today, role).name for role in ("train", "val")] == ["train", "val"]
    named = synthetic.write_shapes(tmp_path / "named", seed=2, split_sizes={"fold_a": 4, "fold_b": 2, "val": 1})
    run = tmp_path / "run"
    assert main(["det", "train", "--data", str(named), "--train-split", "fold_a", "--val-split", "fold_b",
                 "--output", str(run), "--epochs", "1", *TINY]) == 0
    assert "4 train (fold_a) / 2 val (fold_b)" in capsys.readouterr().out
    # eval takes the run's own validation split, not the folder's "val"
    assert main(["det", "eval", "--checkpoint", str(run / "best.pt"), "--device", "cpu", "--workers", "0"]) == 0
    assert "(2 images of fold_b)" in capsys.readouterr().out
    assert main(["det", "eval", "--checkpoint", str(run / "best.pt"), "--device", "cpu", "--workers", "0",
                 "--split", "val"]) == 0
    assert "(1 images of val)" in capsys.readouterr().out


def test_a_folder_of_no_layout_is_one_line_listing_what_was_looked_for(tmp_path: Path, capsys):
    folder = tmp_path / "photos"
    (folder / "images" / "training").mkdir(parents=True)
    assert main(["det", "train", "--data", str(folder), "--output", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "no COCO training split" in err[0]
    for looked_for in ("images/train2017/ or train2017/ with annotations/instances_train2017.json",
                       "images/train/ or train/ with annotations/instances_train.json", "--train-split NAME"):
        assert looked_for in err[0]
    assert main(["det", "train", "--data", str(folder), "--train-split", "training", "--output",
                 str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "annotations/instances_training.json" in err[0] and "drop --train-split" in err[0]
    with pytest.raises(DataError, match="data folder .*missing does not exist"):
        find_split(tmp_path / "missing", "val")


def test_a_split_name_must_not_be_a_path(capsys, tmp_path: Path):
    assert main(["det", "train", "--val-split", "../val", "--output", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "val_split must be a split name" in err[0]


def test_a_missing_validation_split_is_one_line(tmp_path: Path, coco2017: Path, capsys):
    broken = tmp_path / "broken"
    shutil.copytree(coco2017, broken)
    (broken / "annotations" / "instances_val2017.json").unlink()
    assert main(["det", "train", "--data", str(broken), "--output", str(tmp_path / "run"), *TINY]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no COCO validation split" in err[0] and "--val-split NAME" in err[0]
