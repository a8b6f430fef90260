"""The ``weightformer`` command: ``train``, ``eval`` and ``bench``.

A thin layer over :func:`weightformer.engine.train` and
:func:`weightformer.engine.evaluate_checkpoint`. Exit codes: 0 done, 2 a user error (printed as
one ``error:`` line), 130 / 143 a run stopped by SIGINT / SIGTERM after saving its checkpoint,
1 the bench subcommand could not be loaded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from typing import Any, Optional, Sequence

__all__ = ["build_parser", "main"]

SIGNAL_EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143}


def _add_train_arguments(p: argparse.ArgumentParser) -> None:
    # Every default is SUPPRESS: only flags the user gives override the config file and data-set defaults.
    S = argparse.SUPPRESS
    p.add_argument("--config", dest="config_file", metavar="FILE.yaml", default=S,
                   help="YAML file of settings (e.g. configs/imagenet_weightformer_t.yaml); flags override it")
    p.add_argument("--data", default=S, help="ImageFolder tree with train/ and val/, or a built-in data set (default: mnist)")
    p.add_argument("--model", default=S, help="any timm model name (default: weightformer_tiny)")
    p.add_argument("--model-kwargs", nargs="+", metavar="KEY=VALUE", default=[],
                   help="keyword arguments for timm.create_model, e.g. patch_size=4 drop_path_rate=0.1")
    p.add_argument("--model-arg", action="append", metavar="KEY=VALUE", default=[],
                   help="one model keyword argument; repeat for more")
    p.add_argument("--epochs", type=int, default=S)
    p.add_argument("--max-steps", type=int, default=S, help="stop after this many optimizer steps (smoke tests)")
    p.add_argument("--batch-size", type=int, default=S, help="per process")
    p.add_argument("--img-size", type=int, default=S)
    p.add_argument("--lr", type=float, default=S, help="learning rate for a total batch of 512, scaled linearly")
    p.add_argument("--warmup-epochs", type=int, default=S)
    p.add_argument("--output", default=S, help="run folder (default: runs/<data>_<model>)")
    p.add_argument("--resume", default=S, metavar="{auto,PATH}", help="auto: continue from last.pt in --output")
    p.add_argument("--seed", type=int, default=S)
    p.add_argument("--deterministic", action="store_true", default=S,
                   help="deterministic algorithms; on CPU a resumed run then equals an uninterrupted one exactly")
    p.add_argument("--workers", type=int, default=S, help="data-loading processes per training process")
    p.add_argument("--amp", choices=["none", "bf16", "fp16"], default=S)
    p.add_argument("--compile", action="store_true", default=S, help="torch.compile the model")
    p.add_argument("--ema", action="store_true", default=S, help="keep an EMA of the weights")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default=S)
    p.add_argument("--log-interval", type=int, default=S, help="steps between log lines when not on a terminal")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                   help="any other setting, e.g. --set mixup=0 --set auto_augment=null")


def _add_eval_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", help="a last.pt/best.pt from train (it names its model and data), or a state dict")
    p.add_argument("--model", help="timm model name: with --pretrained, or for a checkpoint that does not name one")
    p.add_argument("--pretrained", action="store_true", help="evaluate timm's pretrained weights for --model")
    p.add_argument("--data", help="data set (default: the one the checkpoint was trained on)")
    p.add_argument("--model-kwargs", nargs="+", metavar="KEY=VALUE", default=[])
    p.add_argument("--img-size", type=int)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1),
                   help="data-loading processes (default: 4, at most the CPU count)")
    p.add_argument("--amp", choices=["none", "bf16", "fp16"], default="none")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--ema", action="store_true", help="evaluate the checkpoint's EMA weights")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``weightformer`` (``bench`` options are parsed by the bench module)."""
    parser = argparse.ArgumentParser(prog="weightformer", description="Train, evaluate and benchmark WeightFormer.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{train,eval,bench}")
    _add_train_arguments(sub.add_parser("train", help="train a model (default: WeightFormer on the bundled MNIST)"))
    _add_eval_arguments(sub.add_parser("eval", help="top-1/top-5/loss/throughput of a checkpoint or pretrained model"))
    sub.add_parser("bench", help="speed and memory benchmarks (weightformer bench --help)", add_help=False)
    return parser


def _train_overrides(args: argparse.Namespace) -> dict[str, Any]:
    from .engine import parse_model_kwargs

    values = {k: v for k, v in vars(args).items() if k not in ("command", "config_file", "model_kwargs", "model_arg", "set")}
    values.update(parse_model_kwargs(args.set))
    model_kwargs = parse_model_kwargs(args.model_kwargs + args.model_arg)
    if model_kwargs:
        values["model_kwargs"] = {**values.get("model_kwargs", {}), **model_kwargs}
    return values


def _run_train(args: argparse.Namespace) -> int:
    from .engine import train

    result = train(_train_overrides(args), config_file=getattr(args, "config_file", None))
    return SIGNAL_EXIT_CODES.get(result.stopped_by, 130) if result.stopped_by else 0


def _run_eval(args: argparse.Namespace) -> int:
    from .engine import evaluate_checkpoint, format_eval, parse_model_kwargs

    result = evaluate_checkpoint(
        checkpoint=args.checkpoint, model=args.model, pretrained=args.pretrained, data=args.data,
        model_kwargs=parse_model_kwargs(args.model_kwargs), img_size=args.img_size, batch_size=args.batch_size,
        workers=args.workers, amp=args.amp, device=args.device, use_ema=args.ema, json_path=args.json,
    )
    print(format_eval(result))
    print(json.dumps(result))
    return 0


def _run_bench(argv: Sequence[str]) -> int:
    try:
        from .bench import cli as bench_cli
    except Exception as exc:  # a missing or broken bench module must not take train/eval down with it
        print(f"error: the bench subcommand is unavailable ({type(exc).__name__}: {exc})", file=sys.stderr)
        return 1
    parser = argparse.ArgumentParser(prog="weightformer bench", description="Speed and memory benchmarks.")
    bench_cli.add_arguments(parser)
    return int(bench_cli.run(parser.parse_args(list(argv))) or 0)


def _format_warning(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> str:
    return f"warning: {message}\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``weightformer`` and ``python -m weightformer``; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # parsed by the bench module, imported only now
        return _run_bench(argv[1:])
    args = build_parser().parse_args(argv)
    from .engine import USER_ERRORS

    previous_format, warnings.formatwarning = warnings.formatwarning, _format_warning
    try:
        return _run_train(args) if args.command == "train" else _run_eval(args)
    except USER_ERRORS as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("aborted", file=sys.stderr)
        return 130
    finally:
        warnings.formatwarning = previous_format
