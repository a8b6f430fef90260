"""The ``weightformer`` command: ``train`` and ``eval`` here; every other subcommand lives in its own
package and is imported only when it runs (:data:`PACKAGE_COMMANDS`).

A thin layer over :func:`weightformer.engine.train` and :func:`weightformer.engine.evaluate_checkpoint`.
Exit codes: 0 done; 2 a user's mistake (one ``error:`` line); 1 a run that failed for another reason:
out of memory or a diverged loss (one line), or a bug (its traceback, and where to report it);
130 / 143 a run stopped by SIGINT / SIGTERM after saving its checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

__all__ = [
    "add_train_arguments", "build_parser", "exit_code", "main", "print_and_write_results", "run_reporting_errors",
    "train_overrides",
]

SIGNAL_EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143}

# Subcommands whose module has ``main(argv) -> int`` and parses its own arguments: name -> (module, help).
PACKAGE_COMMANDS: dict[str, tuple[str, str]] = {
    "bench": (".bench.cli", "speed and memory benchmarks"),
    "det": (".detection.cli", "detection and instance segmentation: train, eval, predict"),
    "seg": (".segmentation.cli", "semantic segmentation: train, eval, predict"),
    "gen": (".generation.cli", "class-conditional diffusion (WeightFormer-DiT): train, sample, eval"),
    "export": (".export.cli", "export a model to the Hub layout, ONNX or torch.export"),
    "predict": (".classification.predict", "top-k labels of images or folders"),
    "analyze": (".analysis.cli", "analysis tools: effective receptive fields"),
    "ablate": (".analysis.ablate", "train a grid of variants over seeds and tabulate them"),
}
BUG_REPORT = ("this is a bug in weightformer or a library it uses, not a problem with your input; please report it "
              "on the weightformer issue tracker with the command you ran and the traceback above")


def _train_default(name: str) -> str:
    """``(default: X)`` for a TrainConfig field, from the dataclass itself (so help never goes stale)."""
    from .engine.config import FIELDS

    return f"(default: {FIELDS[name].default})"


def add_train_arguments(p: argparse.ArgumentParser, data_help: Optional[str] = None,
                        default_help: Optional[Callable[[str], str]] = None) -> None:
    """The run flags of ``weightformer train``, shared by every task's ``train`` command (``data_help``
    describes the task's ``--data``; ``default_help(field)`` the ``(default: ...)`` text of a task
    whose recipe is not TrainConfig's)."""
    # Every default is SUPPRESS: only flags the user gives override the config file and data-set defaults.
    # The defaults shown are the paper's ImageNet recipe; a built-in data set (mnist) brings its own, printed
    # at the start of the run.
    S, d = argparse.SUPPRESS, default_help or _train_default
    p.add_argument("--config", dest="config_file", metavar="FILE.yaml", default=S,
                   help="YAML file of settings (e.g. configs/imagenet_weightformer_t.yaml); flags override it")
    p.add_argument("--data", default=S,
                   help=data_help or f"ImageFolder tree with train/ and val/, or a built-in data set {d('data')}")
    p.add_argument("--model", default=S, help=f"any timm model name {d('model')}")
    p.add_argument("--model-kwargs", nargs="+", metavar="KEY=VALUE", default=[],
                   help="keyword arguments for timm.create_model, e.g. patch_size=4 drop_path_rate=0.1")
    p.add_argument("--model-arg", action="append", metavar="KEY=VALUE", default=[],
                   help="one model keyword argument; repeat for more")
    p.add_argument("--epochs", type=int, default=S, help=f"length of the schedule in epochs {d('epochs')}")
    p.add_argument("--max-steps", type=int, default=S,
                   help="stop after this many optimizer steps; the schedule is unchanged (smoke tests)")
    p.add_argument("--batch-size", type=int, default=S,
                   help=f"images per step and process; capped at the training images a process sees {d('batch_size')}")
    p.add_argument("--img-size", type=int, default=S,
                   help="training and evaluation resolution in pixels (default: the data set's, else 224)")
    p.add_argument("--lr", type=float, default=S,
                   help=f"learning rate for a total batch of 512, scaled linearly to the real one {d('lr')}")
    p.add_argument("--warmup-epochs", type=float, default=S,
                   help=f"epochs of linear warm-up before the cosine decay {d('warmup_epochs')}")
    p.add_argument("--output", default=S, help="run folder (default: runs/<data>_<model>)")
    p.add_argument("--resume", default=S, metavar="{auto,PATH}",
                   help="continue a run: auto (last.pt in --output, if any) or a last.pt file")
    p.add_argument("--init", default=S, metavar="PATH",
                   help="start a new run from the weights in PATH (best.pt, a state dict, the authors' .pth, "
                        ".safetensors); a classifier of another size starts fresh")
    p.add_argument("--overwrite", action="store_true", default=S,
                   help="start anew in an --output folder that holds a run; its files move to previous-<time>/")
    p.add_argument("--seed", type=int, default=S, help=f"random seed, 0 to 2**32-1 {d('seed')}")
    p.add_argument("--deterministic", action="store_true", default=S,
                   help="deterministic algorithms; on CPU a resumed run then equals an uninterrupted one exactly")
    p.add_argument("--workers", type=int, default=S, help=f"data-loading processes per training process {d('workers')}")
    p.add_argument("--amp", choices=["none", "bf16", "fp16"], default=S, help=f"mixed precision {d('amp')}")
    p.add_argument("--compile", action="store_true", default=S, help="torch.compile the model")
    p.add_argument("--grad-checkpointing", action="store_true", default=S,
                   help="recompute activations in backward: much less memory, about 30%% slower")
    p.add_argument("--ema", action="store_true", default=S, help="keep an EMA of the weights")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default=S, help=f"{d('device')}")
    p.add_argument("--log-interval", type=int, default=S,
                   help=f"steps between log lines when not on a terminal {d('log_interval')}")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                   help="any other setting, e.g. --set mixup=0 --set auto_augment=null (see docs/train.md)")


