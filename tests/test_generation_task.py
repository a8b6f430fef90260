"""Generation on the shared loop: train a tiny WF-DiT, sample, evaluate; exact resume with the EMA;
latent space through a tiny AutoencoderKL; one-line errors of ``weightformer gen``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest_train import assert_same_weights, weights
from PIL import Image

from weightformer.engine import train
from weightformer.engine.metrics import read_metrics
from weightformer.generation.cli import main
from weightformer.generation.pipeline import evaluate_samples, generate, load_generator
from weightformer.generation.task import GenerationTask

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = {"hidden_size": 32, "depth": 2}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ImageFolder tree of 16 px RGB images, 2 classes: dark squares (0) and bright ones (1)."""
    root = tmp_path_factory.mktemp("gen") / "data"
    rng = np.random.default_rng(0)
    for split, count in (("train", 8), ("val", 4)):
        for label in (0, 1):
            (root / split / f"c{label}").mkdir(parents=True)
            for i in range(count):
                base = 40 if label == 0 else 210
                pixels = np.clip(base + rng.normal(0, 20, (16, 16, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(root / split / f"c{label}" / f"{i}.png")
    return root


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "cache"))


def _config(data: Path, output: Path, **overrides) -> dict:
    config = dict(data=str(data), output=str(output), model="wf_dit_s_4", model_kwargs=dict(TINY), img_size=16,
                  batch_size=4, epochs=2, warmup_epochs=0, lr=4e-3, min_lr=4e-4, weight_decay=0.0, workers=0,
                  device="cpu", deterministic=True, ema=True, ema_decay=0.9, log_interval=1000, hflip=0.5)
    config.update(overrides)
    return config


def test_max_steps_then_resume_matches_uninterrupted(folder: Path, tmp_path: Path):
    """Stopped at 3 of 8 steps and resumed: the same weights, EMA, optimizer state and metrics (timesteps,
    noise, label dropout, flips and data order all come back)."""
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert train(_config(folder, whole), task=GenerationTask).global_step == 8
    assert train(_config(folder, parts, max_steps=3), task=GenerationTask).global_step == 3
    assert train({"output": str(parts), "resume": "auto"}, task=GenerationTask).global_step == 8
    for key in ("model", "ema"):
        assert_same_weights(weights(parts / "last.pt", key), weights(whole / "last.pt", key))
    ema, model = weights(whole / "last.pt", "ema"), weights(whole / "last.pt", "model")
    assert any(not torch.equal(v, model[k.removeprefix("module.")]) for k, v in ema.items())  # the EMA lags
    a = torch.load(parts / "last.pt", weights_only=True)["optimizer"]["state"]
    b = torch.load(whole / "last.pt", weights_only=True)["optimizer"]["state"]
    assert all(torch.equal(a[i]["exp_avg_sq"], b[i]["exp_avg_sq"]) for i in b)
    strip = lambda rs: [{k: v for k, v in r.items() if k != "img_per_s"} for r in rs]
    records = strip(read_metrics(whole / "metrics.jsonl"))
    assert strip(read_metrics(parts / "metrics.jsonl")) == records
    assert records[-1]["val_loss"] < records[0]["val_loss"] * 1.5 and "val_vb" in records[-1]


def test_train_sample_evaluate_end_to_end(folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture):
    run = tmp_path / "run"
    assert main(["train", "--data", str(folder), "--output", str(run), "--model", "wf_dit_s_4", "--model-kwargs",
                 "hidden_size=32", "depth=2", "--img-size", "16", "--batch-size", "4", "--epochs", "1",
                 "--workers", "0", "--device", "cpu"]) == 0
    out = tmp_path / "samples"
    args = ["sample", "--checkpoint", str(run / "last.pt"), "--out", str(out), "--num-per-class", "2", "--steps", "4",
            "--cfg-scale", "1.5", "--seed", "7", "--device", "cpu"]
    assert main(args) == 0
    with np.load(out / "samples.npz") as f:
        images, labels = f["images"], f["labels"]
    assert images.shape == (4, 16, 16, 3) and images.dtype == np.uint8
    assert labels.tolist() == [0, 0, 1, 1] and labels.dtype == np.int64
    assert Image.open(out / "grid.png").size[0] > 16
    assert main(args) == 2 and "already holds" in capsys.readouterr().err  # no silent overwrite
    assert main([*args, "--overwrite"]) == 0
    with np.load(out / "samples.npz") as f:
        assert np.array_equal(f["images"], images)  # the same seed, the same samples
    capsys.readouterr()
    assert main(["eval", str(out), "--checkpoint", str(run / "last.pt")]) == 0
    printed = capsys.readouterr().out
    assert "Inception weights are not on this machine" in printed and "NOT comparable to published FID" in printed


def test_ddim_and_guidance_and_class_accuracy(folder: Path, tmp_path: Path):
    run = tmp_path / "run"
    train(_config(folder, run, epochs=1), task=GenerationTask)
    model, meta = load_generator(str(run / "last.pt"))
    a = generate(model, meta, 1, [1], steps=3, sampler="ddim", cfg_scale=4.0, seed=1, progress=False)
    b = generate(model, meta, 1, [1], steps=3, sampler="ddim", cfg_scale=4.0, seed=1, progress=False)
    c = generate(model, meta, 1, [1], steps=3, sampler="ddim", cfg_scale=4.0, seed=2, progress=False)
    assert np.array_equal(a[0], b[0]) and not np.array_equal(a[0], c[0])
    # a perfect generator: the real held-out images, labelled, judged against themselves
    from weightformer.generation.pipeline import reference_images

    real, real_labels, _ = reference_images(str(folder), 16, 0)
    scores = evaluate_samples(real, real_labels, str(folder), 16, 0, progress=False)
    assert scores["class_accuracy"] == 1.0 and abs(scores["judge_fd"]) < 1e-4
    shuffled = evaluate_samples(real, 1 - real_labels, str(folder), 16, 0, progress=False)
    assert shuffled["class_accuracy"] == 0.0


def test_latent_space_through_a_local_autoencoder(folder: Path, tmp_path: Path):
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 8), layers_per_block=1,
                        latent_channels=4, norm_num_groups=4, sample_size=16, scaling_factor=0.3)
    vae.save_pretrained(tmp_path / "vae")
    run = tmp_path / "run"
    train(_config(folder, run, epochs=1, vae=str(tmp_path / "vae"), model_kwargs={**TINY}), task=GenerationTask)
    model, meta = load_generator(str(run / "last.pt"))
    assert meta["latent"]["scale_factor"] == 0.3 and (meta["input_size"], meta["in_channels"]) == (8, 4)
    images, _ = generate(model, meta, 1, steps=2, cfg_scale=1.5, progress=False)
    assert images.shape == (2, 16, 16, 3)
    cached = list((tmp_path.parent / "cache" / "weightformer" / "latents").glob("*.safetensors"))
    assert len(cached) >= 2  # train and val latents, reused by the next run with this VAE


