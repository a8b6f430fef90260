"""``weightformer gen``: ``train``, ``sample`` and ``eval`` for class-conditional diffusion.

``train`` runs :class:`~weightformer.generation.task.GenerationTask` in the shared loop with every run
flag of ``weightformer train``; without ``--data`` it trains on the bundled MNIST with the small-CPU
recipe :data:`~weightformer.generation.task.MNIST_DEFAULTS`, otherwise with DiT's. ``sample`` writes
``samples.npz`` and ``grid.png``; ``eval`` scores them. Errors and exit codes are those of
:mod:`weightformer.cli`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..cli import (
    add_train_arguments,
    exit_code,
    print_and_write_results,
    run_reporting_errors,
    train_overrides,
)
from ..data import BUILTIN_DATASETS
from ..engine import ConfigError, load_config_file, train
from ..engine.distributed import init_distributed
from ..engine.run_dir import check_writable_file, check_writable_folder
from .model import GUIDANCE_MODES
from .pipeline import evaluate_samples, generate, load_generator, save_samples
from .sampling import SAMPLERS
from .task import MNIST_DEFAULTS, PAPER_DEFAULTS, GenerationTask

__all__ = ["build_parser", "main"]

GUIDANCE_HELP = ("classifier-free guidance scale, at least 1 (1: none); DiT's: 1.5 for FID, 4.0 for pictures "
                 "(default: %(default)s)")


def _recipe_default(name: str) -> str:
    """``(default: X on mnist, Y otherwise)``: the offline recipe's value and DiT's."""
    mnist, paper = MNIST_DEFAULTS.get(name, "-"), PAPER_DEFAULTS.get(name, "-")
    return f"(default: {mnist} on mnist, {paper} otherwise)" if mnist != paper else f"(default: {mnist})"


def _add_train_arguments(p: argparse.ArgumentParser) -> None:
    add_train_arguments(p, data_help="mnist (bundled, the default) or an ImageFolder tree with train/ and val/",
                        default_help=_recipe_default)
    p.add_argument("--vae", default=argparse.SUPPRESS, metavar="PATH",
                   help="train in the latent space of the diffusers AutoencoderKL saved in this local folder "
                        "(e.g. stabilityai/sd-vae-ft-ema); latents are computed once and cached (default: pixel space)")
    p.add_argument("--min-snr-gamma", type=float, default=argparse.SUPPRESS, metavar="GAMMA",
                   help="weight the epsilon loss by min(SNR, GAMMA)/SNR, Min-SNR (arXiv 2303.09556), e.g. 1 or 5 "
                        f"{_recipe_default('min_snr_gamma').replace('None', 'off (uniform, as DiT)')}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="weightformer gen", description="Class-conditional diffusion with "
                                     "WeightFormer-DiT (or the attention DiT): train, sample, evaluate.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{train,sample,eval}")
    _add_train_arguments(sub.add_parser(
        "train", help="train a diffusion model (default: a small WF-DiT on the bundled MNIST)",
        description="Train WF-DiT or DiT with DiT's diffusion (linear betas, 1000 steps, learned sigma, hybrid "
                    "loss; --model-kwargs learn_sigma=False: fixed sigma, MSE loss). Without --data: the bundled "
                    "MNIST at 28 px (--img-size 32 pads it for patches 2 and 8), a small-CPU recipe (fixed sigma, Min-SNR loss weights with gamma 1) printed at the start. Models: wf_dit_{s,b,l,xl}_{2,4,8} and dit_{s,b,l,xl}_{2,4,8}."))
    sp = sub.add_parser("sample", help="draw class-conditional samples: OUT/samples.npz and OUT/grid.png",
                        description="Sample from a gen checkpoint (its EMA weights unless --no-ema).")
    sp.add_argument("--checkpoint", required=True, help="a last.pt or best.pt written by weightformer gen train")
    sp.add_argument("--out", required=True, help="output folder (must not hold samples.npz unless --overwrite)")
    sp.add_argument("--num-per-class", type=int, default=8, help="samples per class (default: %(default)s)")
    sp.add_argument("--classes", type=int, nargs="+", metavar="K", help="class labels to draw (default: all)")
    sp.add_argument("--cfg-scale", type=float, default=4.0, help=GUIDANCE_HELP)
    sp.add_argument("--guidance", choices=GUIDANCE_MODES, default="release",
                    help="release: guide the first 3 output channels as DiT and the authors do; standard: guide "
                         "all noise channels (default: %(default)s; see docs/generation.md)")
    sp.add_argument("--steps", type=int, default=250, help="sampling steps of the 1000 (default: %(default)s)")
    sp.add_argument("--sampler", choices=SAMPLERS, default="ddpm", help="default: %(default)s")
    sp.add_argument("--seed", type=int, default=0, help="a fixed seed gives the same samples (default: %(default)s)")
    sp.add_argument("--batch-size", type=int, default=64, help="default: %(default)s")
    sp.add_argument("--no-ema", action="store_true", help="use the raw weights instead of the EMA")
    sp.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto", help="default: %(default)s")
    sp.add_argument("--overwrite", action="store_true", help="replace OUT/samples.npz and OUT/grid.png")
    ev = sub.add_parser("eval", help="score samples: class accuracy and a feature distance; FID/IS/PR with "
                                     "local Inception weights",
                        description="Score OUT/samples.npz against the held-out images of the training data.")
    ev.add_argument("samples", help="a samples.npz written by weightformer gen sample (or its folder)")
    ev.add_argument("--checkpoint", help="the checkpoint that drew them (default: read --data/--image-size/--pad)")
    ev.add_argument("--data", default="mnist", help="reference data when no --checkpoint (default: %(default)s)")
    ev.add_argument("--inception", metavar="PATH", help="the Inception weights file (default: torch hub's cache)")
    ev.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    return parser


def _train_defaults(overrides: dict[str, Any], config_file: str | None) -> dict[str, Any]:
    data = overrides.get("data") or (load_config_file(config_file).get("data") if config_file else None)
    return dict(MNIST_DEFAULTS) if data in (None, "mnist") else dict(PAPER_DEFAULTS)


def _run_train(args: argparse.Namespace) -> int:
    overrides = train_overrides(args)
    config_file = getattr(args, "config_file", None)
    if "data" not in overrides and not config_file:
        overrides["data"] = "mnist"
    result = train(overrides, config_file=config_file, task=GenerationTask,
                   defaults=_train_defaults(overrides, config_file))
    return exit_code(result)


def _run_sample(args: argparse.Namespace) -> int:
    out = Path(args.out)
    check_writable_folder(out, "--out")
    existing = [p.name for p in (out / "samples.npz", out / "grid.png") if p.exists()]
    if existing and not args.overwrite:
        raise ConfigError(f"--out {out} already holds {', '.join(existing)}; pass another --out, or --overwrite")
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size must be at least 1, got {args.batch_size}")
    device = init_distributed(args.device).device
    model, meta = load_generator(args.checkpoint, use_ema=not args.no_ema, device=device)
    images, labels = generate(model, meta, args.num_per_class, args.classes, args.steps, args.sampler,
                              args.cfg_scale, args.guidance, args.seed, args.batch_size)
    save_samples(images, labels, out)
    print(f"{len(images)} samples of {len(set(labels.tolist()))} class(es) ({args.sampler}, {args.steps} steps, "
          f"cfg {args.cfg_scale:g}, seed {args.seed}) in {out / 'samples.npz'}; grid {out / 'grid.png'}")
    return 0


def _read_samples(path: Path) -> tuple[np.ndarray, np.ndarray]:
    path = path / "samples.npz" if path.is_dir() else path
    if not path.is_file():
        raise ConfigError(f"{path}: no such file; pass the samples.npz written by weightformer gen sample")
    try:
        with np.load(path, allow_pickle=False) as f:
            return f["images"], f["labels"]
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"{path} is not a samples.npz with images and labels ({exc})") from None


def _run_eval(args: argparse.Namespace) -> int:
    json_path = Path(args.json) if args.json else None
    if json_path is not None:
        check_writable_file(json_path, "--json")
    images, labels = _read_samples(Path(args.samples))
    if args.checkpoint:
        _, meta = load_generator(args.checkpoint)
        data, size, pad = meta["data"], meta["image_size"], meta["pad"]
    else:
        data = args.data
        spec = BUILTIN_DATASETS.get(data)
        size = images.shape[1] + (2 * ((32 - spec.img_size) // 2) if spec else 0)
        pad = (size - images.shape[1]) // 2
    result = evaluate_samples(images, labels, data, size, pad, args.inception)
    for note in result["notes"]:
        print(f"note: {note}")
    return print_and_write_results(result, json_path)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``weightformer gen``; returns the exit code."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    command = args.command
    del args.command
    run = {"train": _run_train, "sample": _run_sample, "eval": _run_eval}[command]
    return run_reporting_errors(lambda: run(args), hint_grad_checkpointing=command == "train")

