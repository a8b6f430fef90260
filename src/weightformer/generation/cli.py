"""``weightformer gen sample|eval``: thin layers over :func:`.pipeline.generate` and ``evaluate_samples_file``."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..engine.cli import Command, TaskCLI, add_json_argument, finite_float, json_path_argument, print_and_write_results
from ..engine.device import pick_device
from ..engine.outputs import claim_outputs
from ..engine.run_dir import check_writable_folder
from .config import GUIDANCE_MODES, SAMPLERS

__all__ = ["CLI"]

GUIDANCE_HELP = ("classifier-free guidance scale, at least 1 (1: none); DiT's: 1.5 for FID, 4.0 for pictures "
                 "(default: %(default)s)")


def _add_sample_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="a last.pt or best.pt written by weightformer gen train")
    p.add_argument("--out", required=True, help="output folder (must not hold samples.npz unless --overwrite)")
    p.add_argument("--num-per-class", type=int, default=8, help="samples per class (default: %(default)s)")
    p.add_argument("--classes", type=int, nargs="+", metavar="K", help="class labels to draw (default: all)")
    p.add_argument("--cfg-scale", type=finite_float, default=4.0, help=GUIDANCE_HELP)
    p.add_argument("--guidance", choices=GUIDANCE_MODES, default="release",
                   help="release: guide the first 3 output channels as DiT and the authors do; standard: guide "
                        "all noise channels (default: %(default)s; see docs/generation.md)")
    p.add_argument("--steps", type=int, default=250, help="sampling steps of the 1000 (default: %(default)s)")
    p.add_argument("--sampler", choices=SAMPLERS, default="ddpm", help="default: %(default)s")
    p.add_argument("--seed", type=int, default=0, help="a fixed seed gives the same samples (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=64, help="samples per forward pass (default: %(default)s)")
    p.add_argument("--no-ema", action="store_true", help="use the raw weights instead of the EMA")
    p.add_argument("--device", default="auto", help="auto, cuda, cuda:N or cpu (default: auto: cuda if available)")
    p.add_argument("--overwrite", action="store_true",
                   help="move an earlier OUT/samples.npz and OUT/grid.png aside (<name>.previous-<time>) and write anew")


def _run_sample(args: argparse.Namespace) -> int:
    from .pipeline import generate, load_generator, save_samples

    out = Path(args.out)
    check_writable_folder(out, "--out")
    claim_outputs([out / "samples.npz", out / "grid.png"], args.overwrite, "weightformer gen sample",
                  inputs=[args.checkpoint])
    loaded = load_generator(args.checkpoint, use_ema=False if args.no_ema else None, device=pick_device(args.device))
    images, labels = generate(loaded, args.num_per_class, args.classes, args.steps, args.sampler, args.cfg_scale,
                              args.guidance, args.seed, args.batch_size)
    save_samples(images, labels, out)
    print(f"{len(images)} samples of {len(set(labels.tolist()))} class(es) ({args.sampler}, {args.steps} steps, "
          f"cfg {args.cfg_scale:g}, seed {args.seed}) in {out / 'samples.npz'}; grid {out / 'grid.png'}")
    return 0


def _add_eval_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("samples", help="a samples.npz written by weightformer gen sample (or its folder)")
    p.add_argument("--checkpoint", help="the checkpoint that drew them: its data and image geometry are used "
                                        "(default: --data at the samples' size)")
    p.add_argument("--data", default="mnist", help="reference data when no --checkpoint (default: %(default)s)")
    p.add_argument("--inception", metavar="PATH", help="the Inception weights file (default: torch hub's cache)")
    add_json_argument(p)


def _run_eval(args: argparse.Namespace) -> int:
    from .pipeline import evaluate_samples_file

    json_path = json_path_argument(args)
    result = evaluate_samples_file(Path(args.samples), args.checkpoint, args.data, args.inception)
    for note in result["notes"]:
        print(f"note: {note}")
    return print_and_write_results(result, json_path)


COMMANDS = (
    Command("sample", "draw class-conditional samples: OUT/samples.npz and OUT/grid.png",
            "Sample from a gen checkpoint (its EMA weights unless --no-ema) with DDPM or DDIM and classifier-free "
            "guidance.", _add_sample_arguments, _run_sample),
    Command("eval", "score samples: class accuracy and a feature distance; FID/IS/PR with local Inception weights",
            "Score OUT/samples.npz against the held-out images of the training data.",
            _add_eval_arguments, _run_eval),
)

CLI = TaskCLI(
    program="weightformer gen",
    description=("Class-conditional diffusion with WeightFormer-DiT (or the attention DiT) on the bundled MNIST "
                 "or an ImageFolder tree: train, sample, evaluate."),
    commands=COMMANDS,
    summary=lambda m: (f"val loss {m['loss']:.4f} (mse {m['mse']:.4f} + vb {m['vb']:.4f}, "
                       f"{m['images']} images)"),
    score="val loss {:.4f}",
    # sampling comes first: gen eval scores a folder of samples
    next_step=lambda checkpoint: f"sample --checkpoint {checkpoint} --out {Path(checkpoint).parent / 'samples'}",
)
