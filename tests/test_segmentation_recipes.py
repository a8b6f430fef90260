"""Segmentation's recipes: which one a run's data gets and why (said on the run's first line), and the
Python API resolving exactly what ``seg train``'s flags do."""

from __future__ import annotations

from pathlib import Path

import pytest

from weightformer.cli import main
from weightformer.engine import prepare_config
from weightformer.engine.cli import build_parser, train_overrides
from weightformer.engine.errors import ConfigError
from weightformer.segmentation import SegmentationConfig, SegmentationTask
from weightformer.segmentation import recipes
from weightformer.segmentation.synthetic import write_shapes
from weightformer.segmentation.task import build_segmenter

TINY = ["--model-kwargs", "embed_dim=32", "depth=2", "channels=16", "pyramid_channels=16", "aux_channels=8",
        "--img-size", "32", "--batch-size", "4", "--workers", "0", "--device", "cpu", "--max-steps", "1"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's small folder in the ADE20K layout: 12 training images of 64 to 96 px."""
    return write_shapes(tmp_path_factory.mktemp("mine"), train=12, val=2)


def _fake_count(monkeypatch: pytest.MonkeyPatch, images: int) -> None:
    monkeypatch.setattr(recipes, "count_files", lambda folder, extensions: images)


def test_a_small_folder_without_init_gets_the_small_data_recipe_and_the_run_says_why(folder: Path, tmp_path: Path,
                                                                                      capsys):
    assert main(["seg", "train", "--data", str(folder), "--output", str(tmp_path / "run"), *TINY]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("recipe small-data: the shapes job's recipe on the folder's crops")
    assert (f"chosen because {folder / 'images' / 'training'} holds 12 training images, fewer than the 10000 the "
            f"paper's ADE20K recipe needs; there is no --init, so a small model trains from scratch") in first
    assert "64 px crops, as its images are small (median short side" in first


def test_the_small_data_recipe_can_learn_where_the_old_default_could_not(folder: Path):
    """A folder gets the shapes job's schedule, batch 16, lr 1e-3 at that batch, 50 epochs, not the ImageNet
    classifier's batch 256 and lr 5e-4, which would give it one step an epoch."""
    cfg = prepare_config({"data": str(folder)}, task=SegmentationTask).cfg
    assert (cfg.batch_size, cfg.epochs, cfg.lr * cfg.batch_size / 512) == (16, 50, pytest.approx(1e-3))
    assert cfg.model_kwargs == {"embed_dim": 96, "depth": 4, "channels": 64, "pyramid_channels": 64, "aux_channels": 32}


def test_crops_for_photographs_and_for_small_images(folder: Path, tmp_path: Path):
    from PIL import Image

    photos = write_shapes(tmp_path / "photos", train=2, val=1)
    for path in (photos / "images" / "training").iterdir():
        Image.new("RGB", (640, 480)).save(path)
    cfg = prepare_config({"data": str(photos)}, task=SegmentationTask).cfg
    assert (cfg.img_size, cfg.seg_crop, cfg.seg_stride) == (256, 256, 171)
    cfg = prepare_config({"data": str(folder)}, task=SegmentationTask).cfg
    assert (cfg.img_size, cfg.seg_crop, cfg.seg_stride) == (64, 64, 43)


def test_init_and_a_real_size_folder_get_the_papers_recipe(folder: Path, monkeypatch):
    _fake_count(monkeypatch, 20_210)  # ADE20K's training images
    run = prepare_config({"data": str(folder), "init": "weightformer_s_imagenet.pth"}, task=SegmentationTask)
    assert run.recipe.recipe.path.name == recipes.ADE20K
    assert run.recipe.line().startswith("recipe ade20k-upernet: the paper's ADE20K UperNet recipe")
    assert run.recipe.reason == (f"{folder / 'images' / 'training'} holds 20210 training images (at least 10000) "
                                 f"and --init gives a pretrained backbone")
    cfg = run.cfg
    assert (cfg.model, cfg.img_size, cfg.batch_size, cfg.sched, cfg.seg_inference, cfg.num_classes, cfg.seg_protocol) == \
        ("weightformer_small", 512, 8, "poly", "slide", None, "vim")  # None: the data's own count


@pytest.mark.parametrize("images, init, name, says", [
    (20_210, None, "small-data", "enough for the paper's ADE20K recipe, which fine-tunes a pretrained backbone; "
                                 "there is no --init"),
    (9_999, "w.pth", "fine-tune", "fewer than the 10000 the paper's ADE20K recipe needs; --init gives the weights"),
])
def test_the_papers_recipe_needs_both_init_and_images(folder: Path, monkeypatch, images, init, name, says):
    _fake_count(monkeypatch, images)
    choice = prepare_config({"data": str(folder), "init": init}, task=SegmentationTask).recipe
    assert choice.recipe.name == name and f"holds {images} training images, {says}" in choice.reason


def test_shapes_and_unreadable_folders(tmp_path: Path):
    assert prepare_config({}, task=SegmentationTask).recipe.recipe.path.name == "shapes.yaml"
    choice = prepare_config({"data": str(tmp_path / "nowhere")}, task=SegmentationTask).recipe
    assert choice.recipe.name == "small-data" and "holds no training images in a layout" in choice.reason


@pytest.mark.parametrize("flags, settings", [
    ([], {}),
    (["--data", "FOLDER"], {"data": "FOLDER"}),
    (["--data", "FOLDER", "--inference", "slide", "--crop", "48", "--stride", "32", "--no-reduce-zero-label",
      "--num-classes", "5", "--layer-decay", "0.8", "--model-kwargs", "depth=2", "--set", "weight_decay=0.1"],
     {"data": "FOLDER", "seg_inference": "slide", "seg_crop": 48, "seg_stride": 32, "reduce_zero_label": False,
      "num_classes": 5, "layer_decay": 0.8, "model_kwargs": {"depth": 2}, "weight_decay": 0.1}),
    (["--data", "FOLDER", "--init", "w.pth", "--model", "deit_small_patch16_224", "--config", "CONFIG"],
     {"data": "FOLDER", "init": "w.pth", "model": "deit_small_patch16_224"}),
])
def test_the_python_api_resolves_what_the_flags_do(folder: Path, tmp_path: Path, flags, settings):
    config = tmp_path / "run.yaml"
    config.write_text("epochs: 7\nseg_crop: 40\n")
    flags = [str(folder) if f == "FOLDER" else str(config) if f == "CONFIG" else f for f in flags]
    settings = {k: str(folder) if v == "FOLDER" else v for k, v in settings.items()}
    args = build_parser(SegmentationTask).parse_args(["train", *flags])
    config_file = getattr(args, "config_file", None)
    from_flags = prepare_config(train_overrides(args, SegmentationTask), config_file, task=SegmentationTask)
    from_python = prepare_config(settings, str(config) if config_file else None, task=SegmentationTask)
    assert from_flags.cfg == from_python.cfg and from_flags.recipe == from_python.recipe
    assert isinstance(from_python.cfg, SegmentationConfig)
    if config_file:
        assert (from_python.cfg.epochs, from_python.cfg.seg_crop) == (7, 40)


# --protocol over a recipe of the other protocol: the recipe's head and neck settings are its own protocol's, so
# they are left out and the chosen protocol's apply; a bad value the user gives is named as the user's.

def _segmenter(cfg: SegmentationConfig):
    return build_segmenter({"model": cfg.model, "num_classes": 4, "model_kwargs": cfg.model_kwargs,
                            "protocol": cfg.seg_protocol})


def test_protocol_vim_over_the_offline_recipe_is_the_documented_vim_model():
    """``seg train --protocol vim``, docs/dense.md's 80.0 mIoU run: the head as wide as the 96-d backbone, 1.65M
    parameters; the run's first line says which of the recipe's settings were left out."""
    prepared = prepare_config({"seg_protocol": "vim"}, task=SegmentationTask)
    assert prepared.cfg.model_kwargs == {"embed_dim": 96, "depth": 4, "aux_channels": 32}
    assert ("under --protocol vim its simple-pyramid head and neck settings (channels=64, pyramid_channels=64) are "
            "left out") in prepared.recipe.line()
    model = _segmenter(prepared.cfg)
    assert model.head.classifier.in_channels == 96
    assert round(sum(p.numel() for p in model.parameters()) / 1e6, 2) == 1.65


def test_seg_train_protocol_vim_runs_out_of_the_box(folder: Path, tmp_path: Path):
    args = ["--img-size", "32", "--batch-size", "4", "--workers", "0", "--device", "cpu", "--max-steps", "1",
            "--model-kwargs", "embed_dim=32"]
    assert main(["seg", "train", "--data", str(folder), "--protocol", "vim", "--output", str(tmp_path / "r"), *args]) == 0


@pytest.mark.parametrize("kwargs, says", [
    ({"pyramid_channels": 32}, "pyramid_channels=32 is the simple-pyramid protocol's width"),
    ({"out_indices": [0, 1, 2]}, "out_indices must be 4 increasing block indices ending with the last block, 3"),
])
def test_a_bad_head_or_neck_value_is_named_as_the_users(kwargs, says):
    cfg = prepare_config({"seg_protocol": "vim", "model_kwargs": kwargs}, task=SegmentationTask).cfg
    with pytest.raises(ConfigError) as caught:
        _segmenter(cfg)
    message = str(caught.value)
    assert says in message and "check --model-kwargs or the --config file's model_kwargs" in message
    assert "recipe" not in message  # the value is the user's: the recipe sets none under this protocol
