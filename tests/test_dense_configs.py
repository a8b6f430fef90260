"""The full-size dense recipes: the shipped configs validate and say what they claim, the schedules they
name reach the optimizer, and the 1x schedule's resizing reaches the detector."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from weightformer.detection import synthetic as det_synthetic
from weightformer.detection.config import DetectionConfig
from weightformer.detection.transforms import RandomFlip
from weightformer.detection.task import DetectionTask
from weightformer.engine.config import TrainConfig, load_config_file, validate_config
from weightformer.engine.distributed import DistInfo
from weightformer.engine.loop import build_data, build_training
from weightformer.segmentation.config import SegmentationConfig

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
CPU = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), owns_process_group=False)
TINY = {"embed_dim": 32, "depth": 2, "conv_dim": 32, "fc_dim": 64, "rpn_pre_nms_top_n_train": 50,
        "rpn_post_nms_top_n_train": 16, "rpn_pre_nms_top_n_test": 20, "rpn_post_nms_top_n_test": 8,
        "box_batch_size_per_image": 8}

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("name, expected", [
    ("coco_cascade_maskrcnn_weightformer_t_lsj_100ep.yaml",
     dict(cascade=True, img_size=1024, det_resize="lsj", epochs=100, sched="multistep", decay_milestones=(88.9, 96.3))),
    ("coco_maskrcnn_weightformer_t_1x.yaml",
     dict(cascade=False, img_size=800, det_resize="shortest_edge", det_max_size=1333, epochs=12,
          decay_milestones=(8.0, 11.0))),
])
def test_shipped_detection_configs_validate(name: str, expected: dict):
    cfg = validate_config(DetectionConfig(**load_config_file(CONFIGS / "detection" / name, DetectionConfig)))
    assert {k: getattr(cfg, k) for k in expected} == expected


def test_shipped_segmentation_config_validates():
    values = load_config_file(CONFIGS / "segmentation" / "ade20k_upernet_weightformer_s_160k.yaml", SegmentationConfig)
    cfg = validate_config(SegmentationConfig(**values))
    expected = dict(model="weightformer_small", num_classes=150, img_size=512, sched="poly", decay_rate=1.0,
                    seg_inference="slide", seg_crop=512, seg_stride=341)
    assert {k: getattr(cfg, k) for k in expected} == expected


def test_effective_learning_rates_are_the_recipes():
    """Per 512 images in the files; at the recipes' total batches, the values the papers give."""
    for name, gpus, lr in (("detection/coco_cascade_maskrcnn_weightformer_t_lsj_100ep.yaml", 8, 1e-4),
                           ("detection/coco_maskrcnn_weightformer_t_1x.yaml", 8, 1e-4),
                           ("segmentation/ade20k_upernet_weightformer_s_160k.yaml", 8, 6e-5)):
        values = load_config_file(CONFIGS / name)
        assert values["lr"] * values["batch_size"] * gpus / 512 == pytest.approx(lr)


def _training(tmp_path: Path, **overrides):
    # seed 6: all 8 training images hold objects (training leaves out images without any)
    data = det_synthetic.write_shapes(tmp_path / "shapes", seed=6, split_sizes={"train": 8, "val": 2})
    values = dict(data=str(data), model="weightformer_tiny", model_kwargs=dict(TINY), img_size=64, batch_size=2,
                  warmup_epochs=0,
                  workers=0, device="cpu", lr=5.12, min_lr=0.0)
    values.update(overrides)
    cfg = validate_config(DetectionConfig(**values))
    task = DetectionTask(cfg)
    loaded = build_data(cfg, task, CPU)
    return task, loaded, build_training(cfg, task, loaded, CPU)


def _lr_at(training, step: int) -> float:
    training.scheduler.step_update(num_updates=step)
    return training.optimizer.param_groups[0]["lr"]


def test_multistep_schedule_reaches_the_optimizer(tmp_path: Path):
    """4 steps an epoch (8 images, batch 2), lr 5.12 per 512 = 0.02: x0.1 at epoch 2.5 (step 10) and x0.01 at
    epoch 3 (step 12). timm's MultiStepLRScheduler decays one update early (it looks up t + 1)."""
    _, loaded, training = _training(tmp_path, epochs=4, sched="multistep", decay_milestones=[2.5, 3], decay_rate=0.1)
    assert loaded.steps_per_epoch == 4
    assert [_lr_at(training, s) for s in (0, 8, 9, 10, 11, 15)] == pytest.approx([0.02, 0.02, 2e-3, 2e-3, 2e-4, 2e-4])


def test_poly_schedule_with_fractional_warmup(tmp_path: Path):
    """Power 1: a straight line from 0.02 to 0 over 16 steps, after a warm-up of half an epoch (2 steps)."""
    _, _, training = _training(tmp_path, epochs=4, sched="poly", decay_rate=1.0, warmup_epochs=0.5, warmup_lr=0.0)
    assert _lr_at(training, 1) == pytest.approx(0.01)  # half way up the warm-up
    assert _lr_at(training, 8) == pytest.approx(0.02 * (1 - 8 / 16))
    assert _lr_at(training, 12) == pytest.approx(0.02 * (1 - 12 / 16))


def test_shortest_edge_resizing_reaches_the_detector_and_the_data(tmp_path: Path):
    task, loaded, training = _training(tmp_path, epochs=1, det_resize="shortest_edge", det_max_size=96)
    transform = training.model.transform
    assert transform.min_size == (64,) and transform.max_size == 96
    assert isinstance(loaded.task_data.train_set.transform, RandomFlip)
    image, target = loaded.task_data.train_set[0]  # not cropped: the image keeps its own size
    base_image, _ = loaded.task_data.train_set.base[0]
    assert image.shape == base_image.shape and not math.isnan(float(image.sum()))
    assert training.meta["max_size"] == 96
