"""SegmentationTask in the shared loop's terms, and the built-in shapes data set."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from weightformer.checkpoint import CheckpointError
from weightformer.engine import ConfigError, TrainConfig, validate_config
from weightformer.engine.distributed import DistInfo
from weightformer.segmentation import synthetic
from weightformer.segmentation.synthetic import SHAPES_CLASSES, shapes_root, write_shapes
from weightformer.segmentation.task import SegmentationTask

TINY_KWARGS = {"embed_dim": 32, "depth": 2, "channels": 16, "pyramid_channels": 16, "aux_channels": 8}
CPU = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), owns_process_group=False)


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_shapes(tmp_path_factory.mktemp("shapes"), train=8, val=3)


def _task(data: Path | str, **overrides) -> SegmentationTask:
    values = {"data": str(data), "model_kwargs": dict(TINY_KWARGS), "img_size": 32, "num_classes": 4, "seg_crop": 32,
              "seg_stride": 16, **overrides}
    return SegmentationTask(validate_config(TrainConfig(**values)))


def test_shapes_set_is_deterministic_ade_layout(tmp_path: Path):
    a, b = write_shapes(tmp_path / "a", train=3, val=2), write_shapes(tmp_path / "b", train=3, val=2, seed=0)
    for split, count in (("training", 3), ("validation", 2)):
        names = sorted(p.name for p in (a / "annotations" / split).iterdir())
        assert len(names) == count
        for name in names:
            label = np.asarray(Image.open(a / "annotations" / split / name))
            assert np.array_equal(label, np.asarray(Image.open(b / "annotations" / split / name)))
            assert set(np.unique(label)) <= {0, 1, 2, 3, 4} and 1 in label  # 0 unlabelled, 1 background
            image = Image.open(a / "images" / split / name.replace(".png", ".jpg"))
            assert image.size == label.shape[::-1] and 64 <= min(image.size) <= max(image.size) <= 96
    c = write_shapes(tmp_path / "c", train=1, val=0, seed=1)
    first = "annotations/training/shapes_00000.png"
    assert not np.array_equal(np.asarray(Image.open(a / first)), np.asarray(Image.open(c / first)))


def test_shapes_root_writes_once_into_the_cache(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    root = shapes_root()
    assert root == tmp_path / "weightformer" / synthetic.VERSION
    assert len(list((root / "images" / "training").iterdir())) == synthetic.TRAIN_IMAGES == 200
    assert len(list((root / "annotations" / "validation").iterdir())) == synthetic.VAL_IMAGES == 50
    assert [p.name for p in root.parent.iterdir()] == [root.name]  # no staging folder left behind
    stamp = (root / "annotations" / "validation" / "shapes_00001.png").stat().st_mtime_ns
    assert shapes_root() == root
    assert (root / "annotations" / "validation" / "shapes_00001.png").stat().st_mtime_ns == stamp


def test_killed_write_leaves_no_data_set(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))

    def dies(root, *args, **kwargs):
        (Path(root) / "images").mkdir()
        raise KeyboardInterrupt

    monkeypatch.setattr(synthetic, "write_shapes", dies)
    with pytest.raises(KeyboardInterrupt):
        shapes_root()
    assert list((tmp_path / "weightformer").iterdir()) == []


def test_build_data_and_seeded_augmentation(shapes: Path):
    task = _task(shapes)
    data = task.build_data(CPU)
    assert (len(data.train_set), len(data.val_set)) == (8, 3)
    image, label = data.train_set[0]
    assert image.shape == (3, 32, 32) and label.shape == (32, 32)  # --img-size is the training crop
    again, _ = data.train_set[0]
    assert torch.equal(image, again)  # seeded by (seed, epoch, index), not by a global generator
    data.train_set.set_epoch(1)
    assert not torch.equal(image, data.train_set[0][0])
    val_image, val_label = data.val_set[0]
    assert min(val_image.shape[-2:]) == 32  # short side resized to the crop; the label keeps its size
    assert min(val_label.shape) >= 64
    assert "8 train / 3 val images, 4 classes" in data.description


def test_model_meta_loss_and_evaluation(shapes: Path):
    task = _task(shapes)
    data = task.build_data(CPU)
    model, meta = task.build_model(data, torch.device("cpu"))
    assert meta["task"] == "segmentation" and meta["model"] == "weightformer_tiny"
    assert meta["model_kwargs"] == TINY_KWARGS and meta["num_classes"] == 4
    json.dumps(meta)  # plain values only
    batch = next(iter(DataLoader(data.train_set, batch_size=4, collate_fn=data.collate_fn)))
    loss, n = task.training_loss(model, batch, torch.device("cpu"))
    assert n == 4 and loss.ndim == 0 and math.isfinite(loss.item())
    loss.backward()
    loader = DataLoader(data.val_set, batch_size=2, collate_fn=data.collate_fn)
    metrics = task.evaluate(model, loader, torch.device("cpu"), "none", CPU)
    assert set(metrics) == {"mIoU", "mAcc", "aAcc", "images"} and metrics["images"] == 3
    json.dumps(metrics, allow_nan=False)
    assert "mIoU" in task.summary(metrics) and task.format_score(metrics["mIoU"]).startswith("mIoU")

    slide = _task(shapes, seg_inference="slide").evaluate(model, loader, torch.device("cpu"), "none", CPU)
    assert 0 <= slide["mIoU"] <= 100


def test_layer_decay_groups(shapes: Path):
    task = _task(shapes, layer_decay=0.5)
    model, _ = task.build_model(task.build_data(CPU), torch.device("cpu"))
    groups = task.param_groups(model)
    assert sorted({g["lr_scale"] for g in groups}) == [0.125, 0.25, 0.5, 1.0]  # stem, block 0, block 1, heads
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    assert _task(shapes).param_groups(model) is None


def test_checkpoint_checks(shapes: Path):
    task = _task(shapes)
    task.check_checkpoint({"task": "segmentation", "num_classes": 4}, "last.pt")
    with pytest.raises(CheckpointError, match="5 classes"):
        task.check_checkpoint({"task": "segmentation", "num_classes": 5, "data": "x"}, "last.pt")
    with pytest.raises(CheckpointError, match="classification checkpoint"):
        task.check_checkpoint({"task": "classification", "num_classes": 4}, "last.pt")


def test_defaults_and_settings():
    assert SegmentationTask(validate_config(TrainConfig(data="shapes"))).num_classes == len(SHAPES_CLASSES)
    assert SegmentationTask(validate_config(TrainConfig(data="/some/ade"))).num_classes == 150
    with pytest.raises(ConfigError, match="stride 64 is larger than the crop 32"):
        SegmentationTask(validate_config(TrainConfig(seg_inference="slide", seg_crop=32, seg_stride=64)))


def test_unknown_head_argument_is_a_config_error(shapes: Path):
    task = _task(shapes, model_kwargs={**TINY_KWARGS, "chanels": 8})
    with pytest.raises(ConfigError, match="chanels"):
        task.build_model(task.build_data(CPU), torch.device("cpu"))
