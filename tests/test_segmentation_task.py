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
from weightformer.engine import ConfigError, validate_config
from weightformer.engine.distributed import DistInfo
from weightformer.segmentation import SegmentationConfig, synthetic
from weightformer.segmentation.synthetic import shapes_root, write_shapes
from weightformer.segmentation.task import SegmentationTask

TINY_KWARGS = {"embed_dim": 32, "depth": 2, "channels": 16, "pyramid_channels": 16, "aux_channels": 8}
CPU = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), owns_process_group=False)


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_shapes(tmp_path_factory.mktemp("shapes"), train=8, val=3)


def _task(data: Path | str, **overrides) -> SegmentationTask:
    values = {"data": str(data), "model_kwargs": dict(TINY_KWARGS), "img_size": 32, "num_classes": 4, "seg_crop": 32,
              "seg_stride": 16, **overrides}
    return SegmentationTask(validate_config(SegmentationConfig(**values)))


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
    assert "mIoU" in task.cli.summary(metrics) and task.cli.format_score(metrics["mIoU"]).startswith("mIoU")

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
    _, meta = task.build_model(task.build_data(CPU), torch.device("cpu"))
    task.check_checkpoint({"task": "segmentation", "num_classes": 4}, meta, "last.pt")
    with pytest.raises(CheckpointError, match="5 classes"):
        task.check_checkpoint({"task": "segmentation", "num_classes": 5, "data": "x"}, meta, "last.pt")


def test_classes_are_the_datas_when_not_given(shapes: Path, tmp_path: Path, monkeypatch):
    task = SegmentationTask(validate_config(SegmentationConfig(data=str(shapes), img_size=32)))
    data = task.build_data(CPU)
    assert data.meta["num_classes"] == 4
    assert "4 classes (the largest label in its 11 annotations; reduce-zero-label)" in data.description
    given = SegmentationTask(validate_config(SegmentationConfig(data=str(shapes), num_classes=7, img_size=32)))
    assert given.build_data(CPU).meta["num_classes"] == 7
    without = SegmentationTask(validate_config(SegmentationConfig(data=str(shapes), reduce_zero_label=False)))
    assert without.build_data(CPU).meta["num_classes"] == 5  # values 0..4, each a class

    ade = write_shapes(tmp_path / "ADEChallengeData2016", train=2, val=1)
    rows = ["Idx\tRatio\tTrain\tVal\tName", "1\t0.5\t2\t1\twall", "2\t0.1\t2\t1\tbuilding;edifice",
            "3\t0.1\t2\t1\tsky", "4\t0.1\t2\t1\tfloor, flooring", "5\t0.1\t2\t1\ttree"]
    (ade / "objectInfo150.txt").write_text("\n".join(rows) + "\n")
    task = SegmentationTask(validate_config(SegmentationConfig(data=str(tmp_path), img_size=32)))
    data = task.build_data(CPU)  # --data is the folder the zip was unpacked in
    assert data.meta["num_classes"] == 5 and "5 classes (objectInfo150.txt; reduce-zero-label)" in data.description
    assert data.meta["classes"] == ["wall", "building", "sky", "floor", "tree"]
    zero = SegmentationTask(validate_config(SegmentationConfig(data=str(tmp_path), reduce_zero_label=False)))
    assert zero.build_data(CPU).meta == {"num_classes": 6,
                                         "classes": ["other", "wall", "building", "sky", "floor", "tree"]}

    monkeypatch.setattr("weightformer.segmentation.data.SCAN_LIMIT", 10)  # 11 annotations: too many to read
    task = SegmentationTask(validate_config(SegmentationConfig(data=str(shapes), img_size=32)))
    assert "150 classes (ADE20K's: 11 annotations are too many" in task.build_data(CPU).description


def test_settings_rules():
    assert SegmentationConfig().data == "shapes"
    with pytest.raises(ConfigError, match="stride 64 is larger than the crop 32"):
        validate_config(SegmentationConfig(seg_inference="slide", seg_crop=32, seg_stride=64))
    validate_config(SegmentationConfig(seg_inference="whole", seg_crop=32, seg_stride=64))  # no windows: no rule
    with pytest.raises(ConfigError, match="num_classes must be in \\[1, 255\\]"):
        validate_config(SegmentationConfig(num_classes=300))
    with pytest.raises(ConfigError, match="seg_inference must be whole or slide"):
        validate_config(SegmentationConfig(seg_inference="tiles"))
    with pytest.raises(ConfigError, match="not a timm model; did you mean weightformer_tiny"):
        validate_config(SegmentationConfig(model="weightformer_tinny"))


def test_unknown_head_argument_is_a_config_error(shapes: Path):
    task = _task(shapes, model_kwargs={**TINY_KWARGS, "chanels": 8})
    with pytest.raises(ConfigError, match="chanels"):
        task.build_model(task.build_data(CPU), torch.device("cpu"))
