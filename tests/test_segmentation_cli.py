"""``weightformer seg train|eval|predict`` end to end on a small synthetic shapes set, exact resume,
and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest_train import assert_same_weights, weights
from weightformer.cli import main
from weightformer.engine.metrics import read_metrics
from weightformer.segmentation.synthetic import write_shapes

# A tiny UperNet on a tiny WeightFormer: 32 px crops, batch 4, 16 training images (4 steps an epoch).
TINY = ["--model-kwargs", "embed_dim=32", "depth=2", "channels=16", "pyramid_channels=16", "aux_channels=8",
        "--img-size", "32", "--batch-size", "4", "--epochs", "2", "--warmup-epochs", "1", "--workers", "0",
        "--device", "cpu", "--log-interval", "1000", "--crop", "32", "--stride", "16"]


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_shapes(tmp_path_factory.mktemp("shapes"), train=16, val=4)


@pytest.fixture(scope="module")
def trained(shapes: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two epochs, never stopped (also the reference of the resume test)."""
    output = tmp_path_factory.mktemp("run")
    assert main(["seg", "train", "--data", str(shapes), "--num-classes", "4", "--output", str(output),
                 "--deterministic", *TINY]) == 0
    return output


def test_train_writes_run_files(trained: Path):
    records = read_metrics(trained / "metrics.jsonl")
    assert [r["epoch"] for r in records] == [1, 2]
    for record in records:
        assert {"val_mIoU", "val_mAcc", "val_aAcc", "train_loss"} <= record.keys()
        assert 0 <= record["val_mIoU"] <= 100 and 0 <= record["val_aAcc"] <= 100
    for name in ("last.pt", "best.pt", "curves.png", "config.yaml"):
        assert (trained / name).is_file(), name
    meta = torch.load(trained / "best.pt", weights_only=True)["meta"]
    assert meta["task"] == "segmentation" and meta["model"] == "weightformer_tiny"
    assert meta["num_classes"] == 4 and meta["model_kwargs"]["channels"] == 16


@pytest.mark.parametrize("stop_at", [3, 4])  # mid-epoch, and at the epoch boundary
def test_max_steps_then_resume_matches_uninterrupted(shapes: Path, trained: Path, tmp_path: Path, stop_at: int):
    assert main(["seg", "train", "--data", str(shapes), "--num-classes", "4", "--output", str(tmp_path),
                 "--deterministic", "--max-steps", str(stop_at), *TINY]) == 0
    assert torch.load(tmp_path / "last.pt", weights_only=True)["global_step"] == stop_at
    # Only the folder: the checkpoint's config applies, under the shapes defaults the command brings.
    assert main(["seg", "train", "--output", str(tmp_path), "--resume", "auto"]) == 0
    assert_same_weights(weights(tmp_path / "last.pt"), weights(trained / "last.pt"))
    strip = lambda rs: [{k: v for k, v in r.items() if k != "img_per_s"} for r in rs]  # noqa: E731
    assert strip(read_metrics(tmp_path / "metrics.jsonl"))[-1] == strip(read_metrics(trained / "metrics.jsonl"))[-1]


def test_eval_prints_and_writes_json(trained: Path, tmp_path: Path, capsys):
    out = tmp_path / "results.json"
    assert main(["seg", "eval", "--checkpoint", str(trained / "best.pt"), "--device", "cpu", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    result = json.loads(printed.strip().splitlines()[-1])
    assert json.loads(out.read_text()) == result
    assert result["images"] == 4 and result["seg_inference"] == "whole"
    best = torch.load(trained / "best.pt", weights_only=True)
    assert result["mIoU"] == pytest.approx(best["val_mIoU"])  # the run's own evaluation, rebuilt from the checkpoint
    assert "mIoU" in printed and "aAcc" in printed

    assert main(["seg", "eval", "--checkpoint", str(trained / "best.pt"), "--device", "cpu",
                 "--inference", "slide"]) == 0
    slide = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (slide["seg_inference"], slide["seg_crop"], slide["seg_stride"]) == ("slide", 32, 16)
    assert 0 <= slide["mIoU"] <= 100


def test_predict_writes_label_pngs_and_overlays(shapes: Path, trained: Path, tmp_path: Path):
    images = sorted((shapes / "images" / "validation").iterdir())[:2]
    out = tmp_path / "pred"
    assert main(["seg", "predict", "--checkpoint", str(trained / "last.pt"), "--device", "cpu",
                 *map(str, images), "--out", str(out)]) == 0
    for image in images:
        label = Image.open(out / f"{image.stem}.png")
        overlay = Image.open(out / f"{image.stem}_overlay.png")
        assert label.mode == "P" and label.size == overlay.size == Image.open(image).size
        values = np.unique(np.asarray(label))
        assert values.min() >= 1 and values.max() <= 4  # reduce-zero-label encoding: class c is c + 1


def test_bad_label_values_are_one_line_errors(shapes: Path, tmp_path: Path, capsys):
    data = write_shapes(tmp_path / "bad", train=4, val=2)
    label = data / "annotations" / "training" / "shapes_00001.png"
    Image.fromarray(np.full((64, 64), 9, dtype=np.uint8)).save(label)
    Image.new("RGB", (64, 64)).save(data / "images" / "training" / "shapes_00001.jpg")
    code = main(["seg", "train", "--data", str(data), "--num-classes", "4", "--output", str(tmp_path / "run"),
                 *TINY])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert "shapes_00001.png" in err and "--num-classes 9" in err


@pytest.mark.parametrize("argv, expected", [
    (["eval", "--checkpoint", "missing.pt"], "missing.pt"),
    (["predict", "--checkpoint", "CKPT", "nowhere.jpg", "--out", "OUT"], "nowhere.jpg does not exist"),
    (["eval", "--checkpoint", "CKPT", "--inference", "slide", "--crop", "16", "--stride", "32"], "stride 32"),
])
def test_eval_and_predict_errors(trained: Path, tmp_path: Path, capsys, argv, expected):
    argv = [a.replace("CKPT", str(trained / "last.pt")).replace("OUT", str(tmp_path / "out")) for a in argv]
    assert main(["seg", *argv, "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1 and expected in err


def test_classification_checkpoint_is_refused(tmp_path: Path, capsys):
    path = tmp_path / "cls.pt"
    torch.save({"model": {}, "meta": {"task": "classification", "model": "weightformer_tiny"}}, path)
    assert main(["seg", "eval", "--checkpoint", str(path), "--device", "cpu"]) == 2
    assert "classification checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["train", "eval", "predict"])
def test_help_shows_defaults(command: str, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["seg", command, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "(default:" in text and "--inference" in text
