"""Detection in the shared loop: exact resume with seeded large-scale jitter, layer-decay groups, the
offline shapes set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest_train import assert_same_weights, weights
from weightformer.detection import DetectionTask, SeededJitterDataset, synthetic
from weightformer.detection.config import split_model_kwargs
from weightformer.detection.config import DetectionConfig
from weightformer.engine import train
from weightformer.engine.distributed import init_distributed
from weightformer.engine.metrics import read_metrics

TINY_DETECTOR = {"embed_dim": 32, "depth": 2, "drop_path_rate": 0.1, "conv_dim": 16, "fc_dim": 32,
                 "rpn_pre_nms_top_n_train": 100, "rpn_post_nms_top_n_train": 32, "rpn_pre_nms_top_n_test": 50,
                 "rpn_post_nms_top_n_test": 16, "box_batch_size_per_image": 16}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 8 of the 9 training images hold objects: training leaves the other out
    return synthetic.write_shapes(tmp_path_factory.mktemp("shapes") / "data", seed=3, split_sizes={"train": 9, "val": 3})


def _config(data: Path, output: Path, **overrides) -> dict:
    config = dict(data=str(data), output=str(output), model="weightformer_tiny", model_kwargs=dict(TINY_DETECTOR),
                  img_size=64, batch_size=2, epochs=2, warmup_epochs=1, lr=0.02, workers=0, device="cpu",
                  deterministic=True, ema=True, ema_decay=0.9, log_interval=1000, hflip=0.5)
    config.update(overrides)
    return config


@pytest.mark.parametrize("cascade", [False, True])
def test_max_steps_then_resume_matches_uninterrupted(shapes: Path, tmp_path: Path, cascade: bool):
    """Stopped mid-epoch at 3 of 8 steps and resumed: the same weights, EMA, optimizer state and metrics
    as one run (jitter, flips, drop path, proposal sampling and data order all come back)."""
    whole = tmp_path / "whole"
    assert train(_config(shapes, whole, cascade=cascade), task=DetectionTask).global_step == 8
    parts = tmp_path / "parts"
    assert train(_config(shapes, parts, cascade=cascade, max_steps=3), task=DetectionTask).global_step == 3
    assert train({"output": str(parts), "resume": "auto"}, task=DetectionTask).global_step == 8
    for key in ("model", "ema"):
        assert_same_weights(weights(parts / "last.pt", key), weights(whole / "last.pt", key))
    a = torch.load(parts / "last.pt", weights_only=True)["optimizer"]["state"]
    b = torch.load(whole / "last.pt", weights_only=True)["optimizer"]["state"]
    assert all(torch.equal(a[i]["exp_avg_sq"], b[i]["exp_avg_sq"]) for i in b)
    strip = lambda rs: [{k: v for k, v in r.items() if k != "img_per_s"} for r in rs]  # noqa: E731
    assert strip(read_metrics(parts / "metrics.jsonl")) == strip(read_metrics(whole / "metrics.jsonl"))


def test_jitter_depends_on_seed_epoch_and_index_only(shapes: Path):
    task = DetectionTask(DetectionConfig(**_config(shapes, shapes.parent / "unused")))
    data = task.build_data(init_distributed("cpu"))
    train_set = data.train_set
    assert isinstance(train_set, SeededJitterDataset)
    first = train_set[1]
    train_set[0]  # drawing another sample in between changes nothing
    again = train_set[1]
    assert torch.equal(first[0], again[0]) and torch.equal(first[1]["boxes"], again[1]["boxes"])
    assert first[0].shape == (3, 64, 64)
    train_set.set_epoch(1)
    assert not torch.equal(train_set[1][0], first[0])


def test_layer_decay_groups_cover_the_detector(shapes: Path):
    task = DetectionTask(DetectionConfig(**_config(shapes, shapes.parent / "unused", layer_decay=0.5)))
    data = task.build_data(init_distributed("cpu"))
    model, meta = task.build_model(data, torch.device("cpu"))
    groups = task.param_groups(model)
    ids = [id(p) for g in groups for p in g["params"]]
    assert len(ids) == len(set(ids)) == sum(1 for p in model.parameters() if p.requires_grad)
    assert sorted({g["lr_scale"] for g in groups}) == [0.5**3, 0.5**2, 0.5, 1.0]  # stem, 2 blocks, neck and heads
    assert json.loads(json.dumps(meta)) == meta  # plain values only


def test_model_kwargs_split_between_backbone_and_detector():
    backbone, detector = split_model_kwargs(TINY_DETECTOR)
    assert backbone == {"embed_dim": 32, "depth": 2, "drop_path_rate": 0.1}
    assert set(detector) == set(TINY_DETECTOR) - set(backbone)


def test_shapes_are_deterministic_with_negatives_and_both_mask_formats(tmp_path: Path):
    a = synthetic.write_shapes(tmp_path / "a", seed=5, split_sizes={"train": 30})
    b = synthetic.write_shapes(tmp_path / "b", seed=5, split_sizes={"train": 30})
    content = json.loads((a / "annotations" / "instances_train.json").read_text())
    assert content == json.loads((b / "annotations" / "instances_train.json").read_text())
    assert [(a / "images" / "train" / i["file_name"]).read_bytes() for i in content["images"]] == \
        [(b / "images" / "train" / i["file_name"]).read_bytes() for i in content["images"]]
    annotated = {ann["image_id"] for ann in content["annotations"]}
    assert len(annotated) < len(content["images"])  # negatives
    kinds = {type(ann["segmentation"]).__name__ for ann in content["annotations"]}
    assert kinds == {"list", "dict"}  # polygons and RLE
    assert all(96 <= i["width"] <= 128 and 96 <= i["height"] <= 128 for i in content["images"])
