"""The ``weightformer`` command: it only dispatches, to a task's command line (``cls|det|seg|gen``, with
``train|eval|predict`` for ``cls``) or another subcommand's module, each imported only when it runs."""

from __future__ import annotations

import sys
from importlib import import_module
from typing import Optional, Sequence

from .tasks import BUILTIN_TASKS

__all__ = ["COMMANDS", "main"]

# Subcommands whose module has ``main(argv) -> int`` and parses its own arguments: name -> (module, help).
COMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("weightformer.bench.cli", "speed and memory benchmarks"),
    "export": ("weightformer.export.cli", "export a classifier to the Hub layout, ONNX or torch.export"),
    "analyze": ("weightformer.analysis.cli", "analysis tools: effective receptive fields"),
    "ablate": ("weightformer.analysis.ablate", "train a grid of variants over seeds and tabulate them"),
    "data": ("weightformer.data.cli", "data sets as webdataset tar shards: pack, verify"),
}
TASK_HELP = {
    "cls": "image classification: train, eval, predict",
    "det": "detection and instance segmentation: train, eval, predict",
    "seg": "semantic segmentation: train, eval, predict",
    "gen": "class-conditional diffusion (WeightFormer-DiT): train, sample, eval",
}
MAIN_SUBCOMMANDS = {
    "train": "train a classifier (default: WeightFormer on the bundled MNIST, a few minutes on a CPU)",
    "eval": "top-1/top-5/loss/throughput of a classifier checkpoint or pretrained model",
    "predict": "top-k labels of images or folders",
}


def _usage() -> str:
    tasks = {cli: name for name, (_, cli) in BUILTIN_TASKS.items()}
    lines = ["usage: weightformer {" + ",".join([*MAIN_SUBCOMMANDS, *tasks, *COMMANDS]) + "} ...", "",
             "Train, evaluate, run and benchmark WeightFormer.", "", "commands:"]
    lines += [f"  {name:<9} {text}" for name, text in MAIN_SUBCOMMANDS.items()]
    lines += [f"  {cli:<9} {TASK_HELP.get(cli, name)} (weightformer {cli} --help)" for cli, name in tasks.items()]
    lines += [f"  {name:<9} {text} (weightformer {name} --help)" for name, (_, text) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``weightformer`` and ``python -m weightformer``; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    tasks = {cli: task for task, (_, cli) in BUILTIN_TASKS.items()}
    try:
        if name in MAIN_SUBCOMMANDS:
            name, rest = "cls", argv
        if name in tasks:
            from .engine.cli import main as task_main
            from .engine.registry import get_task

            task = get_task(tasks[name])
            prog = "weightformer" if argv[0] in MAIN_SUBCOMMANDS else None
            return task_main(task, rest, prog=prog)
        if name in COMMANDS:
            return int(import_module(COMMANDS[name][0]).main(rest) or 0)
    except ImportError as exc:  # a missing optional dependency must not take the other commands down with it
        print(f"error: the {name} subcommand is unavailable ({type(exc).__name__}: {exc})", file=sys.stderr)
        return 1
    print(_usage(), file=sys.stderr)
    print(f"\nweightformer: error: unknown command {argv[0]!r}", file=sys.stderr)
    return 2
