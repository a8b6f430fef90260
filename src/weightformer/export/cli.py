"""``weightformer export``: a checkpoint or timm's pretrained weights to the Hub layout, ONNX or ``.pt2``."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ..engine.cli import OneLineParser, run_reporting_errors
from ..engine.config import parse_model_kwargs
from ..engine.errors import ConfigError
from ..engine.outputs import check_output

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="weightformer export",
        description="Export a classifier: --format hf (timm's Hub layout: config.json, model.safetensors, README.md), "
                    "onnx (dynamic batch/height/width, checked in onnxruntime at three sizes) or pt2 "
                    "(torch.export with dynamic sizes; --aoti for an AOTInductor package).")
    p.add_argument("--checkpoint", help="a last.pt/best.pt from train (it names its model), the authors' .pth or "
                                        ".safetensors, or any state dict (with --model)")
    p.add_argument("--model", help="timm model name: with --pretrained, or for a --checkpoint that does not name "
                                   "its model")
    p.add_argument("--pretrained", action="store_true", help="export timm's pretrained weights of --model")
    p.add_argument("--model-kwargs", "--model-arg", dest="model_kwargs", nargs="+", action="extend", metavar="KEY=VALUE",
                   default=[], help="keyword arguments for timm.create_model, e.g. patch_size=4")
    p.add_argument("--ema", action="store_true", help="export the checkpoint's EMA weights")
    p.add_argument("--format", required=True, choices=["hf", "onnx", "pt2"], help="what to write")
    p.add_argument("--out", required=True, help="output folder (hf) or file (onnx, pt2)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out (moved aside to "
                                                            "<out>.previous-<time>, never deleted)")
    p.add_argument("--img-size", type=int, help="side of the example traced for onnx/pt2 (default: the "
                                                "checkpoint's training size, else the model's pretrained size)")
    p.add_argument("--opset", type=int, help="ONNX opset, one this torch.onnx writes (18 and up; default: the "
                                             "exporter's)")
    p.add_argument("--no-check", action="store_true", help="onnx: skip the onnxruntime check at three sizes")
    p.add_argument("--aoti", action="store_true", help="pt2: compile an AOTInductor package (slow to build)")
    p.add_argument("--push-to-hub", metavar="ORG/NAME", help="hf: also upload the folder to this Hub repository")
    p.add_argument("--private", action="store_true", help="with --push-to-hub: create the repository private")
    return p


def _check_arguments(args: argparse.Namespace) -> None:
    if args.checkpoint and args.pretrained:
        raise ConfigError("--checkpoint and --pretrained both give weights; pass one of them")
    if not args.checkpoint and not (args.model and args.pretrained):
        raise ConfigError("no weights to export; pass --checkpoint PATH, or --model NAME --pretrained")
    if args.push_to_hub and args.format != "hf":
        raise ConfigError("--push-to-hub uploads the Hub layout; use it with --format hf")
    if args.aoti and args.format != "pt2":
        raise ConfigError("--aoti builds a .pt2 package; use it with --format pt2")
    if args.img_size is not None and args.img_size < 1:
        raise ConfigError(f"--img-size must be a positive number of pixels, got {args.img_size}")
    if args.opset is not None and args.format != "onnx":
        raise ConfigError("--opset is the ONNX opset; use it with --format onnx")
    if args.no_check and args.format != "onnx":
        raise ConfigError("--no-check skips the onnxruntime check of an ONNX file; use it with --format onnx")
    if args.img_size is not None and args.format == "hf":
        raise ConfigError("--img-size is the side of the example that onnx and pt2 trace; the hf format traces "
                          "nothing (its config.json records the training size), so drop it")
    if args.format == "onnx":
        from .onnx import check_opset

        check_opset(args.opset)
    check_output(Path(args.out), args.overwrite, folder=args.format == "hf", inputs=[args.checkpoint])  # before the work


def _run(args: argparse.Namespace) -> int:
    from ..engine.weights import load_model
    from .hub import push_to_hub, to_hf
    from .onnx import to_onnx
    from .pt2 import to_pt2
    from .source import run_summary, trained_size

    _check_arguments(args)
    loaded = load_model(args.checkpoint, task="classification", model=args.model,
                        model_kwargs=parse_model_kwargs(args.model_kwargs, flag="--model-kwargs"), use_ema=args.ema,
                        pretrained=args.pretrained)
    model, meta, out = loaded.model, loaded.meta, Path(args.out)
    size = args.img_size or trained_size(loaded)
    start = time.perf_counter()
    if args.format == "hf":
        command = shlex.join(["weightformer", "export", *sys.argv[2:]]) if sys.argv[1:2] == ["export"] else None
        to_hf(model, out, meta, run_summary(loaded), command=command, repo_id=args.push_to_hub,
              overwrite=args.overwrite)
        print(f"wrote {out}/ (config.json, model.safetensors, README.md); load it, after import weightformer, with "
              f"timm.create_model('local-dir:{out}', pretrained=True) or transformers' "
              f"AutoModelForImageClassification.from_pretrained('{out}')")
        if args.push_to_hub:
            url = push_to_hub(out, args.push_to_hub, private=args.private)
            print(f"uploaded to https://huggingface.co/{args.push_to_hub} ({url})")
    elif args.format == "onnx":
        diffs = to_onnx(model, out, meta["in_chans"], size, opset=args.opset, overwrite=args.overwrite,
                        check=not args.no_check)
        checked = ", ".join(f"{k} {v:.1e}" for k, v in diffs.items())
        print(f"wrote {out} in {time.perf_counter() - start:.0f} s: input 'images' (batch, {meta['in_chans']}, "
              f"height, width), all dynamic" + (f"; onnxruntime vs PyTorch max |diff|: {checked}" if diffs else ""))
    else:
        to_pt2(model, out, meta["in_chans"], size, aoti=args.aoti, overwrite=args.overwrite)
        loader = "torch._inductor.aoti_load_package" if args.aoti else "torch.export.load(path).module()"
        print(f"wrote {out} in {time.perf_counter() - start:.0f} s (dynamic batch, height, width); run it with {loader}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    return run_reporting_errors(lambda: _run(args))
