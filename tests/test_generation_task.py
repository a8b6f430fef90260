"""Generation on the shared loop: train a tiny WF-DiT, sample, evaluate; exact resume with the EMA (from
Python, and ``gen train --output RUN --resume auto`` alone on an ImageFolder run); the recipes and the
first line that names them; the Python API resolving the command line's config; checkpoints of the
legacy format; latent space through a tiny AutoencoderKL; one-line errors
of ``weightformer gen``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest_train import assert_same_weights, weights
from PIL import Image

from weightformer.cli import main as weightformer_main
from weightformer.engine import prepare_config, train
from weightformer.engine.cli import build_parser, train_overrides
from weightformer.engine.distributed import DistInfo
from weightformer.engine.metrics import read_metrics
from weightformer.generation import recipes
from weightformer.generation.config import GenerationConfig
from weightformer.generation.pipeline import evaluate_samples, generate, load_generator, reference_images
from weightformer.generation.task import GenerationTask

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = {"hidden_size": 32, "depth": 2}
TINY_FLAGS = ["--model-kwargs", "hidden_size=32", "depth=2"]
# What a checkpoint of the legacy format holds in its config beside GenerationConfig's fields: the
# other tasks' settings (their values in a gen run).
OLD_CONFIG_FIELDS = {
    "smoothing": 0.1, "mixup": 0.8, "cutmix": 1.0, "auto_augment": "rand-m9-mstd0.5-inc1", "reprob": 0.25,
    "color_jitter": 0.4, "train_scale": [0.08, 1.0], "interpolation": "bicubic", "crop_pct": 0.875, "crop_mode": None,
    "num_classes": None, "reduce_zero_label": True, "cascade": False, "seg_inference": "whole", "seg_crop": 512,
    "seg_stride": 341, "det_resize": "lsj", "det_max_size": 1333,
}


def gen(*argv: str) -> int:
    """``weightformer gen ARGV``, through the root dispatcher."""
    return weightformer_main(["gen", *argv])


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
    """A tiny run with DiT's learned sigma (hybrid loss), which the small-data recipe turns off."""
    config = dict(data=str(data), output=str(output), model="wf_dit_s_4", model_kwargs={**TINY, "learn_sigma": True},
                  img_size=16,
                  batch_size=4, epochs=2, warmup_epochs=0, lr=4e-3, min_lr=4e-4, weight_decay=0.0, workers=0,
                  device="cpu", deterministic=True, ema=True, ema_decay=0.9, log_interval=1000, hflip=0.5)
    config.update(overrides)
    return config


