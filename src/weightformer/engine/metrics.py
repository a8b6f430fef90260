"""Run records: metrics.jsonl, curves.png, and progress output (tqdm on a terminal, log lines otherwise); strict
JSON (:func:`json_text`) and the check that a score comes from finite outputs (:class:`FiniteOutputs`)."""

from __future__ import annotations

import json
import math
import sys
import time
from itertools import accumulate
from pathlib import Path
from typing import Any, Optional, Sequence

from tqdm import tqdm

from ..atomic import write_atomic
from .errors import ConfigError, NonFiniteError

__all__ = ["FiniteOutputs", "Progress", "append_metrics", "format_duration", "json_text", "plot_curves",
           "read_metrics", "truncate_metrics"]


def json_text(obj: Any, **dumps_kwargs: Any) -> str:
    """``json.dumps`` as strict JSON, which has no NaN or Infinity: a float that is not finite (a metric with
    nothing to measure, such as the AP of a size no object has) is written as null."""
    def finite(value: Any) -> Any:
        if isinstance(value, float):
            return value if math.isfinite(value) else None
        if isinstance(value, dict):
            return {k: finite(v) for k, v in value.items()}
        return [finite(v) for v in value] if isinstance(value, (list, tuple)) else value

    return json.dumps(finite(obj), allow_nan=False, **dumps_kwargs)


class FiniteOutputs:
    """Notes, batch by batch and without waiting for the device, which images of an evaluation (or a sampling) on
    ``device`` gave outputs that are not finite; :meth:`check` after the last batch raises NonFiniteError on every rank (under
    torch.distributed) if any did, naming the first, so that no score is computed from them."""

    def __init__(self, what: str, device: Any) -> None:
        self.what, self.device = what, device  # e.g. "logits"
        self.flags: list[Any] = []  # per batch: (B,) bool, True where an image's outputs are not all finite

    def update(self, outputs: Any) -> None:
        """One batch's outputs: a tensor (B, ...), or one tensor per image."""
        import torch

        if isinstance(outputs, torch.Tensor):
            self.flags.append(~outputs.reshape(len(outputs), -1).isfinite().all(1))
        elif outputs:
            self.flags.append(torch.stack([~o.isfinite().all() for o in outputs]))

    def check(self) -> None:
        import torch
        import torch.distributed as dist

        flags = torch.cat(self.flags).cpu() if self.flags else torch.zeros(0, dtype=torch.bool)
        total = here = int(flags.sum())
        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        if distributed:
            counts = torch.tensor([float(here)], device=self.device)
            dist.all_reduce(counts)
            total = int(counts.item())
        if not total:
            return
        where = "on another process"
        if here:
            image = int(flags.nonzero()[0])
            batch = next(i for i, end in enumerate(accumulate(len(f) for f in self.flags)) if end > image)
            process = f" of process {dist.get_rank()}" if distributed else ""
            where = f"the first being image {image + 1} (batch {batch + 1}){process}"
        raise NonFiniteError(f"the model gave non-finite {self.what} (NaN or Inf) for {total} image(s), {where}; "
                             f"no result is given from them (with --amp, try --amp none)")


def append_metrics(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON object as a line; a write that fails (a full disk) leaves no part of it."""
    line = memoryview((json_text(record) + "\n").encode())
    with open(path, "ab", buffering=0) as f:
        start = f.tell()
        try:
            while line:
                line = line[f.write(line):]
        except OSError:
            f.truncate(start)
            raise


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl file ([] if it does not exist); a last line cut short (a write the machine
    lost) is dropped, and another line that is no record of an epoch is a ConfigError."""
    if not path.is_file():
        return []
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    records = []
    for number, line in enumerate(lines):
        try:
            record = json.loads(line)
        except ValueError:
            if number == len(lines) - 1:
                break
            record = None
        if not isinstance(record, dict) or not isinstance(record.get("epoch"), int):
            raise ConfigError(f"{path} line {number + 1} is no record of an epoch; move the file away (or the run "
                              f"folder, for a new run)")
        records.append(record)
    return records


def truncate_metrics(path: Path, completed_epochs: int) -> None:
    """Keep the records of the first ``completed_epochs`` epochs: the ones a resumed checkpoint includes."""
    if path.is_file():
        kept = [r for r in read_metrics(path) if r["epoch"] <= completed_epochs and not r.get("partial")]
        write_atomic(path, "".join(json_text(r) + "\n" for r in kept))


def plot_curves(metrics_path: Path, png_path: Path, metrics: Sequence[str]) -> None:
    """Loss (train, and val where the task reports one) and the task's ``metrics`` against epoch, as a PNG."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    records = read_metrics(metrics_path)
    if not records:
        return
    epochs = [r["epoch"] for r in records]
    fig = Figure(figsize=(10, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax_loss, ax_metrics = fig.subplots(1, 2)
    ax_loss.plot(epochs, [r["train_loss"] for r in records], marker="o", label="train")
    if all("val_loss" in r for r in records):
        ax_loss.plot(epochs, [r["val_loss"] for r in records], marker="o", label="val")
    ax_loss.set(xlabel="epoch", ylabel="loss", title="loss")
    for name in metrics:
        ax_metrics.plot(epochs, [r.get(name) if r.get(name) is not None else math.nan for r in records], marker="o",
                        label=name.removeprefix("val_"))
    ax_metrics.set(xlabel="epoch", title="validation")
    for ax in (ax_loss, ax_metrics):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    write_atomic(png_path, lambda f: fig.savefig(f, format="png"))


def format_duration(seconds: float) -> str:
    """``3725`` -> ``'1:02:05'``."""
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Progress:
    """Per-epoch progress: a tqdm bar on a terminal, else a line every ``interval`` steps; silent unless ``enabled``."""

    def __init__(self, enabled: bool, interval: int, total_steps: int, done_steps: int):
        self.enabled = enabled
        self.tty = enabled and sys.stdout.isatty()
        self.interval = max(interval, 1)
        self.total_steps = total_steps  # optimizer steps of the whole run
        self.run_start_steps = done_steps
        self.run_start = time.perf_counter()
        self.bar: Optional[tqdm] = None

    def start_epoch(self, epoch: int, epochs: int, steps: int, done: int) -> None:
        if self.tty:
            self.bar = tqdm(total=steps, initial=done, desc=f"epoch {epoch + 1}/{epochs}", dynamic_ncols=True)
        self.epoch, self.epochs, self.steps = epoch, epochs, steps

    def step(self, step_in_epoch: int, global_step: int, loss: float, lr: float, img_per_s: float) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", refresh=False)
            return
        if step_in_epoch % self.interval == 0 or step_in_epoch == self.steps:
            elapsed = time.perf_counter() - self.run_start
            rate = (global_step - self.run_start_steps) / max(elapsed, 1e-9)
            eta = (self.total_steps - global_step) / max(rate, 1e-9)
            print(f"epoch {self.epoch + 1}/{self.epochs} step {step_in_epoch}/{self.steps} loss {loss:.4f} "
                  f"lr {lr:.2e} {img_per_s:.0f} img/s eta {format_duration(eta)}", flush=True)

    def end_epoch(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    close = end_epoch  # closes an open bar on every exit path of a run (errors and signals included)

    def write(self, message: str) -> None:
        """Print a line (above the bar on a terminal)."""
        if self.enabled:
            (self.bar.write if self.bar is not None else print)(message)
            sys.stdout.flush()
