"""Checkpoints of format 0 (no ``format`` key) load into every command: eval, predict, sample, export and
``--resume`` (tests/data/legacy_checkpoints/README.md says how they were made); the one upgrade brings
them to the current format, and a checkpoint of a newer format is refused in one line."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from weightformer.checkpoint import save_atomic
from weightformer.cli import main
from weightformer.detection.config import split_model_kwargs
from weightformer.engine import CHECKPOINT_FORMAT, load_model, read_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

LEGACY = Path(__file__).resolve().parent / "data" / "legacy_checkpoints"
TASKS = {"cls": "classification", "det": "detection", "seg": "segmentation", "gen": "generation"}


@pytest.fixture
def image(tmp_path: Path) -> Path:
    path = tmp_path / "in" / "picture.png"
    path.parent.mkdir()
    pixels = np.random.default_rng(0).integers(0, 256, (70, 90, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


@pytest.mark.parametrize("folder, task", TASKS.items())
def test_every_legacy_checkpoint_rebuilds_its_model_through_the_one_reader(folder: str, task: str):
    for name in ("best.pt", "last.pt"):
        loaded = load_model(LEGACY / folder / name, task=task)
        assert loaded.task.name == task and not loaded.model.training
        saved = torch.load(LEGACY / folder / name, weights_only=True)["model"]
        mine = loaded.model.state_dict()
        assert all(torch.equal(mine[k], v) for k, v in saved.items())


def test_legacy_classifier_in_eval_predict_and_export(image: Path, tmp_path: Path, capsys):
    best = str(LEGACY / "cls" / "best.pt")
    assert main(["eval", "--checkpoint", best, "--workers", "0", "--batch-size", "500"]) == 0
    assert "top-1" in capsys.readouterr().out
    assert main(["predict", str(image), "--checkpoint", best, "--top-k", "2"]) == 0
    assert "picture.png:" in capsys.readouterr().out
    assert main(["export", "--checkpoint", best, "--format", "hf", "--out", str(tmp_path / "hub")]) == 0
    assert (tmp_path / "hub" / "model.safetensors").is_file()


def test_legacy_dense_and_generation_checkpoints_in_their_commands(image: Path, tmp_path: Path, capsys):
    det, seg, gen = (str(LEGACY / name / "best.pt") for name in ("det", "seg", "gen"))
    assert main(["det", "eval", "--checkpoint", det, "--batch-size", "4", "--workers", "0"]) == 0
    assert main(["det", "predict", str(image), "--checkpoint", det, "--out", str(tmp_path / "det")]) == 0
    assert (tmp_path / "det" / "detections.json").is_file()
    assert main(["seg", "eval", "--checkpoint", seg, "--workers", "0"]) == 0
    assert "slide inference" in capsys.readouterr().out  # the run's own sliding-window settings
    assert main(["seg", "predict", str(image), "--checkpoint", seg, "--out", str(tmp_path / "seg")]) == 0
    assert (tmp_path / "seg" / "picture.png").is_file()
    assert main(["gen", "sample", "--checkpoint", gen, "--out", str(tmp_path / "gen"), "--steps", "2",
                 "--num-per-class", "1", "--classes", "3", "--device", "cpu"]) == 0
    assert (tmp_path / "gen" / "samples.npz").is_file()


@pytest.mark.parametrize("folder", list(TASKS))
def test_a_legacy_run_resumes_with_its_own_settings(folder: str, tmp_path: Path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(LEGACY / folder / "last.pt", run / "last.pt")
    saved = torch.load(run / "last.pt", weights_only=True)
    command = [] if folder == "cls" else [folder]
    assert main([*command, "train", "--output", str(run), "--resume", "auto",
                 "--max-steps", str(saved["global_step"] + 1)]) == 0
    out = capsys.readouterr().out
    assert "recipe resumed" in out and f"resumed from {run / 'last.pt'}" in out
    after = torch.load(run / "last.pt", weights_only=True)
    assert after["global_step"] == saved["global_step"] + 1
    # the same model, data and classes: nothing from another recipe. A dense run's meta names its
    # protocol: a legacy run, which names none, resumes as the protocol it was trained with.
    # A detection run's meta names its canvas: a legacy one gets the smallest that holds its images (64²).
    # A classification run's meta names its validation split and columns (for shards and Hugging Face sets):
    # a legacy one, which names none, gets the defaults it was read with.
    protocol = {"det": {"protocol": "torchvision", "canvas": 64}, "seg": {"protocol": "simple-pyramid"},
                "cls": {"val_split": "val", "columns": ["image", "label"]}}.get(folder, {})
    if folder == "det":  # a detection run's meta now keeps the detector's kwargs apart from the backbone's
        backbone, detector = split_model_kwargs(saved["meta"]["model_kwargs"])
        protocol = {**protocol, "model_kwargs": backbone, "detector_kwargs": detector}
    assert "protocol" not in saved["meta"] and after["meta"] == {**saved["meta"], **protocol}


def test_a_legacy_checkpoint_starts_a_new_run_with_init(tmp_path: Path, capsys):
    best = LEGACY / "cls" / "best.pt"
    assert main(["train", "--init", str(best), "--output", str(tmp_path / "cls"), "--max-steps", "1",
                 "--model-kwargs", "patch_size=4", "embed_dim=16", "depth=2"]) == 0
    assert f"initialised from the weights in {best}" in capsys.readouterr().out
    det = LEGACY / "det" / "best.pt"
    assert main(["det", "train", "--init", str(det), "--output", str(tmp_path / "det"), "--max-steps", "1",
                 "--img-size", "64", "--batch-size", "2", "--model-kwargs", "embed_dim=16", "depth=2", "conv_dim=16",
                 "fc_dim=32"]) == 0
    assert f"initialised from the weights in {det}" in capsys.readouterr().out



def test_an_unversioned_checkpoint_is_upgraded_to_the_current_format(tmp_path: Path):
    saved = torch.load(LEGACY / "det" / "last.pt", weights_only=True)
    assert "format" not in saved and "protocol" not in saved["meta"] and "det_protocol" not in saved["config"]
    upgraded = read_checkpoint(LEGACY / "det" / "last.pt")
    assert upgraded["format"] == CHECKPOINT_FORMAT
    kwargs = saved["meta"]["model_kwargs"]  # format 0 keeps the detector's settings beside the backbone's
    backbone = {k: kwargs[k] for k in ("embed_dim", "depth")}
    detector = {k: v for k, v in kwargs.items() if k not in backbone}
    assert set(detector) >= {"conv_dim", "fc_dim", "rpn_pre_nms_top_n_train", "box_batch_size_per_image"}
    assert upgraded["meta"] == {**saved["meta"], "protocol": "torchvision", "model_kwargs": backbone,
                                "detector_kwargs": detector, "canvas": 64}
    assert upgraded["config"] == {**saved["config"], "det_protocol": "torchvision"}
    assert read_checkpoint(LEGACY / "seg" / "best.pt")["meta"]["protocol"] == "simple-pyramid"
    # The oldest checkpoints name their best score best_<metric>.
    progress = {k: v for k, v in saved["progress"].items() if k != "best_score"}
    save_atomic({**saved, "progress": {**progress, "best_bbox_mAP": 0.5}}, tmp_path / "old.pt")
    assert read_checkpoint(tmp_path / "old.pt")["progress"] == {**progress, "best_score": 0.5}


def test_an_unversioned_long_range_checkpoint_that_names_no_predictor_is_rebuilt_with_centered(tmp_path: Path):
    """Runs of a long-range design wrote no predictor down when ``centered`` was the design's."""
    import timm

    kwargs = {"patch_size": 4, "embed_dim": 16, "depth": 1}
    model = timm.create_model("weightformer_long_range_tiny", linear_predictor="centered", num_classes=3, in_chans=1,
                              **kwargs)
    meta = {"task": "classification", "model": "weightformer_long_range_tiny", "model_kwargs": kwargs,
            "num_classes": 3, "in_chans": 1, "img_size": 28}
    save_atomic({"model": model.state_dict(), "meta": meta}, tmp_path / "old.pt")
    loaded = load_model(tmp_path / "old.pt", task="classification")
    assert loaded.meta["model_kwargs"] == {**kwargs, "linear_predictor": "centered"}
    assert loaded.model.blocks[0].mlp.fc1.predictor_name == "centered"
    save_atomic({"model": model.state_dict(), "meta": meta, "format": CHECKPOINT_FORMAT}, tmp_path / "new.pt")
    assert "linear_predictor" not in load_model(tmp_path / "new.pt", task="classification").meta["model_kwargs"]


def test_a_checkpoint_of_a_newer_format_is_refused_in_one_line(tmp_path: Path, capsys):
    saved = torch.load(LEGACY / "cls" / "best.pt", weights_only=True)
    newer = tmp_path / "newer.pt"
    save_atomic({**saved, "format": CHECKPOINT_FORMAT + 1}, newer)
    assert main(["eval", "--checkpoint", str(newer)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {newer} is a checkpoint of format {CHECKPOINT_FORMAT + 1}, and this weightformer reads formats up to "
        f"{CHECKPOINT_FORMAT}; read it with the newer weightformer that wrote it")
