"""Checkpoints written before the whole-task redesign still load into every command: eval, predict,
sample, export and ``--resume`` (tests/data/legacy_checkpoints/README.md says how they were made)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from weightformer.cli import main
from weightformer.detection.config import split_model_kwargs
from weightformer.engine import load_model

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
    # the same model, data and classes: nothing from another recipe. A dense run's meta now names its
    # protocol (issue 21): a legacy run resumes as the protocol it was trained with.
    protocol = {"det": {"protocol": "torchvision"}, "seg": {"protocol": "simple-pyramid"}}.get(folder, {})
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
