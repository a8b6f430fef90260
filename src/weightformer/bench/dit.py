"""``weightformer bench dit``: WeightFormer-DiT against DiT with fused attention
(F.scaled_dot_product_attention) and with explicit attention (softmax(QKᵀ)V, the N×N scores in memory),
across latent sides, forward and training step (forward+backward): time and extra peak memory.

Times are medians of interleaved repetitions (the models alternate, so machine-load drift hits them
alike), after one warm-up call. Memory is the extra peak of one call over a warmed-up process, each
model in a fresh process: on the CPU the peak resident set (VmHWM after a reset) minus the resident set
before the call, after a warm-up call of the same model at a small side; on a GPU
``torch.cuda.max_memory_allocated`` minus the memory allocated before the call.

The per-call budget (``--max-seconds``): before each point, one call's time is predicted from the same
model's time at the previous side, scaled by the FLOPs (a training step's first prediction: 3× the
forward at the same side); a point predicted over the budget is skipped, and a model whose warm-up call
takes longer than the budget stops growing. Explicit attention's scores are predicted too: a forward
holds two B·H·N² fp32 tensors (the scores and their softmax), a training step one per block for the
backward plus two in flight. A point predicted to need more than the memory available is reported as
out of memory, "predicted"; one that runs out of memory when run is "measured".

The anchor is DiG (arXiv 2405.18428): DiG-S/2 2.5× faster than DiT-S/2 with 75.7% less GPU memory at
1792² px (a latent side of 224).

The parser needs no torch (``--help`` and a bad flag answer at once); the measurements import it.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .machine import provenance
from .options import DEVICE_HELP, add_overwrite_argument, number, one_line_error

__all__ = ["ATTENTION", "Entry", "MODES", "benchmark", "main"]

MODES = ("forward", "train")
ATTENTION = ("fused", "explicit")
DEFAULT_SIDES = (32, 64, 128, 224)
ANCHOR = ("DiG (arXiv 2405.18428): DiG-S/2 is 2.5x faster than DiT-S/2 and uses 75.7% less GPU memory at "
          "1792x1792 px (latent side 224); WeightFormer-DiT should beat both.")
TRAIN_COST = 3.0  # a training step costs about three forwards
MEMORY_SHARE = 0.8  # a point may be predicted to need at most this share of the memory available
OK, SKIPPED, OOM = "ok", "skipped", "oom"
OUTPUT_NAMES = ("dit.json", "dit.md")
GIB = 2**30


@dataclass(frozen=True)
class Entry:
    """One benchmarked model: a DiT variant (a key of ``DIT_VARIANTS``) and, for attention DiTs, whether
    its attention is fused (``F.scaled_dot_product_attention``) or explicit."""

    model: str
    attention: str | None = None

    @property
    def key(self) -> str:
        return self.model if self.attention is None else f"{self.model} {self.attention}"

    @property
    def patch(self) -> int:
        return int(self.model.rsplit("_", 1)[1])


def entries(models: Sequence[str], attention: Sequence[str]) -> list[Entry]:
    """The WeightFormer-DiT ``models[0]`` and the attention DiT ``models[1]`` in each of ``attention``."""
    wf, dit = models
    return [Entry(wf), *(Entry(dit, kind) for kind in attention)]


def _arguments(entry: Entry, model_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    from ..generation.variants import DIT_VARIANTS

    return {**DIT_VARIANTS[entry.model], **(model_kwargs or {})}


def _build(entry: Entry, side: int, device: str, model_kwargs: dict[str, Any] | None = None):
    """``entry``'s model for (B, 4, side, side) latents on ``device`` (``meta``: shapes only), seeded."""
    import torch

    from ..generation.variants import create_dit

    torch.manual_seed(0)
    with torch.device(device):
        model = create_dit(entry.model, input_size=side, in_channels=4, num_classes=1000, **(model_kwargs or {}))
    if entry.attention is not None:
        for module in model.modules():
            if hasattr(module, "fused_attn"):
                module.fused_attn = entry.attention == "fused"
    return model


