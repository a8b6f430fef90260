"""Progress in the commands off a terminal (a log file, a pipe, CI: capsys's stderr is none): plain lines
now and then through :func:`weightformer.progress.progress`, never tqdm's carriage-return
updates, in ``predict``, ``eval``, ``seg predict``, the judge and latents of ``gen``, and the scan of an
ImageFolder (whose bar on a terminal still waits PROGRESS_DELAY_S before it appears).

A slow clock (each reading 100 s after the last, longer than the 30 s between lines) makes every
update due a line, so a few images or batches show what a long run writes."""

from __future__ import annotations

import importlib
import io
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image

import weightformer  # noqa: F401  (registers the models)
from weightformer.cli import main

LEGACY_SEG = Path(__file__).resolve().parent / "data" / "legacy_checkpoints" / "seg"  # written by commit 85154e8
CLASSES = ["circle", "square", "triangle"]


class SlowClock:
    """``time`` for weightformer.progress: each reading 100 s after the last."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 100.0
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def slow_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.import_module("weightformer.progress"), "time", SlowClock())


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """An ImageFolder tree of 32 px images: 2 per class in train/ and val/."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for name in CLASSES:
            (tmp_path / "data" / split / name).mkdir(parents=True)
            for i in range(2):
                pixels = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(tmp_path / "data" / split / name / f"{i}.png")
    return tmp_path / "data"


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    """A classifier's best.pt as training writes it, for the folder's three classes."""
    torch.manual_seed(0)
    kwargs = {"patch_size": 4, "embed_dim": 32, "depth": 2, "img_size": 32}
    model = timm.create_model("weightformer_tiny", num_classes=3, **kwargs)
    meta = {"task": "classification", "model": "weightformer_tiny", "model_kwargs": kwargs, "num_classes": 3,
            "in_chans": 3, "img_size": 32, "data": "shapes3", "classes": CLASSES, "mean": [0.5] * 3, "std": [0.25] * 3,
            "interpolation": "bilinear", "crop_pct": 1.0, "crop_mode": "center"}
    torch.save({"model": model.state_dict(), "meta": meta}, tmp_path / "best.pt")
    return tmp_path / "best.pt"


def plain_lines(err: str, desc: str) -> list[str]:
    """The progress lines of ``desc`` in ``err``, which has no carriage return."""
    assert "\r" not in err, err
    return [line for line in err.splitlines() if line.startswith(f"{desc}: ")]


def test_predict_writes_plain_lines(checkpoint: Path, folder: Path, slow_clock: None, capsys):
    assert main(["predict", str(folder / "val"), "--checkpoint", str(checkpoint), "--batch-size", "2"]) == 0
    lines = plain_lines(capsys.readouterr().err, "predicting")
    assert [line.split(" (")[0] for line in lines] == ["predicting: 2/6 img", "predicting: 4/6 img", "predicting: 6/6 img"]


def test_eval_writes_plain_lines(checkpoint: Path, folder: Path, slow_clock: None, capsys):
    """(It wrote nothing off a terminal, however long it took.)"""
    assert main(["eval", "--checkpoint", str(checkpoint), "--data", str(folder), "--batch-size", "2", "--workers", "0",
                 "--device", "cpu"]) == 0
    lines = plain_lines(capsys.readouterr().err, "evaluating")
    assert lines and lines[-1].startswith("evaluating: 3/3 batch")


def test_seg_predict_writes_plain_lines(tmp_path: Path, slow_clock: None, capsys):
    rng = np.random.default_rng(0)
    for name in ("a.png", "b.png"):
        Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(tmp_path / name)
    assert main(["seg", "predict", str(tmp_path / "a.png"), str(tmp_path / "b.png"), "--checkpoint",
                 str(LEGACY_SEG / "last.pt"), "--out", str(tmp_path / "pred"), "--device", "cpu"]) == 0
    lines = plain_lines(capsys.readouterr().err, "predicting")
    assert [line.split(" (")[0] for line in lines] == ["predicting: 1/2 img", "predicting: 2/2 img"]


def test_the_judge_of_gen_eval_writes_plain_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  slow_clock: None, capsys):
    from weightformer.generation.evaluation import JUDGE_EPOCHS, train_judge

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    images = np.random.default_rng(0).integers(0, 256, (8, 16, 16, 3), dtype=np.uint8)
    train_judge(images, np.arange(8) % 2, 2, progress=True)
    lines = plain_lines(capsys.readouterr().err, "training the judge")
    assert len(lines) == JUDGE_EPOCHS and lines[-1].startswith(f"training the judge: {JUDGE_EPOCHS}/{JUDGE_EPOCHS} epoch")


def test_encoding_latents_writes_plain_lines(slow_clock: None, capsys):
    from diffusers import AutoencoderKL
    from torch.utils.data import TensorDataset

    from weightformer.generation.latents import encode_split

    torch.manual_seed(0)
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 8), layers_per_block=1,
                        latent_channels=4, norm_num_groups=4, sample_size=16).eval()
    images = TensorDataset(torch.rand(4, 3, 16, 16) * 2 - 1, torch.arange(4) % 2)
    encoded = encode_split(vae, images, None, "key", batch_size=2, device=torch.device("cpu"), seed=0, progress=True)
    assert len(encoded) == 4
    lines = plain_lines(capsys.readouterr().err, "encoding latents")
    assert [line.split(" (")[0] for line in lines] == ["encoding latents: 1/2 batch", "encoding latents: 2/2 batch"]


def test_an_image_folder_scan_writes_plain_lines_off_a_terminal_and_a_delayed_bar_on_one(
        folder: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    from weightformer.data import folder as folder_module

    clock = importlib.import_module("weightformer.progress")
    with monkeypatch.context() as slow:
        slow.setattr(clock, "time", SlowClock())
        folder_module.scan_split(folder / "train", progress=True)
    err = capsys.readouterr().err
    assert plain_lines(err, "listing train/")[-1].startswith("listing train/: 3/3 class")
    assert plain_lines(err, "checking train/ images")[-1].startswith("checking train/ images: 6/6 img")
    # On a terminal: a tqdm bar, which a scan shorter than PROGRESS_DELAY_S never shows.
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    folder_module.scan_split(folder / "train", progress=True)
    assert terminal.getvalue() == ""
    monkeypatch.setattr(folder_module, "PROGRESS_DELAY_S", 0.0)
    folder_module.scan_split(folder / "train", progress=True)
    assert "\r" in terminal.getvalue() and "listing train/" in terminal.getvalue()
    # Not asked for (another rank than the first): nothing anywhere.
    quiet = Terminal()
    monkeypatch.setattr("sys.stderr", quiet)
    folder_module.scan_split(folder / "train", progress=False)
    assert quiet.getvalue() == ""
