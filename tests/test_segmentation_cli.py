"""``weightformer seg train|eval|predict`` end to end on a small shapes set in ADE20K's download layout:
exact resume from the run folder alone, the run's own inference settings in eval, checkpoints of the
legacy format, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from conftest_train import assert_same_weights, weights
from weightformer.cli import main
from weightformer.engine.metrics import read_metrics
from weightformer.segmentation.synthetic import write_shapes

LEGACY = Path(__file__).resolve().parent / "data" / "legacy_checkpoints" / "seg"  # written by commit 85154e8

# A tiny UperNet on a tiny WeightFormer: 32 px crops, batch 4, 16 training images (4 steps an epoch),
# evaluated in sliding 32 px windows every 16 px.
TINY = ["--model-kwargs", "embed_dim=32", "depth=2", "channels=16", "pyramid_channels=16", "aux_channels=8",
        "--img-size", "32", "--batch-size", "4", "--epochs", "2", "--warmup-epochs", "1", "--workers", "0",
        "--device", "cpu", "--log-interval", "1000", "--inference", "slide", "--crop", "32", "--stride", "16"]


@pytest.fixture(scope="module")
def downloads(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding ADEChallengeData2016/ (images/ and annotations/), as ADE20K's zip unpacks."""
    root = tmp_path_factory.mktemp("downloads")
    write_shapes(root / "ADEChallengeData2016", train=16, val=4)
    return root


@pytest.fixture(scope="module")
def shapes(downloads: Path) -> Path:
    return downloads / "ADEChallengeData2016"