def _call(entry: Entry, side: int, batch: int, mode: str, device: str,
          model_kwargs: dict[str, Any] | None = None) -> Callable[[], None]:
    """One forward (no grad) or forward+backward of ``entry`` on (batch, 4, side, side) latents."""
    import torch

    model = _build(entry, side, device, model_kwargs)
    x = torch.randn(batch, 4, side, side, device=device)
    t = torch.randint(0, 1000, (batch,), device=device)
    y = torch.randint(0, 1000, (batch,), device=device)
    if mode == "forward":
        model.eval()

        def forward() -> None:
            with torch.no_grad():
                model(x, t, y)

        return forward
    model.train()

    def step() -> None:
        model(x, t, y).square().mean().backward()
        model.zero_grad(set_to_none=True)

    return step


def forward_flops(entry: Entry, side: int, batch: int, model_kwargs: dict[str, Any] | None = None) -> int:
    """FLOPs of one forward, counted on the meta device (no compute, no memory), attention matmuls included."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    model = _build(Entry(entry.model, "explicit" if entry.attention else None), side, "meta", model_kwargs)
    x = torch.empty(batch, 4, side, side, device="meta")
    labels = torch.zeros(batch, dtype=torch.long, device="meta")
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(x, labels, labels)
    return int(counter.get_total_flops())


def score_bytes(entry: Entry, side: int, batch: int, mode: str, model_kwargs: dict[str, Any] | None = None) -> int:
    """Bytes of explicit attention's fp32 scores alive at once (see the module docstring); 0 for the others."""
    if entry.attention != "explicit":
        return 0
    arguments = _arguments(entry, model_kwargs)
    tokens = (side // entry.patch) ** 2
    per_block = batch * arguments["num_heads"] * tokens * tokens * 4  # (B, H, N, N) fp32
    return per_block * (2 if mode == "forward" else arguments["depth"] + 2)


def available_bytes(device: str) -> int:
    """Memory a point can use: the GPU's free memory, or the CPU's MemAvailable (/proc/meminfo)."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.mem_get_info(device)[0]
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable line; CPU memory needs Linux procfs")


def _memory_worker(spec_text: str) -> None:
    """In this fresh process: warm up with ``spec``'s model at a small side, build it at its side, and print
    the peak, the baseline and the extra of one call (MiB), or ``{"oom": ...}``."""
    import torch

    from .memory import _proc_status_kib, _reset_peak_rss, is_oom

    spec = json.loads(spec_text)
    torch.set_num_threads(spec["threads"])
    entry = Entry(spec["model"], spec["attention"])
    try:
        _call(entry, 4 * entry.patch, 1, spec["mode"], "cpu", spec["model_kwargs"])()  # kernels, lazy state
        call = _call(entry, spec["side"], spec["batch"], spec["mode"], "cpu", spec["model_kwargs"])
        gc.collect()
        before = _proc_status_kib("VmRSS")
        method = "VmHWM after clear_refs minus VmRSS before, fresh process"
        if not _reset_peak_rss():
            method = "VmHWM without reset (peak may include setup) minus VmRSS before, fresh process"
        call()
        peak = _proc_status_kib("VmHWM")
    except (RuntimeError, MemoryError) as error:
        if not is_oom(error):
            raise
        print(json.dumps({"oom": (str(error).strip().splitlines() or [type(error).__name__])[0]}))
        return
    print(json.dumps({"peak_mib": peak / 1024, "baseline_mib": before / 1024, "extra_mib": (peak - before) / 1024,
                      "method": method}))


def measure_memory(entry: Entry, side: int, batch: int, mode: str, device: str,
                   model_kwargs: dict[str, Any] | None = None, timeout_s: float | None = None) -> dict[str, Any]:
    """Extra peak memory of one call (see the module docstring): {peak_mib, baseline_mib, extra_mib, method}.
    Raises :class:`~weightformer.bench.memory.OutOfMemory` when the call runs out of memory."""
    import signal

    import torch

    from .memory import MIB, OutOfMemory, cuda_peak

    if device.startswith("cuda"):
        _call(entry, 4 * entry.patch, 1, mode, device, model_kwargs)()
        baseline, peak = cuda_peak(_call(entry, side, batch, mode, device, model_kwargs), device)
        return {"peak_mib": peak / MIB, "baseline_mib": baseline / MIB, "extra_mib": (peak - baseline) / MIB,
                "method": "torch.cuda.max_memory_allocated minus memory_allocated before"}
    spec = json.dumps(dict(model=entry.model, attention=entry.attention, side=side, batch=batch, mode=mode,
                           threads=torch.get_num_threads(), model_kwargs=model_kwargs or {}))
    # Large blocks mmap'd, as in weightformer.bench.memory, so that what one call frees goes back to the OS
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    proc = subprocess.run([sys.executable, "-m", "weightformer.bench.dit", "--memory-worker", spec],
                          capture_output=True, text=True, check=False, env=env, timeout=timeout_s)
    if proc.returncode == -signal.SIGKILL:
        raise OutOfMemory(f"the memory worker of {entry.key} was killed by SIGKILL, most likely by the "
                          f"out-of-memory killer")
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"memory worker for {spec} failed ({proc.returncode}): {last}")
    document = json.loads(proc.stdout.strip().splitlines()[-1])
    if "oom" in document:
        raise OutOfMemory(document["oom"])
    return document


class _Plan:
    """What the budget needs to know of each model: its FLOPs per side and its last measured call."""

    def __init__(self, batch: int, model_kwargs: dict[str, Any] | None):
        self.batch, self.model_kwargs = batch, model_kwargs
        self.flops: dict[tuple[str, int], int] = {}
        self.last: dict[tuple[str, str], tuple[int, float]] = {}  # (entry, mode) -> (side, seconds per call)

    def flops_at(self, entry: Entry, side: int) -> int:
        if (entry.key, side) not in self.flops:
            self.flops[(entry.key, side)] = forward_flops(entry, side, self.batch, self.model_kwargs)
        return self.flops[(entry.key, side)]

    def predicted_seconds(self, entry: Entry, mode: str, side: int) -> float | None:
        """One call's seconds: the last measured call of the same mode scaled by FLOPs, else (a training
        step) 3× the forward at this side; None before any measurement."""
        if (entry.key, mode) in self.last:
            last_side, seconds = self.last[(entry.key, mode)]
            return seconds * self.flops_at(entry, side) / self.flops_at(entry, last_side)
        forward = self.last.get((entry.key, "forward"))
        if mode == "train" and forward is not None and forward[0] == side:
            return TRAIN_COST * forward[1]
        return None


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def benchmark(models: Sequence[str], sides: Sequence[int], batch: int = 1, repeats: int = 3,
              max_seconds: float = 200.0, device: str = "cpu", memory: bool = True,
              model_kwargs: dict[str, Any] | None = None, attention: Sequence[str] = ATTENTION,
              on_side: Callable[[list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
    """One row per (side, mode, model) of :func:`entries` ``(models, attention)``: status (ok, skipped, oom),
    median seconds per call, extra peak MiB, and the reason of a point not measured. ``model_kwargs``
    override the variants' arguments (smaller models for tests); ``on_side`` gets the rows so far after
    each side (to save partial results)."""
    import torch

    from .memory import is_oom
    from .timing import median, round_robin, time_call

    plan = _Plan(batch, model_kwargs)
    stopped: dict[tuple[str, str], str] = {}  # (entry, mode) -> why it grows no further
    rows: list[dict[str, Any]] = []
    for side in sides:
        for mode in MODES:
            side_rows: dict[str, dict[str, Any]] = {}
            calls: dict[str, Callable[[], None]] = {}
            for entry in entries(models, attention):
                row: dict[str, Any] = {"model": entry.key, "variant": entry.model, "attention": entry.attention,
                                       "side": side, "pixels": side * 8, "tokens": (side // entry.patch) ** 2,
                                       "mode": mode, "batch": batch, "status": OK,
                                       "forward_gflops": plan.flops_at(entry, side) / 1e9}
                side_rows[entry.key] = row
                need = score_bytes(entry, side, batch, mode, model_kwargs)
                available = available_bytes(device) if need else 0
                predicted = plan.predicted_seconds(entry, mode, side)
                if (entry.key, mode) in stopped:
                    row.update(status=SKIPPED, reason=stopped[(entry.key, mode)])
                elif need > MEMORY_SHARE * available:
                    row.update(status=OOM, oom="predicted", reason=(
                        f"out of memory (predicted): explicit attention holds {need / GIB:.1f} GiB of fp32 scores "
                        f"at once, more than {MEMORY_SHARE:.0%} of the {available / GIB:.1f} GiB available"))
                    stopped[(entry.key, mode)] = "out of memory at a smaller side"
                elif predicted is not None and predicted > max_seconds:
                    row.update(status=SKIPPED, predicted_seconds=predicted,
                               reason=f"predicted {predicted:.1f} s per call exceeds the {max_seconds:g} s budget")
                    stopped[(entry.key, mode)] = f"a smaller side was over the {max_seconds:g} s budget"
                else:
                    try:
                        call = _call(entry, side, batch, mode, device, model_kwargs)
                        first = time_call(call, device)  # the warm-up, and the cut-off test
                    except (RuntimeError, MemoryError) as error:
                        if not is_oom(error):
                            raise
                        row.update(status=OOM, oom="measured", reason=f"out of memory (measured): {_first_line(error)}")
                        stopped[(entry.key, mode)] = "out of memory at a smaller side"
                        call = None
                    if call is not None and first > max_seconds:
                        row.update(status=SKIPPED, seconds=first, cut_off=True,
                                   reason=f"one call took {first:.1f} s > the {max_seconds:g} s budget")
                        stopped[(entry.key, mode)] = f"a smaller side took over {max_seconds:g} s"
                    elif call is not None:
                        calls[entry.key] = call
                    if predicted is not None:
                        row["predicted_seconds"] = predicted
                    gc.collect()
            samples = round_robin(calls, repeats, device, {}) if calls else {}
            calls.clear()
            gc.collect()
            for entry in entries(models, attention):
                row = side_rows[entry.key]
                if entry.key in samples:
                    row.update(seconds=median(samples[entry.key]), samples_s=samples[entry.key])
                    plan.last[(entry.key, mode)] = (side, row["seconds"])
                    if memory:
                        try:
                            row.update(measure_memory(entry, side, batch, mode, device, model_kwargs,
                                                      timeout_s=4 * max_seconds + 120))
                        except (RuntimeError, MemoryError) as error:
                            if not is_oom(error):
                                raise
                            row["memory_oom"] = f"out of memory (measured): {_first_line(error)}"
                        except subprocess.TimeoutExpired as error:
                            row["memory_skipped"] = f"memory worker ran past its {error.timeout:.0f} s timeout"
                rows.append(row)
                print(json.dumps(row), flush=True)
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
        if on_side is not None:
            on_side(rows)
    return rows


def _seconds_cell(row: dict[str, Any]) -> str:
    if row["status"] == OK:
        return f"{row['seconds']:.3f}"
    if row.get("cut_off"):
        return f"{row['seconds']:.1f} (1 call, cut off)"
    return f"OOM ({row['oom']})" if row["status"] == OOM else "skipped"


def _memory_cell(row: dict[str, Any]) -> str:
    if "extra_mib" in row:
        return f"{row['extra_mib']:.0f}"
    if row["status"] == OOM:
        return f"OOM ({row['oom']})"
    return "OOM (measured)" if "memory_oom" in row else "-"


def _ratio(numerator: dict[str, Any], denominator: dict[str, Any], key: str) -> str:
    if key in numerator and key in denominator and numerator["status"] == denominator["status"] == OK \
            and denominator[key] > 0:
        return f"{numerator[key] / denominator[key]:.2f}x"
    return "-"


def markdown(document: dict[str, Any]) -> str:
    """The table of ``document`` (rows, machine, config): one line per side and mode, the WF-DiT against
    each attention DiT; speed-up is DiT's time over WF-DiT's, memory ratio WF-DiT's extra peak over DiT's."""
    config, rows = document["config"], document["rows"]
    wf, dit = config["models"]
    attention = config["attention"]
    index = {(r["model"], r["side"], r["mode"]): r for r in rows}
    others = [Entry(dit, kind).key for kind in attention]
    where = "cuda" if str(config["device"]).startswith("cuda") else "cpu"
    memory_how = ("peak resident set (VmHWM after clear_refs) minus the resident set before the call, each model in "
                  "a fresh process warmed up by one call at a small side" if where == "cpu" else
                  "torch.cuda.max_memory_allocated minus memory_allocated before the call, after a warm-up call")
    lines = [f"# WF-DiT vs DiT (fused and explicit attention): time and extra peak memory by latent side ({where})",
             "", provenance(document["machine"]), "",
             (f"Batch {config['batch']}, 4 latent channels, fp32; seconds per call are medians of {config['repeats']} "
              f"interleaved repetitions after one warm-up call; per-call budget {config['max_seconds']:g} s. Memory "
              f"(MiB) is the extra peak of one call over a warmed-up process: {memory_how}. Speed-up: DiT's time over "
              f"WF-DiT's; memory ratio: WF-DiT's extra peak over DiT's (below 1 is less)."), "", ANCHOR, ""]
    header = (["side (px)", "tokens", "mode", f"{wf} s"] + [f"{k} s" for k in others]
              + [f"speed-up vs {k}" for k in others] + [f"{wf} MiB"] + [f"{k} MiB" for k in others]
              + [f"memory ratio vs {k}" for k in others])
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    notes = []
    for side in document["sides_done"]:
        for mode in MODES:
            a = index.get((wf, side, mode))
            bs = [index.get((k, side, mode)) for k in others]
            if a is None or None in bs:
                continue
            cells = ([f"{side} ({side * 8})", str(a["tokens"]), mode, _seconds_cell(a)] + [_seconds_cell(b) for b in bs]
                     + [_ratio(b, a, "seconds") for b in bs] + [_memory_cell(a)] + [_memory_cell(b) for b in bs]
                     + [_ratio(a, b, "extra_mib") for b in bs])
            lines.append("| " + " | ".join(cells) + " |")
            for r in (a, *bs):
                for key in ("reason", "memory_oom", "memory_skipped"):
                    if key in r and not r[key].startswith("a smaller side"):  # said once, at the side that stopped it
                        notes.append(f"- {r['model']}, {mode}, side {side}: {r[key]}")
    if notes:
        lines += ["", "Points not measured, and why:", "", *notes]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    """The options of ``weightformer bench dit``; a bad one (a number that is not finite or out of
    range included) is one ``error:`` line and exit status 2."""
    p = argparse.ArgumentParser(prog="weightformer bench dit", description=" ".join(__doc__.split("\n\n")[0].split()))
    p.error = one_line_error(p)  # type: ignore[method-assign]
    p.add_argument("--models", nargs=2, default=["wf_dit_s_2", "dit_s_2"], metavar=("WF_DIT", "DIT"),
                   help="the WeightFormer-DiT and the attention DiT compared (default: wf_dit_s_2 dit_s_2)")
    p.add_argument("--attention", nargs="+", choices=ATTENTION, default=list(ATTENTION),
                   help="the attention DiT's attention, one row each (default: fused explicit)")
    p.add_argument("--sides", type=number(1, integer=True), nargs="+", default=list(DEFAULT_SIDES),
                   help="latent sides, 8 px each, multiples of the patch sizes (default: 32 64 128 224, i.e. 256 "
                        "to 1792 px)")
    p.add_argument("--batch", type=number(1, integer=True), default=1, help="default: %(default)s")
    p.add_argument("--repeats", type=number(1, integer=True), default=3,
                   help="interleaved repetitions per point (default: %(default)s)")
    p.add_argument("--max-seconds", type=number(0, inclusive=False), default=200.0,
                   help="per-call budget, seconds > 0: points predicted to take longer are skipped, and a model "
                        "stops growing once one call takes longer (default: %(default)s)")
    p.add_argument("--threads", type=number(1, integer=True), default=None,
                   help="torch CPU threads (default: torch's choice)")
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    p.add_argument("--no-memory", action="store_true", help="time only")
    p.add_argument("--out", default=None,
                   help=f"folder for {' and '.join(OUTPUT_NAMES)} (default: benchmarks/results/<device type>/dit); "
                        f"one that already holds them is refused unless --overwrite")
    add_overwrite_argument(p, " and ".join(OUTPUT_NAMES))
    p.add_argument("--memory-worker", help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``weightformer bench dit``; returns the exit status. Every setting, the device and
    the output folder are checked before any measurement (the rule of every bench command:
    :func:`~weightformer.bench.report.claim_out_dir`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.memory_worker:
        _memory_worker(args.memory_worker)
        return 0

    from ..engine.cli import run_reporting_errors

    def run() -> int:
        import torch

        from ..engine.errors import ConfigError
        from ..engine.outputs import removed_if_failed
        from ..generation.variants import DIT_VARIANTS
        from .journal import write_atomic
        from .machine import machine_info
        from .options import check_device
        from .report import claim_out_dir

        unknown = [m for m in args.models if m not in DIT_VARIANTS]
        if unknown:
            raise ConfigError(f"unknown model(s) {unknown}; choose from {', '.join(DIT_VARIANTS)}")
        if args.models[0] == args.models[1]:
            raise ConfigError(f"--models names {args.models[0]} twice; pass the two variants to compare")
        mixers = [DIT_VARIANTS[m]["mixer"] for m in args.models]
        if mixers != ["weightformer", "attention"]:
            raise ConfigError(f"--models takes a WeightFormer-DiT, then an attention DiT (e.g. wf_dit_s_2 dit_s_2), "
                              f"got {' '.join(args.models)}")
        patches = sorted({Entry(m).patch for m in args.models})
        bad = [s for s in args.sides if any(s % p for p in patches)]
        if bad:
            raise ConfigError(f"--sides must be multiples of the models' patch sizes "
                              f"({', '.join(map(str, patches))}), got {bad}")
        args.device = check_device(args.device)  # one line for cuda without a GPU, as every bench command
        if args.threads:
            torch.set_num_threads(args.threads)
        out = Path(args.out or Path("benchmarks/results") / args.device.split(":")[0] / "dit")
        machine = machine_info(args.device, shlex.join(["weightformer", "bench", "dit", *argv]))
        config = {k: v for k, v in vars(args).items() if k != "memory_worker"}

        def save(rows: list[dict[str, Any]]) -> None:  # after every side: a long sweep keeps what it measured
            document = {"machine": machine, "config": config, "sides_done": sorted({r["side"] for r in rows}),
                        "anchor": ANCHOR, "rows": rows}
            write_atomic(out / "dit.json", (json.dumps(document, indent=2) + "\n").encode())
            write_atomic(out / "dit.md", markdown(document).encode())

        with removed_if_failed(out):
            claim_out_dir(out, OUTPUT_NAMES, args.overwrite, "weightformer bench dit",
                          log=lambda message: print(message, flush=True))
            benchmark(args.models, sorted(set(args.sides)), args.batch, args.repeats, args.max_seconds, args.device,
                      not args.no_memory, attention=list(dict.fromkeys(args.attention)), on_side=save)
        print(f"wrote {out / 'dit.json'} and {out / 'dit.md'}")
        return 0

    return run_reporting_errors(run)


if __name__ == "__main__":
    sys.exit(main())