@pytest.mark.parametrize("case, message", [
    ("class", "unknown: this model knows classes 0 to 1"),
    ("cfg", "--cfg-scale must be at least 1"),
    ("vae", "no AutoencoderKL there"),
    ("size", "has input_size 16 and this run 32"),
])
def test_bad_input_is_one_error_line(folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture, case: str,
                                     message: str):
    run = tmp_path / "run"
    train(_config(folder, run, epochs=1, max_steps=1), task=GenerationTask)
    capsys.readouterr()
    sample = ["sample", "--checkpoint", str(run / "last.pt"), "--out", str(tmp_path / "s"), "--steps", "2",
              "--device", "cpu"]
    argv = {
        "class": [*sample, "--classes", "5"],
        "cfg": [*sample, "--cfg-scale", "0.5"],
        "vae": ["train", "--data", str(folder), "--output", str(tmp_path / "v"), "--vae", str(tmp_path / "missing"),
                "--img-size", "16", "--device", "cpu"],
        "size": ["train", "--data", str(folder), "--output", str(tmp_path / "r"), "--img-size", "32", "--init",
                 str(run / "last.pt"), "--model-kwargs", "hidden_size=32", "depth=2", "--device", "cpu"],
    }[case]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and message in err[0], err


def test_frechet_distance_matches_sqrtm_and_the_closed_form_when_covariances_are_singular():
    import warnings

    from scipy import linalg

    from weightformer.generation.evaluation import frechet_distance

    rng = np.random.default_rng(0)
    a = rng.normal(size=(500, 8)) @ rng.normal(size=(8, 8))
    b = rng.normal(size=(400, 8)) @ rng.normal(size=(8, 8)) + 0.5
    cov_a, cov_b = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    reference = ((a.mean(0) - b.mean(0)) ** 2).sum() + np.trace(cov_a + cov_b - 2 * linalg.sqrtm(cov_a @ cov_b).real)
    assert frechet_distance(a, b) == pytest.approx(reference, rel=1e-9)
    # 20 samples in 64 dimensions: rank-19 covariances. Equal covariances leave only the mean term.
    few = rng.normal(size=(20, 64))
    shift = rng.normal(size=64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert frechet_distance(few, few + shift) == pytest.approx((shift ** 2).sum(), rel=1e-6)
        assert abs(frechet_distance(few, few)) < 1e-6 * np.trace(np.cov(few, rowvar=False))