@pytest.fixture(scope="module")
def trained(downloads: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two epochs, never stopped (also the reference of the resume test); the classes are the data's."""
    output = tmp_path_factory.mktemp("run")
    assert main(["seg", "train", "--data", str(downloads), "--output", str(output), "--deterministic", *TINY]) == 0
    return output


def test_train_writes_run_files(trained: Path, downloads: Path):
    records = read_metrics(trained / "metrics.jsonl")
    assert [r["epoch"] for r in records] == [1, 2]
    for record in records:
        assert {"val_mIoU", "val_mAcc", "val_aAcc", "train_loss"} <= record.keys()
        assert 0 <= record["val_mIoU"] <= 100 and 0 <= record["val_aAcc"] <= 100
    for name in ("last.pt", "best.pt", "curves.png", "config.yaml"):
        assert (trained / name).is_file(), name
    meta = torch.load(trained / "best.pt", weights_only=True)["meta"]
    assert meta["task"] == "segmentation" and meta["model"] == "weightformer_tiny"
    assert meta["num_classes"] == 4 and meta["model_kwargs"]["channels"] == 16 and meta["data"] == str(downloads)
    saved = yaml.safe_load((trained / "config.yaml").read_text())
    assert (saved["seg_inference"], saved["seg_crop"], saved["seg_stride"]) == ("slide", 32, 16)


@pytest.mark.parametrize("stop_at", [3, 4])  # mid-epoch, and at the epoch boundary
def test_resume_auto_alone_continues_the_run_with_its_own_settings(downloads: Path, trained: Path, tmp_path: Path,
                                                                    stop_at: int, capsys):
    assert main(["seg", "train", "--data", str(downloads), "--output", str(tmp_path), "--deterministic",
                 "--max-steps", str(stop_at), *TINY]) == 0
    assert torch.load(tmp_path / "last.pt", weights_only=True)["global_step"] == stop_at
    capsys.readouterr()
    # Only the folder: no --data (the default would be shapes), no model, crops or sliding windows.
    assert main(["seg", "train", "--output", str(tmp_path), "--resume", "auto"]) == 0
    assert capsys.readouterr().out.startswith(f"recipe resumed: the settings saved with the run being resumed; "
                                              f"chosen because --resume continues {tmp_path / 'last.pt'}")
    assert_same_weights(weights(tmp_path / "last.pt"), weights(trained / "last.pt"))
    strip = lambda rs: [{k: v for k, v in r.items() if k != "img_per_s"} for r in rs]  # noqa: E731
    assert strip(read_metrics(tmp_path / "metrics.jsonl"))[-1] == strip(read_metrics(trained / "metrics.jsonl"))[-1]
    resumed = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert (resumed["data"], resumed["seg_inference"], resumed["seg_crop"]) == (str(downloads), "slide", 32)


def test_eval_prints_and_writes_json(trained: Path, tmp_path: Path, capsys):
    out = tmp_path / "results.json"
    assert main(["seg", "eval", "--checkpoint", str(trained / "best.pt"), "--device", "cpu", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    result = json.loads(printed.strip().splitlines()[-1])
    assert json.loads(out.read_text()) == result
    assert result["images"] == 4 and (result["seg_inference"], result["seg_crop"], result["seg_stride"]) == \
        ("slide", 32, 16)  # the run's own
    best = torch.load(trained / "best.pt", weights_only=True)
    assert result["mIoU"] == pytest.approx(best["val_mIoU"])  # the run's own evaluation, rebuilt from the checkpoint
    assert "mIoU" in printed and "aAcc" in printed and "IoU per class: 0 " in printed  # a folder names no classes

    assert main(["seg", "eval", "--checkpoint", str(trained / "best.pt"), "--device", "cpu",
                 "--inference", "whole"]) == 0
    whole = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert whole["seg_inference"] == "whole" and 0 <= whole["mIoU"] <= 100


def test_library_functions_are_the_commands(trained: Path, shapes: Path, tmp_path: Path, capsys):
    from weightformer.segmentation import evaluate_checkpoint
    from weightformer.segmentation.predict import predict

    assert main(["seg", "eval", "--checkpoint", str(trained / "best.pt"), "--device", "cpu", "--data", str(shapes),
                 "--crop", "24", "--stride", "12"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    result = evaluate_checkpoint(trained / "best.pt", data=str(shapes), crop=24, stride=12, device="cpu")
    assert result == printed
    image = sorted((shapes / "images" / "validation").iterdir())[0]
    written = predict(trained / "best.pt", [image], tmp_path / "pred", device="cpu")
    out = tmp_path / "pred"
    assert written == [(image, out / f"{image.stem}.png", out / f"{image.stem}_overlay.png")]


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


def test_a_folder_in_no_known_layout_is_one_line_saying_what_was_looked_for(tmp_path: Path, capsys):
    (tmp_path / "mine" / "pictures").mkdir(parents=True)
    assert main(["seg", "train", "--data", str(tmp_path / "mine"), "--output", str(tmp_path / "run"), *TINY]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: segmentation data {tmp_path / 'mine'} holds no segmentation data in a layout "
                          f"this package reads: looked for ") and len(err.strip().splitlines()) == 1
    assert "ADEChallengeData2016" in err


@pytest.mark.parametrize("task, command", [("classification", "weightformer"), ("detection", "weightformer det")])
def test_another_tasks_checkpoint_gets_the_one_wrong_task_line(tmp_path: Path, capsys, task: str, command: str):
    path = tmp_path / f"{task}.pt"
    torch.save({"model": {}, "meta": {"task": task, "model": "weightformer_tiny"}}, path)
    assert main(["seg", "eval", "--checkpoint", str(path), "--device", "cpu"]) == 2
    assert capsys.readouterr().err == (f"error: {path} is a {task} checkpoint, not a segmentation one; use it with "
                                       f"{command} (e.g. {command} eval --checkpoint {path})\n")


def test_weights_without_a_description_are_refused(tmp_path: Path, capsys):
    path = tmp_path / "bare.pt"
    torch.save({"pyramid.backbone.patch_embed.proj.weight": torch.zeros(1)}, path)
    assert main(["seg", "predict", str(path), "--checkpoint", str(path), "--out", str(tmp_path / "out"),
                 "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: {path} holds weights without the description of a segmentation model; pass a last.pt or "
                   f"best.pt written by weightformer seg train\n")


def test_checkpoints_of_the_format_before_the_redesign(tmp_path: Path, monkeypatch, capsys):
    """A run of the legacy format (commit 85154e8: the shapes set, evaluated in 64 px windows every 48): eval rebuilds its
    model and its settings and gives the run's own numbers; predict writes its maps."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # its data: shapes, drawn into the cache
    best = LEGACY / "best.pt"
    assert main(["seg", "eval", "--checkpoint", str(best), "--device", "cpu"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    settings = (result["seg_inference"], result["seg_crop"], result["seg_stride"])
    assert settings == ("slide", 64, 48) and result["images"] == 50
    # the run's own evaluation (at another thread count: float sums in another order)
    assert result["mIoU"] == pytest.approx(torch.load(best, weights_only=True)["val_mIoU"], rel=1e-3)
    assert result["classes"] == ["background", "circle", "square", "triangle"]
    image = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (50, 70, 3), dtype=np.uint8)).save(image)
    assert main(["seg", "predict", str(image), "--checkpoint", str(LEGACY / "last.pt"), "--out", str(tmp_path / "p"),
                 "--device", "cpu"]) == 0
    label = np.asarray(Image.open(tmp_path / "p" / "photo.png"))
    assert label.shape == (50, 70) and 1 <= label.min() and label.max() <= 4


@pytest.mark.parametrize("command", ["train", "eval", "predict"])
def test_help_shows_defaults(command: str, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["seg", command, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "(default:" in text and "--inference" in text
