"""``--init`` for the dense tasks: a classifier's checkpoint (ours, or a bare timm state dict) fills only
the backbone; a checkpoint of the same task fills the whole model; a backbone of another kind is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import save_file

from weightformer.checkpoint import CheckpointError
from weightformer.detection import synthetic as det_synthetic
from weightformer.detection.task import BACKBONE_PATH as DET_BACKBONE, DetectionTask
from weightformer.engine import train
from weightformer.engine.config import TrainConfig, validate_config
from weightformer.engine.distributed import DistInfo
from weightformer.engine.weights import read_checkpoint
from weightformer.segmentation.config import SegmentationConfig
from weightformer.segmentation.synthetic import write_shapes as write_seg_shapes
from weightformer.segmentation.task import BACKBONE_PATH as SEG_BACKBONE, SegmentationTask

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), owns_process_group=False)

BACKBONE = {"embed_dim": 32, "depth": 2}
SEG_KWARGS = {**BACKBONE, "channels": 16, "pyramid_channels": 16, "aux_channels": 8}
DET_KWARGS = {**BACKBONE, "conv_dim": 32, "fc_dim": 64, "rpn_pre_nms_top_n_train": 50, "rpn_post_nms_top_n_train": 16,
              "rpn_pre_nms_top_n_test": 20, "rpn_post_nms_top_n_test": 8, "box_batch_size_per_image": 8}


@pytest.fixture(scope="module")
def classifier_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    """A 10-class WeightFormer's weights as a bare safetensors file, as timm or the Hub would hold them."""
    torch.manual_seed(5)
    model = timm.create_model("weightformer_tiny", num_classes=10, **BACKBONE)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    path = tmp_path_factory.mktemp("ckpt") / "classifier.safetensors"
    save_file(state, str(path))
    return path, state


def _backbone_matches(model: torch.nn.Module, path: str, state: dict[str, torch.Tensor], atol: float = 0.0) -> bool:
    backbone = model.get_submodule(path).state_dict()
    return all(torch.allclose(backbone[k], state[k], rtol=0, atol=atol) for k in backbone)


def _seg_task(tmp_path: Path, **overrides) -> SegmentationTask:
    data = write_seg_shapes(tmp_path / "seg", train=2, val=1)
    values = {"data": str(data), "model_kwargs": dict(SEG_KWARGS), "img_size": 32, "num_classes": 4, **overrides}
    return SegmentationTask(validate_config(SegmentationConfig(**values)))


def test_segmentation_takes_only_the_backbone_of_a_classifier(tmp_path: Path, classifier_file):
    path, state = classifier_file
    task = _seg_task(tmp_path)
    model, meta = task.build_model(task.build_data(CPU), torch.device("cpu"))
    head_before = {k: v.clone() for k, v in model.state_dict().items() if not k.startswith(SEG_BACKBONE)}
    assert not _backbone_matches(model, SEG_BACKBONE, state)
    message = task.init_weights(model, meta, read_checkpoint(path), f"--init {path}")
    assert "only its backbone (weightformer_tiny)" in message
    assert _backbone_matches(model, SEG_BACKBONE, state)
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in head_before.items())  # neck and heads untouched


def test_another_backbone_is_refused_by_name(tmp_path: Path, classifier_file):
    path, state = classifier_file
    ours = {"meta": {"task": "classification", "model": "deit_tiny_patch16_224"}, "model": state}
    task = _seg_task(tmp_path)
    model, meta = task.build_model(task.build_data(CPU), torch.device("cpu"))
    with pytest.raises(CheckpointError, match="holds a deit_tiny_patch16_224.*pass --model deit_tiny_patch16_224"):
        task.init_weights(model, meta, ours, "--init x.pt")


def test_detection_init_from_a_classifier_then_from_its_own_checkpoint(tmp_path: Path, classifier_file):
    """Through the loop: a classifier's file fills the backbone; a detection checkpoint fills everything."""
    path, state = classifier_file
    data = det_synthetic.write_shapes(tmp_path / "det", seed=1, split_sizes={"train": 2, "val": 1})
    config = dict(data=str(data), model="weightformer_tiny", model_kwargs=dict(DET_KWARGS), img_size=64, batch_size=2,
                  epochs=1, warmup_epochs=0, workers=0, device="cpu", max_steps=1, log_interval=1000)
    tiny_step = {"lr": 1e-9, "weight_decay": 0.0}  # one step that moves no weight by more than ~1e-8
    first = train({**config, "output": str(tmp_path / "a"), "init": str(path), **tiny_step}, task=DetectionTask)
    assert _backbone_matches(first.model, DET_BACKBONE, state, atol=1e-6)  # initialisations differ by ~1e-2
    second = train({**config, "output": str(tmp_path / "b"), "init": first.last_checkpoint, "seed": 9, **tiny_step},
                   task=DetectionTask)
    a, b = first.model.state_dict(), second.model.state_dict()
    assert all(torch.allclose(a[k].float(), b[k].float(), rtol=0, atol=1e-6) for k in a)