def _one_error_line(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:"), err
    return err[0]


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


def test_resume_auto_alone_continues_an_image_folder_run_with_its_own_settings(
        folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture):
    """The first run's first line names the small-data recipe and the counts; ``--output RUN --resume auto``
    alone then takes the run's own data, image size and model kwargs (not mnist's) and ends where an
    uninterrupted run ends."""
    parts, whole = tmp_path / "parts", tmp_path / "whole"
    first = ["--data", str(folder), *TINY_FLAGS, "--epochs", "2", "--device", "cpu", "--deterministic"]
    assert gen("train", "--output", str(parts), *first, "--max-steps", "1") == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("recipe small-data:") and f"{folder / 'train'} holds 16 images" in line, line
    assert "16 px for its 16 px images" in line
    assert gen("train", "--output", str(parts), "--resume", "auto") == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("recipe resumed:")
    assert gen("train", "--output", str(whole), *first) == 0
    resumed = torch.load(parts / "last.pt", weights_only=True)
    assert resumed["global_step"] == 2
    config = resumed["config"]
    assert config["data"] == str(folder) and config["img_size"] == 16 and config["workers"] == 0
    assert config["model_kwargs"] == {**TINY, "learn_sigma": False}
    assert resumed["meta"]["input_size"] == 16 and resumed["meta"]["in_channels"] == 3
    for key in ("model", "ema"):
        assert_same_weights(weights(parts / "last.pt", key), weights(whole / "last.pt", key))


def test_the_python_api_resolves_the_config_of_the_command_line(folder: Path, tmp_path: Path):
    flags = ["--data", str(folder), "--output", str(tmp_path / "run"), "--model", "dit_s_8", *TINY_FLAGS,
             "--img-size", "24", "--min-snr-gamma", "5", "--vae", str(tmp_path / "vae"), "--hflip", "0.25",
             "--epochs", "3", "--batch-size", "8", "--set", "no_aug=true"]
    args = build_parser(GenerationTask).parse_args(["train", *flags])
    from_cli = prepare_config(train_overrides(args, GenerationTask), task=GenerationTask).cfg
    from_python = prepare_config(dict(
        data=str(folder), output=str(tmp_path / "run"), model="dit_s_8", model_kwargs=dict(TINY), img_size=24,
        min_snr_gamma=5, vae=str(tmp_path / "vae"), hflip=0.25, epochs=3, batch_size=8, no_aug=True,
    ), task=GenerationTask).cfg
    assert isinstance(from_cli, GenerationConfig) and from_cli == from_python
    assert (from_cli.min_snr_gamma, from_cli.vae, from_cli.no_aug) == (5.0, str(tmp_path / "vae"), True)
    assert from_cli.model_kwargs == TINY  # another model than the recipe's: its kwargs are not merged in
    assert from_cli.lr == recipes.recipe("small-data.yaml").values["lr"]  # the rest is the small-data recipe's
    plain = build_parser(GenerationTask).parse_args(["train"])
    assert prepare_config(train_overrides(plain, GenerationTask), task=GenerationTask).cfg == \
        prepare_config({}, task=GenerationTask).cfg


def test_recipes_offline_for_mnist_small_data_for_a_small_folder_dit_from_real_size(
        folder: Path, monkeypatch: pytest.MonkeyPatch):
    offline = GenerationTask.choose_recipe("mnist", {})
    assert offline.recipe.name == "offline" and "bundled" in offline.reason
    cfg = prepare_config({}, task=GenerationTask).cfg
    assert (cfg.data, cfg.model, cfg.img_size, cfg.epochs, cfg.min_snr_gamma) == ("mnist", "wf_dit_s_4", 28, 13, 1.0)
    small = GenerationTask.choose_recipe(str(folder), {})
    assert small.recipe.name == "small-data" and "holds 16 images, fewer than the 100000" in small.reason
    assert (small.recipe.values["img_size"], small.recipe.values["hflip"]) == (16, 0.5)
    # 16 images at a batch capped to 16: one step an epoch, so the most epochs (500, not 3,250)
    assert (small.recipe.values["epochs"], small.recipe.values["workers"]) == (recipes.SMALL_EPOCHS[1], 0)
    # the epochs that give the offline job's 3,250 steps: 1,000 images at batch 32 take 31 steps an epoch
    for images, batch, epochs, workers in ((1_000, 32, 105, 0), (8_000, 32, 13, 4), (8_000, 64, 26, 4)):
        recipe, reason = recipes.small_data_recipe(folder / "train", images, {"batch_size": batch})
        assert (recipe.values["epochs"], recipe.values["workers"]) == (epochs, workers)
        assert f"{epochs} epochs of {images // batch} steps at batch {batch}" in reason
    monkeypatch.setattr(recipes, "FULL_SCALE_IMAGES", 16)
    dit = GenerationTask.choose_recipe(str(folder), {})
    assert dit.recipe.name == "dit" and "holds 16 images, at least the 16" in dit.reason and "--init" in dit.reason


def test_no_aug_turns_the_flips_off(folder: Path, tmp_path: Path):
    cfg = prepare_config(_config(folder, tmp_path / "run", no_aug=True), task=GenerationTask).cfg
    assert cfg.hflip == 0.5
    info = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), owns_process_group=False)
    assert GenerationTask(cfg).build_data(info).train_set.hflip == 0.0


