"""Classification on the command line: ``weightformer train|eval|predict`` (also ``weightformer cls ...``);
``eval`` and ``predict`` are thin layers over :func:`.evaluate.evaluate_checkpoint` and :func:`.predict.predict`."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..data.errors import DataError
from ..engine.cli import Command, TaskCLI, add_json_argument, json_path_argument, print_and_write_results
from ..engine.config import parse_model_kwargs
from ..engine.device import pick_device
from ..engine.errors import ConfigError

__all__ = ["CLI"]


def _add_model_source(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", help="a last.pt/best.pt from train (it names its model and data), the authors' "
                                        ".pth or .safetensors, or any state dict (with --model)")
    p.add_argument("--model", help="timm model name: with --pretrained, or for a checkpoint that does not name one")
    p.add_argument("--pretrained", action="store_true", help="use timm's pretrained weights for --model")
    p.add_argument("--model-kwargs", "--model-arg", dest="model_kwargs", nargs="+", action="extend",
                   metavar="KEY=VALUE", default=[], help="keyword arguments for timm.create_model, e.g. patch_size=4")
    p.add_argument("--ema", action="store_true", help="use the checkpoint's EMA weights")


def _add_eval_arguments(p: argparse.ArgumentParser) -> None:
    _add_model_source(p)
    p.add_argument("--data", help="ImageFolder with val/, tar shards in val/, a Hugging Face data set, or mnist "
                                  "(default: the data the checkpoint was trained on, with its val split)")
    p.add_argument("--img-size", type=int,
                   help="evaluation resolution (default: the checkpoint's, else the model's pretrained config)")
    p.add_argument("--batch-size", type=int, default=256, help="images per forward pass (default: 256)")
    p.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1),
                   help="data-loading processes (default: 4, at most the CPU count)")
    p.add_argument("--amp", choices=["none", "bf16", "fp16"], default="none", help="mixed precision (default: none)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                   help="auto: cuda if available (default: auto)")
    add_json_argument(p)


def _run_eval(args: argparse.Namespace) -> int:
    from .evaluate import evaluate_checkpoint, format_eval

    json_path = json_path_argument(args)
    result = evaluate_checkpoint(
        checkpoint=args.checkpoint, model=args.model, pretrained=args.pretrained, data=args.data,
        model_kwargs=parse_model_kwargs(args.model_kwargs, flag="--model-kwargs"), img_size=args.img_size,
        batch_size=args.batch_size, workers=args.workers, amp=args.amp, device=args.device, use_ema=args.ema,
    )
    print(format_eval(result))
    for path in result["skipped_files"][:5]:
        print(f"  left out (unreadable): {path}")
    return print_and_write_results(result, json_path)


def _add_predict_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="PATH", help="image files or folders of them")
    _add_model_source(p)
    p.add_argument("--top-k", type=int, default=5, help="classes shown per image (default: 5)")
    p.add_argument("--batch-size", type=int, default=32, help="images per forward pass (default: 32)")
    p.add_argument("--img-size", type=int, help="resolution (default: the checkpoint's, else the model's)")
    p.add_argument("--workers", type=int, default=0, help="image-decoding processes (default: 0, this one)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default: cpu)")
    p.add_argument("--amp", choices=["none", "bf16", "fp16"], default="none",
                   help="mixed precision: bf16 runs on CPUs and GPUs, fp16 needs a GPU (default: none)")
    p.add_argument("--out", help="also write the predictions to this .csv or .json file")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")


def _check_predict_arguments(args: argparse.Namespace) -> None:
    for flag, value, least in (("--top-k", args.top_k, 1), ("--batch-size", args.batch_size, 1),
                               ("--workers", args.workers, 0), ("--img-size", args.img_size or 1, 1)):
        if value < least:
            raise ConfigError(f"{flag} must be at least {least}, got {value}")
    if args.checkpoint and args.pretrained:
        raise ConfigError("--checkpoint and --pretrained both give weights; pass one of them")
    if args.checkpoint is None and not (args.model and args.pretrained):
        raise ConfigError("no model given; pass --checkpoint PATH, or --model NAME --pretrained")
    if args.out and Path(args.out).suffix.lower() not in (".csv", ".json"):
        raise ConfigError(f"--out {args.out} must end in .csv or .json")


def _run_predict(args: argparse.Namespace) -> int:
    from ..engine.weights import load_model
    from ..engine.outputs import check_output
    from ..data.images import image_paths
    from .predict import EXIT_SKIPPED, predict, write_predictions

    _check_predict_arguments(args)
    files = image_paths(args.paths)
    if args.out:  # before the work; never onto an input
        check_output(Path(args.out), args.overwrite, folder=False, inputs=[*files, args.checkpoint])
    device = pick_device(args.device)
    loaded = load_model(args.checkpoint, task="classification", model=args.model,
                        model_kwargs=parse_model_kwargs(args.model_kwargs, flag="--model-kwargs"),
                        use_ema=args.ema, pretrained=args.pretrained)
    result = predict(loaded, files, args.top_k, args.batch_size, args.img_size, args.workers, device,
                     args.amp)
    for file, top in result.rows:
        print(f"{file}: " + ", ".join(f"{name} {100 * p:.1f}%" for _, name, p in top))
    if not result.rows:
        raise DataError(f"none of the {len(files)} file(s) could be read as an image; pass image files")
    print(f"{len(result.rows)} image(s) in {result.seconds:.2f} s ({len(result.rows) / max(result.seconds, 1e-9):.1f} "
          f"img/s), model {loaded.meta['model']} from {loaded.source}", file=sys.stderr)
    if args.out:
        write_predictions(result, Path(args.out), overwrite=args.overwrite)
        print(f"wrote {args.out}", file=sys.stderr)
    if result.skipped:
        print(f"skipped {len(result.skipped)} unreadable file(s):", file=sys.stderr)
        for path in result.skipped:
            print(f"  {path}", file=sys.stderr)
        return EXIT_SKIPPED
    return 0


COMMANDS = (
    Command("eval", "top-1/top-5/loss/throughput of a checkpoint or pretrained model",
            "Evaluate a checkpoint or timm's pretrained weights: top-1, top-5, loss, img/s. Images are preprocessed "
            "as the checkpoint was trained, else as the model's pretrained config says.",
            _add_eval_arguments, _run_eval),
    Command("predict", "top-k labels of images or folders",
            "Top-k classes of images (files, or folders searched recursively), with class names. Exit code 0: all "
            "files read; 3: some were unreadable (listed, left out); 2: a usage error.",
            _add_predict_arguments, _run_predict),
)

CLI = TaskCLI(
    program="weightformer",  # weightformer train|eval|predict (weightformer cls ... is the same)
    description="Image classification: any timm model (default: WeightFormer) on an ImageFolder tree or a bundled set.",
    commands=COMMANDS,
    summary=lambda m: (f"top-1 {m['top1']:.2f}%, top-5 {m['top5']:.2f}% ({m['images']} images), "
                       f"val loss {m['loss']:.4f}"),
    score="top-1 {:.2f}%",
)
