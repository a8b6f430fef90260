"""Stopping and resuming: a deterministic CPU run that is interrupted and resumed ends bit-identical
to one that was never interrupted (model, EMA and optimizer state)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest_train import assert_same_weights, make_image_folder, tiny_config, weights
from weightformer.engine import StopFlag, train
from weightformer.engine.metrics import read_metrics

# Every random source the checkpoint must carry: per-sample augmentation (RandAugment, random
# resized crop, erasing), Mixup/CutMix (NumPy), drop path (torch), plus EMA and the data order.
RANDOM_EVERYTHING = dict(
    auto_augment="rand-m9-mstd0.5-inc1", reprob=0.25, mixup=0.8, cutmix=1.0, smoothing=0.1, hflip=0.5,
    ema=True, ema_decay=0.9, deterministic=True,
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("data"), train_per_class=12, val_per_class=4)


@pytest.fixture(scope="module")
def uninterrupted(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 epochs of 6 steps, never stopped."""
    output = tmp_path_factory.mktemp("uninterrupted")
    config = tiny_config(folder, output, model_kwargs={"patch_size": 4, "embed_dim": 32, "depth": 3, "drop_path_rate": 0.2},
                         **RANDOM_EVERYTHING)
    result = train(config, task="classification")
    assert result.global_step == 12 and result.stopped_by is None
    return output


def _config(folder: Path, output: Path, **overrides):
    return tiny_config(folder, output, model_kwargs={"patch_size": 4, "embed_dim": 32, "depth": 3, "drop_path_rate": 0.2},
                       **RANDOM_EVERYTHING, **overrides)


@pytest.mark.parametrize("stop_at", [4, 6])  # mid-epoch, and at an epoch boundary
def test_max_steps_then_resume_matches_uninterrupted(folder: Path, uninterrupted: Path, tmp_path: Path, stop_at: int):
    first = train(_config(folder, tmp_path, max_steps=stop_at), task="classification")
    assert first.global_step == stop_at
    saved = torch.load(tmp_path / "last.pt", weights_only=True)
    assert (saved["epoch"], saved["step_in_epoch"]) == ((0, stop_at) if stop_at < 6 else (1, 0))

    # Resume with only the folder: the checkpoint's own config (minus max_steps) applies, and a
    # different worker count must not change the data or the augmentation.
    second = train({"output": str(tmp_path), "resume": "auto", "workers": 1}, task="classification")
    assert second.global_step == 12
    for key in ("model", "ema"):
        assert_same_weights(weights(tmp_path / "last.pt", key), weights(uninterrupted / "last.pt", key))
    a = torch.load(tmp_path / "last.pt", weights_only=True)["optimizer"]["state"]
    b = torch.load(uninterrupted / "last.pt", weights_only=True)["optimizer"]["state"]
    assert all(torch.equal(a[i]["exp_avg_sq"], b[i]["exp_avg_sq"]) for i in b)
    # The metrics of the resumed run are the uninterrupted run's, minus timings.
    strip = lambda rs: [{k: v for k, v in r.items() if k != "img_per_s"} for r in rs]  # noqa: E731
    assert strip(read_metrics(tmp_path / "metrics.jsonl")) == strip(read_metrics(uninterrupted / "metrics.jsonl"))


def test_stop_flag_saves_and_resume_matches(folder: Path, uninterrupted: Path, tmp_path: Path, monkeypatch):
    """A stop requested from code (what the signal handler does) lands on a step boundary and resumes exactly."""
    stop = StopFlag()
    calls = {"n": 0}
    original = torch.optim.AdamW.step

    def counting_step(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 9:
            stop.set("SIGTERM")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", counting_step)
    result = train(_config(folder, tmp_path), stop=stop, task="classification")
    monkeypatch.undo()
    assert result.stopped_by == "SIGTERM" and result.global_step == 9
    train({"output": str(tmp_path), "resume": "auto"}, task="classification")
    assert_same_weights(weights(tmp_path / "last.pt"), weights(uninterrupted / "last.pt"))


def test_sigint_subprocess_saves_checkpoint_and_resumes(folder: Path, tmp_path: Path):
    """A real SIGINT to ``weightformer train``: exit code 130, a checkpoint, and an exact resume."""
    reference = tmp_path / "reference"
    long_run = dict(epochs=4, log_interval=1)
    train(_config(folder, reference, **long_run), task="classification")

    interrupted = tmp_path / "interrupted"
    cmd = [sys.executable, "-m", "weightformer", "train", "--data", str(folder), "--output", str(interrupted),
           "--img-size", "16", "--batch-size", "4", "--epochs", "4", "--warmup-epochs", "1", "--workers", "0",
           "--lr", "5e-3", "--log-interval", "1", "--device", "cpu", "--deterministic", "--ema",
           "--model-kwargs", "patch_size=4", "embed_dim=32", "depth=3", "drop_path_rate=0.2",
           "--set", "auto_augment=rand-m9-mstd0.5-inc1", "--set", "reprob=0.25", "--set", "mixup=0.8",
           "--set", "cutmix=1.0", "--set", "smoothing=0.1", "--set", "hflip=0.5", "--set", "ema_decay=0.9"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "step 2/6" in line:
            proc.send_signal(signal.SIGINT)
            break
    out = "".join(lines) + proc.stdout.read()
    assert proc.wait(timeout=120) == 130, out
    assert "checkpoint saved to" in out and "--resume auto" in out
    saved = torch.load(interrupted / "last.pt", weights_only=True)
    assert 0 < saved["global_step"] < 24

    train({"output": str(interrupted), "resume": "auto"}, task="classification")
    assert_same_weights(weights(interrupted / "last.pt"), weights(reference / "last.pt"))