def _help(capsys: pytest.CaptureFixture, *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        gen(*argv, "--help")
    assert exit_info.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_help_speaks_of_generation(capsys: pytest.CaptureFixture):
    text = _help(capsys, "train")
    assert "configs/imagenet_weightformer_t.yaml" not in text and "any timm model name" not in text
    assert "Train a generation model" in text and "wf_dit_{s,b,l,xl}_{2,4,8}" in text and "--min-snr-gamma" in text
    assert "recipe" in text and "offline MNIST job" in text and "small-data" in text
    assert "Class-conditional diffusion with WeightFormer-DiT" in _help(capsys)
    assert "--no-ema" in _help(capsys, "sample") and "--inception" in _help(capsys, "eval")


def test_train_sample_evaluate_end_to_end(folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture):
    run = tmp_path / "run"
    assert gen("train", "--data", str(folder), "--output", str(run), "--model", "wf_dit_s_4", *TINY_FLAGS,
               "--img-size", "16", "--batch-size", "4", "--epochs", "1", "--workers", "0", "--device", "cpu") == 0
    out = tmp_path / "samples"
    args = ["sample", "--checkpoint", str(run / "last.pt"), "--out", str(out), "--num-per-class", "2", "--steps", "4",
            "--cfg-scale", "1.5", "--seed", "7", "--device", "cpu"]
    assert gen(*args) == 0
    with np.load(out / "samples.npz") as f:
        images, labels = f["images"], f["labels"]
    assert images.shape == (4, 16, 16, 3) and images.dtype == np.uint8
    assert labels.tolist() == [0, 0, 1, 1] and labels.dtype == np.int64
    assert Image.open(out / "grid.png").size[0] > 16
    capsys.readouterr()
    assert gen(*args) == 2 and "already holds" in _one_error_line(capsys)  # no silent overwrite
    assert gen(*args, "--overwrite") == 0
    with np.load(out / "samples.npz") as f:
        assert np.array_equal(f["images"], images)  # the same seed, the same samples
    capsys.readouterr()
    assert gen("eval", str(out), "--checkpoint", str(run / "last.pt"), "--json", str(tmp_path / "scores.json")) == 0
    printed = capsys.readouterr().out
    assert "Inception weights are not on this machine" in printed and "NOT comparable to published FID" in printed
    assert (tmp_path / "scores.json").is_file()


def test_checkpoints_of_the_previous_format_sample_evaluate_and_resume(folder: Path, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture):
    """A run folder of the legacy format: its config also holds the other tasks'
    settings. ``gen sample`` (last.pt and best.pt), ``gen eval`` and ``--resume auto`` take it."""
    run = tmp_path / "run"
    train(_config(folder, run, epochs=2, max_steps=1), task=GenerationTask)
    for name in ("last.pt", "best.pt"):
        if (run / name).is_file():
            ckpt = torch.load(run / name, weights_only=True)
            torch.save({**ckpt, "config": {**ckpt["config"], **OLD_CONFIG_FIELDS}}, run / name)
    assert torch.load(run / "last.pt", weights_only=True)["config"]["det_resize"] == "lsj"
    out = tmp_path / "samples"
    assert gen("sample", "--checkpoint", str(run / "last.pt"), "--out", str(out), "--num-per-class", "1",
               "--steps", "2", "--device", "cpu") == 0
    assert gen("eval", str(out), "--checkpoint", str(run / "last.pt")) == 0
    assert gen("train", "--output", str(run), "--resume", "auto") == 0
    assert torch.load(run / "last.pt", weights_only=True)["global_step"] == 8  # 2 epochs of 4 steps
    assert gen("sample", "--checkpoint", str(run / "best.pt"), "--out", str(out), "--num-per-class", "1",
               "--steps", "2", "--device", "cpu", "--no-ema", "--overwrite") == 0


def test_other_checkpoints_given_to_gen_sample_are_one_error_line(folder: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture):
    sample = ["sample", "--out", str(tmp_path / "s"), "--steps", "2", "--device", "cpu", "--checkpoint"]
    classifier = tmp_path / "classifier.pt"
    torch.save({"model": {"head.weight": torch.zeros(10, 8)},
                "meta": {"task": "classification", "model": "weightformer_tiny", "model_kwargs": {}}}, classifier)
    assert gen(*sample, str(classifier)) == 2
    line = _one_error_line(capsys)
    assert "is a classification checkpoint, not a generation one" in line and "weightformer eval" in line
    bare = tmp_path / "bare.pt"
    torch.save({"x_embedder.proj.weight": torch.zeros(4, 3, 4, 4)}, bare)
    assert gen(*sample, str(bare), "--no-ema") == 2
    assert "without the description of a generation model" in _one_error_line(capsys)
    no_ema = tmp_path / "no_ema"
    train(_config(folder, no_ema, ema=False, max_steps=1), task=GenerationTask)
    capsys.readouterr()
    # A run without EMA samples with its raw weights (the EMA is taken only where there is one), with or
    # without --no-ema, and the two give the same samples.
    assert gen(*sample[:2], str(tmp_path / "a"), *sample[3:], str(no_ema / "last.pt")) == 0
    assert gen(*sample[:2], str(tmp_path / "b"), *sample[3:], str(no_ema / "last.pt"), "--no-ema") == 0
    assert (np.load(tmp_path / "a" / "samples.npz")["images"] == np.load(tmp_path / "b" / "samples.npz")["images"]).all()


def test_init_from_weights_without_meta_fills_the_model_when_they_fit(folder: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture):
    """--init takes a bare state dict (as the authors' DiT checkpoints are) through the engine's reader."""
    run = tmp_path / "run"
    train(_config(folder, run, epochs=1, max_steps=1), task=GenerationTask)
    bare = tmp_path / "bare.pt"
    torch.save(weights(run / "last.pt", "model"), bare)
    new_run = ["train", "--data", str(folder), "--device", "cpu", "--max-steps", "1", "--model-kwargs",
               "learn_sigma=true", *TINY_FLAGS[1:], "--init", str(bare)]
    assert gen(*new_run, "--output", str(tmp_path / "a")) == 0
    wider = tmp_path / "wider.pt"
    torch.save(GenerationTask.model_from_meta({**torch.load(run / "last.pt", weights_only=True)["meta"],
                                               "model_kwargs": {"hidden_size": 48, "depth": 2}}).state_dict(), wider)
    capsys.readouterr()
    assert gen(*new_run[:-1], str(wider), "--output", str(tmp_path / "b")) == 2
    assert "wider.pt does not fit the model (WeightFormerDiT)" in _one_error_line(capsys)


def test_ddim_and_guidance_and_class_accuracy(folder: Path, tmp_path: Path):
    run = tmp_path / "run"
    train(_config(folder, run, epochs=1), task=GenerationTask)
    loaded = load_generator(str(run / "last.pt"))
    assert loaded.task is GenerationTask and loaded.meta["num_classes"] == 2
    a = generate(loaded, 1, [1], steps=3, sampler="ddim", cfg_scale=4.0, seed=1, progress=False)
    b = generate(loaded, 1, [1], steps=3, sampler="ddim", cfg_scale=4.0, seed=1, progress=False)
    c = generate(loaded, 1, [1], steps=3, sampler="ddim", cfg_scale=4.0, seed=2, progress=False)
    assert np.array_equal(a[0], b[0]) and not np.array_equal(a[0], c[0])
    # a perfect generator: the real held-out images, labelled, judged against themselves
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
    loaded = load_generator(str(run / "last.pt"))
    meta = loaded.meta
    assert meta["latent"]["scale_factor"] == 0.3 and (meta["input_size"], meta["in_channels"]) == (8, 4)
    images, _ = generate(loaded, 1, steps=2, cfg_scale=1.5, progress=False)
    assert images.shape == (2, 16, 16, 3)
    cached = list((tmp_path.parent / "cache" / "weightformer" / "latents").glob("*.safetensors"))
    assert len(cached) >= 2  # train and val latents, reused by the next run with this VAE


@pytest.mark.parametrize("case, message", [
    ("class", "unknown: this model knows classes 0 to 1"),
    ("cfg", "--cfg-scale must be at least 1"),
    ("batch", "--batch-size must be at least 1"),
    ("vae", "no AutoencoderKL there"),
    ("size", "has input_size 16 and this run 32"),
    ("model", "model 'wf_dit_s_3' is not a diffusion model; choose one of wf_dit_s_2, "),
    ("gamma", "min_snr_gamma must be a positive SNR cap"),
])
def test_bad_input_is_one_error_line(folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture, case: str,
                                     message: str):
    run = tmp_path / "run"
    train(_config(folder, run, epochs=1, max_steps=1), task=GenerationTask)
    capsys.readouterr()
    sample = ["sample", "--checkpoint", str(run / "last.pt"), "--out", str(tmp_path / "s"), "--steps", "2",
              "--device", "cpu"]
    new_run = ["train", "--data", str(folder), "--output", str(tmp_path / "r"), "--device", "cpu"]
    argv = {
        "class": [*sample, "--classes", "5"],
        "cfg": [*sample, "--cfg-scale", "0.5"],
        "batch": [*sample, "--batch-size", "0"],
        "vae": [*new_run, "--vae", str(tmp_path / "missing"), "--img-size", "16"],
        "size": [*new_run, "--img-size", "32", "--init", str(run / "last.pt"), *TINY_FLAGS],
        "model": [*new_run, "--model", "wf_dit_s_3"],
        "gamma": [*new_run, "--min-snr-gamma", "0"],
    }[case]
    assert gen(*argv) == 2
    assert message in _one_error_line(capsys)


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


class _SlowClock:
    """``time`` for weightformer.progress: each reading ``step`` seconds after the last."""

    def __init__(self, step: float):
        self.now, self.step = 0.0, step

    def perf_counter(self) -> float:
        self.now += self.step
        return self.now


def test_gen_sample_off_a_terminal_writes_a_few_plain_lines_not_carriage_returns(
        folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch):
    """capsys's stderr is no terminal, as a log file, a pipe or CI is. A 250-step sampler writes one line
    every 30 s there, even at one step a second, not a tqdm update per step."""
    import weightformer.progress as progress_module

    run = tmp_path / "run"
    train(_config(folder, run, epochs=1, max_steps=1), task=GenerationTask)
    sample = ["sample", "--checkpoint", str(run / "last.pt"), "--num-per-class", "1", "--steps", "250", "--device",
              "cpu"]
    capsys.readouterr()
    assert gen(*sample, "--out", str(tmp_path / "fast")) == 0  # at the real speed: well under 30 s, no line at all
    err = capsys.readouterr().err
    assert "\r" not in err and not [line for line in err.splitlines() if line.startswith("ddpm 250 steps")]
    monkeypatch.setattr(progress_module, "time", _SlowClock(1.0))
    assert gen(*sample, "--out", str(tmp_path / "slow")) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("ddpm 250 steps")]
    assert "\r" not in err and 5 <= len(lines) <= 10, err  # 250 s: every 30 s, and the last count
    assert lines[-1].startswith("ddpm 250 steps: 250/250 step")