def _add_eval_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", help="a last.pt/best.pt from train (it names its model and data), the authors' "
                                        ".pth or .safetensors, or any state dict (with --model)")
    p.add_argument("--model", help="timm model name: with --pretrained, or for a checkpoint that does not name one")
    p.add_argument("--pretrained", action="store_true", help="evaluate timm's pretrained weights for --model")
    p.add_argument("--data", help="ImageFolder with val/, or mnist (default: the data the checkpoint was trained on)")
    p.add_argument("--model-kwargs", nargs="+", metavar="KEY=VALUE", default=[],
                   help="keyword arguments for timm.create_model, e.g. patch_size=4")
    p.add_argument("--img-size", type=int,
                   help="evaluation resolution (default: the checkpoint's, else the model's pretrained config)")
    p.add_argument("--batch-size", type=int, default=256, help="images per forward pass (default: 256)")
    p.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1),
                   help="data-loading processes (default: 4, at most the CPU count)")
    p.add_argument("--amp", choices=["none", "bf16", "fp16"], default="none", help="mixed precision (default: none)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto", help="auto: cuda if available (default: auto)")
    p.add_argument("--ema", action="store_true", help="evaluate the checkpoint's EMA weights")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH (checked before the work)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``weightformer`` (``bench`` options are parsed by the bench module)."""
    parser = argparse.ArgumentParser(prog="weightformer", description="Train, evaluate and benchmark WeightFormer.")
    sub = parser.add_subparsers(dest="command", required=True,
                                metavar="{" + ",".join(["train", "eval", *PACKAGE_COMMANDS]) + "}")
    add_train_arguments(sub.add_parser(
        "train", help="train a model (default: WeightFormer on the bundled MNIST)",
        description="Train a timm model (default: a small WeightFormer on the bundled MNIST digits, a few minutes "
                    "on a CPU). Defaults shown are the paper's ImageNet recipe; built-in data sets bring their own."))
    _add_eval_arguments(sub.add_parser(
        "eval", help="top-1/top-5/loss/throughput of a checkpoint or pretrained model",
        description="Evaluate a checkpoint or timm's pretrained weights: top-1, top-5, loss, img/s. Images are "
                    "preprocessed as the checkpoint was trained, else as the model's pretrained config says."))
    for name, (_, text) in PACKAGE_COMMANDS.items():
        sub.add_parser(name, help=f"{text} (weightformer {name} --help)", add_help=False)
    return parser


def train_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the user gave as flags (``--set``, ``--model-kwargs`` included), for ``train``."""
    from .engine import parse_model_kwargs

    values = {k: v for k, v in vars(args).items() if k not in ("command", "config_file", "model_kwargs", "model_arg", "set")}
    values.update(parse_model_kwargs(args.set, flag="--set"))
    model_kwargs = {**parse_model_kwargs(args.model_kwargs, flag="--model-kwargs"),
                    **parse_model_kwargs(args.model_arg, flag="--model-arg")}
    if model_kwargs:
        values["model_kwargs"] = {**values.get("model_kwargs", {}), **model_kwargs}
    return values


