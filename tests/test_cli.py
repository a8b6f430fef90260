"""The ``weightformer`` command: train/eval through the CLI, outputs, user errors, unsafe checkpoints, bench wiring."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from conftest_train import make_image_folder
from weightformer.cli import main
from pickles import CodeRunningPickle

TINY_FLAGS = ["--img-size", "16", "--batch-size", "4", "--workers", "0", "--device", "cpu",
              "--model-kwargs", "patch_size=4", "embed_dim=32", "depth=2"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("data"), classes=("a", "b", "c"), train_per_class=4)


@pytest.fixture(scope="module")
def trained(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 2-epoch CLI run on a 3-class folder."""
    output = tmp_path_factory.mktemp("run")
    assert main(["train", "--data", str(folder), "--output", str(output), "--epochs", "2", "--warmup-epochs", "1",
                 *TINY_FLAGS]) == 0
    return output


def test_train_writes_the_output_folder(trained: Path, capsys):
    assert {p.name for p in trained.iterdir()} >= {"last.pt", "best.pt", "metrics.jsonl", "curves.png", "config.yaml"}
    records = [json.loads(line) for line in (trained / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2]
    for key in ("epoch", "step", "train_loss", "val_loss", "val_top1", "val_top5", "lr", "img_per_s", "world_size"):
        assert key in records[0]
    assert records[-1]["step"] == 6 and records[-1]["world_size"] == 1
    assert (trained / "curves.png").read_bytes()[:4] == b"\x89PNG"
    checkpoint = torch.load(trained / "best.pt", weights_only=True)
    meta = checkpoint["meta"]
    assert meta["model"] == "weightformer_tiny" and meta["num_classes"] == 3 and meta["img_size"] == 16
    assert meta["model_kwargs"]["embed_dim"] == 32 and meta["classes"] == ["a", "b", "c"]


def test_train_prints_summary_and_eval_command(folder: Path, tmp_path: Path, capsys):
    assert main(["train", "--data", str(folder), "--output", str(tmp_path), "--max-steps", "2", *TINY_FLAGS]) == 0
    out = capsys.readouterr().out
    assert "best top-1" in out and str(tmp_path / "best.pt") in out
    assert f"evaluate with: weightformer eval --checkpoint {tmp_path / 'best.pt'}" in out


def test_config_file_is_overridden_by_flags_and_saved(folder: Path, tmp_path: Path):
    config = tmp_path / "cfg.yaml"
    config.write_text(f"data: {folder}\nepochs: 7\nmax_steps: 1\nsmoothing: 0.0\nmodel_kwargs: {{drop_path_rate: 0.1}}\n")
    output = tmp_path / "out"
    assert main(["train", "--config", str(config), "--epochs", "3", "--output", str(output), *TINY_FLAGS]) == 0
    import yaml

    saved = yaml.safe_load((output / "config.yaml").read_text())
    assert saved["epochs"] == 3 and saved["smoothing"] == 0.0 and saved["max_steps"] == 1
    assert saved["model_kwargs"] == {"patch_size": 4, "embed_dim": 32, "depth": 2, "drop_path_rate": 0.1}


def test_mnist_defaults_are_announced(tmp_path: Path, capsys):
    assert main(["train", "--output", str(tmp_path), "--max-steps", "1", "--model-arg", "embed_dim=32",
                 "--model-arg", "depth=2", "--batch-size", "16", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "defaults for mnist: model=weightformer_tiny patch_size=4" in out
    assert torch.load(tmp_path / "last.pt", weights_only=True)["meta"]["in_chans"] == 1


def test_eval_rebuilds_the_model_from_the_checkpoint(trained: Path, tmp_path: Path, capsys):
    out_json = tmp_path / "eval.json"
    assert main(["eval", "--checkpoint", str(trained / "best.pt"), "--workers", "0", "--json", str(out_json)]) == 0
    text, json_line = capsys.readouterr().out.strip().splitlines()[-2:]
    result = json.loads(json_line)
    assert json.loads(out_json.read_text()) == result
    assert set(result) >= {"top1", "top5", "loss", "img_per_s", "num_samples"} and result["num_samples"] == 12
    assert f"top-1 {result['top1']:.2f}%" in text
    best = torch.load(trained / "best.pt", weights_only=True)
    assert result["top1"] == pytest.approx(best["val_top1"])


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("layout", ["missing", "empty", "mismatch"])
def test_bad_data_is_one_error_line(tmp_path: Path, capsys, layout: str):
    root = tmp_path / "data"
    if layout == "empty":
        root.mkdir()
    elif layout == "mismatch":
        make_image_folder(root, classes=("a", "b"), train_per_class=1, val_per_class=1)
        (root / "val" / "b").rename(root / "val" / "c")
    assert main(["train", "--data", str(root), "--output", str(tmp_path / "out"), *TINY_FLAGS]) == 2
    _error_line(capsys)


def test_corrupt_image_is_skipped_and_training_continues(tmp_path: Path, capsys):
    root = make_image_folder(tmp_path / "data", train_per_class=3, val_per_class=1)
    (root / "train" / "dog" / "garbage.jpg").write_bytes(b"\x00\x01 not an image")
    with pytest.warns(UserWarning, match=r"(?s)skipped 1 unreadable image file\(s\).*garbage\.jpg"):
        code = main(["train", "--data", str(root), "--output", str(tmp_path / "out"), "--max-steps", "2", *TINY_FLAGS])
    assert code == 0 and (tmp_path / "out" / "last.pt").is_file()


def test_checkpoint_with_other_class_count_is_refused(trained: Path, tmp_path: Path, capsys):
    two_classes = make_image_folder(tmp_path / "two", classes=("a", "b"), train_per_class=2, val_per_class=1)
    assert main(["eval", "--checkpoint", str(trained / "best.pt"), "--data", str(two_classes), "--workers", "0"]) == 2
    assert "has 3 classes, the data" in _error_line(capsys)
    # Resuming into a run whose data has another class count names the mismatch too.
    assert main(["train", "--data", str(two_classes), "--output", str(tmp_path / "out"),
                 "--resume", str(trained / "last.pt"), *TINY_FLAGS]) == 2
    err = _error_line(capsys)
    assert "last.pt has 3 classes and" in err and "two has 2" in err


def test_checkpoint_for_another_architecture_names_the_mismatch(trained: Path, folder: Path, capsys):
    assert main(["eval", "--checkpoint", str(trained / "best.pt"), "--model", "weightformer_tiny",
                 "--model-kwargs", "patch_size=4", "embed_dim=48", "depth=2", "--workers", "0",
                 "--data", str(folder)]) == 2
    err = _error_line(capsys)
    assert "does not fit the model" in err and "shape mismatch(es) (checkpoint vs model)" in err and "(32,) vs (48,)" in err


@pytest.mark.parametrize("command", ["eval", "train"])
def test_checkpoint_that_would_run_code_is_refused(tmp_path: Path, folder: Path, capsys, command: str):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt"
    torch.save({"model": CodeRunningPickle(marker)}, evil, pickle_module=pickle)
    args = (["eval", "--checkpoint", str(evil), "--data", str(folder)] if command == "eval"
            else ["train", "--data", str(folder), "--output", str(tmp_path / "out"), "--resume", str(evil), *TINY_FLAGS])
    assert main(args) == 2
    assert "refused to load" in _error_line(capsys)
    assert not marker.exists()


def test_unknown_setting_is_an_error(capsys):
    assert main(["train", "--set", "mixupp=0.1"]) == 2
    assert "did you mean 'mixup'" in _error_line(capsys)


def test_bench_is_loaded_lazily(monkeypatch, capsys):
    import weightformer.bench

    monkeypatch.setitem(sys.modules, "weightformer.bench.cli", None)  # import fails
    monkeypatch.delattr(weightformer.bench, "cli", raising=False)  # even if another test imported it
    assert main(["bench", "--anything"]) == 1
    assert "bench subcommand is unavailable" in _error_line(capsys)

    fake = types.ModuleType("weightformer.bench.cli")
    fake.main = lambda argv: 0 if argv == ["--repeat", "3"] else 5
    monkeypatch.setitem(sys.modules, "weightformer.bench.cli", fake)
    monkeypatch.setattr(weightformer.bench, "cli", fake, raising=False)
    assert main(["bench", "--repeat", "3"]) == 0


def test_python_dash_m_is_the_same_command():
    out = subprocess.run([sys.executable, "-m", "weightformer", "--help"], capture_output=True, text=True, check=True)
    assert "train" in out.stdout and "eval" in out.stdout and "bench" in out.stdout


def test_image_too_small_for_the_model_is_one_error_line(folder: Path, tmp_path: Path, capsys):
    assert main(["train", "--data", str(folder), "--model", "convnext_atto", "--img-size", "16", "--batch-size", "4",
                 "--workers", "0", "--device", "cpu", "--output", str(tmp_path)]) == 2
    assert "convnext_atto cannot take 16 px images" in _error_line(capsys)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--lr", "-1"], "lr must be positive"),
        (["--model-kwargs", "embed_dim=abc"], "cannot build weightformer_tiny"),
        (["--model-kwargs", "depth=-3"], "depth must be a positive integer"),
        (["--model-kwargs", "not_an_argument=1"], "unexpected keyword argument 'not_an_argument'"),
    ],
)
def test_bad_training_settings_are_one_error_line(tmp_path: Path, capsys, args: list, message: str):
    assert main(["train", "--max-steps", "1", "--output", str(tmp_path), *args]) == 2
    assert message in _error_line(capsys)
