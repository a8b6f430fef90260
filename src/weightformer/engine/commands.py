"""How a task is offered on the command line: its subcommands beside ``train`` (:class:`Command`) and how its
runs report (:class:`TaskCLI`). :mod:`weightformer.engine.cli` builds the parsers from them."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

__all__ = ["Command", "TaskCLI"]


@dataclass(frozen=True)
class Command:
    """A subcommand besides ``train``: ``add_arguments`` adds its flags, ``run`` runs it and returns the exit code."""

    name: str
    help: str
    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def _nothing(*args: Any) -> None:
    return None


@dataclass(frozen=True)
class TaskCLI:
    """How a task is offered on the command line, and how its runs report (``Task.cli``)."""

    program: str  # the command that runs the task: "weightformer det"
    description: str  # one line: what the task is, for --help
    commands: Sequence[Command]  # the subcommands beside train
    summary: Callable[[Mapping[str, Any]], str]  # the metrics of an evaluation as one line, after each epoch
    score: str  # the best metric's value as the run's last lines print it: "top-1 {:.2f}%"
    next_step: Callable[[Path], str] = lambda path: f"eval --checkpoint {path}"  # the command on a checkpoint
    train_arguments: Callable[[argparse.ArgumentParser], None] = _nothing  # flags of train that are not settings
    check_train_arguments: Callable[[argparse.Namespace], None] = _nothing  # checks them before the run
    after_training: Callable[[Any, argparse.Namespace], None] = _nothing  # (TrainResult, those flags) after a run

    def next_command(self, checkpoint: Path) -> str:
        """What a finished run suggests, and what the wrong-task message of another task points to."""
        return f"{self.program} {self.next_step(checkpoint)}"

    def format_score(self, value: float) -> str:
        return self.score.format(value)