def _run_train(args: argparse.Namespace) -> int:
    from .engine import train

    result = train(train_overrides(args), config_file=getattr(args, "config_file", None))
    return exit_code(result)


def exit_code(result: Any) -> int:
    """0 for a finished run, 130 / 143 for one stopped by SIGINT / SIGTERM."""
    return SIGNAL_EXIT_CODES.get(result.stopped_by, 130) if result.stopped_by else 0


def _run_eval(args: argparse.Namespace) -> int:
    from .engine import evaluate_checkpoint, format_eval, parse_model_kwargs
    from .engine.run_dir import check_writable_file

    json_path = Path(args.json) if args.json else None
    if json_path is not None:
        check_writable_file(json_path, "--json")  # before the work, not after it
    result = evaluate_checkpoint(
        checkpoint=args.checkpoint, model=args.model, pretrained=args.pretrained, data=args.data,
        model_kwargs=parse_model_kwargs(args.model_kwargs, flag="--model-kwargs"), img_size=args.img_size,
        batch_size=args.batch_size, workers=args.workers, amp=args.amp, device=args.device, use_ema=args.ema,
    )
    print(format_eval(result))
    for path in result["skipped_files"][:5]:
        print(f"  left out (unreadable): {path}")
    return print_and_write_results(result, json_path)


def print_and_write_results(result: dict[str, Any], json_path: Optional[Path]) -> int:
    """Print ``result`` as a JSON line, then write it to ``json_path`` (checked before the work);
    a write that fails after all costs only the file, never the printed numbers. Returns the exit code."""
    print(json.dumps(result), flush=True)
    if json_path is not None:
        try:
            json_path.write_text(json.dumps(result, indent=2) + "\n")
        except OSError as exc:
            print(f"error: the results above could not be written to --json {json_path} ({exc.strerror or exc})",
                  file=sys.stderr)
            return 2
    return 0


def _format_warning(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> str:
    return f"warning: {message}\n"


def one_line(exc: BaseException) -> str:
    """The message of ``exc`` as one line. (A DataError from a DataLoader worker already carries its
    original one-line message: the error type unwraps torch's re-raise text itself.)"""
    text = str(exc).strip()
    return " ".join(text.splitlines()) if text else type(exc).__name__


def _is_out_of_memory(exc: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or the CPU allocator's RuntimeError."""
    import torch

    return isinstance(exc, torch.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc))


def run_reporting_errors(command: Callable[[], int], hint_grad_checkpointing: bool = False) -> int:
    """Run ``command`` and turn what it raises into the exit codes and messages of this module's docstring."""
    from .engine import USER_ERRORS
    from .engine.errors import TrainingDivergedError

    previous_format, warnings.formatwarning = warnings.formatwarning, _format_warning
    try:
        return command()
    except USER_ERRORS as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    except TrainingDivergedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("aborted", file=sys.stderr)
        return 130
    except Exception as exc:
        if _is_out_of_memory(exc):
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            print(f"error: out of memory ({first}); pass a smaller --batch-size"
                  f"{' or --grad-checkpointing' if hint_grad_checkpointing else ''}", file=sys.stderr)
            return 1
        traceback.print_exc()
        print(f"\n{BUG_REPORT}", file=sys.stderr)
        return 1
    finally:
        warnings.formatwarning = previous_format


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``weightformer`` and ``python -m weightformer``; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in PACKAGE_COMMANDS:  # the package's own commands, imported only now
        from importlib import import_module

        module_name = PACKAGE_COMMANDS[argv[0]][0]
        try:
            package_cli = import_module(module_name, __package__)
        except ImportError as exc:  # a missing optional dependency must not take train/eval down with it
            print(f"error: the {argv[0]} subcommand is unavailable ({type(exc).__name__}: {exc})", file=sys.stderr)
            return 1
        return int(package_cli.main(argv[1:]) or 0)
    args = build_parser().parse_args(argv)
    run = (lambda: _run_train(args)) if args.command == "train" else (lambda: _run_eval(args))
    return run_reporting_errors(run, hint_grad_checkpointing=args.command == "train")
