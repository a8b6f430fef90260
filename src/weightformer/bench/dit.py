"""``weightformer bench dit``: WeightFormer-DiT against DiT (attention through
F.scaled_dot_product_attention) across latent sides, forward and forward+backward time and peak memory.

Times are medians of interleaved repetitions (the two models alternate, so machine-load drift hits
both). Peak memory is the CUDA allocator's peak on a GPU; on the CPU, the peak resident set of one call
in a fresh subprocess (VmHWM after a reset), minus the resident set before it. A model stops growing
once one call takes longer than ``--max-seconds`` (the next side costs at least 4× more). The anchor
is DiG (arXiv 2405.18428): DiG-S/2 2.5× faster than DiT-S/2 with 75.7% less GPU memory at 1792² px
(a latent side of 224).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..engine.cli import run_reporting_errors
from ..engine.errors import ConfigError
from ..generation.variants import DIT_VARIANTS, create_dit
from .journal import write_atomic
from .machine import describe, machine_info
from .memory import _proc_status_kib, _reset_peak_rss
from .options import add_overwrite_argument, check_device, default_device, number, one_line_error
from ..engine.outputs import removed_if_failed
from .report import claim_out_dir
from .timing import median, round_robin, synchronize, time_call

__all__ = ["benchmark", "main"]

MODES = ("forward", "train")
ANCHOR = ("DiG (arXiv 2405.18428): DiG-S/2 is 2.5x faster than DiT-S/2 and uses 75.7% less GPU memory at "
          "1792x1792 px (latent side 224); WeightFormer-DiT should beat both.")


def _call(model_name: str, side: int, batch: int, mode: str, device: str,
          model_kwargs: dict[str, Any] | None = None) -> Callable[[], None]:
    """One forward (no grad) or forward+backward of ``model_name`` (with ``model_kwargs``) on
    (batch, 4, side, side) latents."""
    torch.manual_seed(0)
    model = create_dit(model_name, input_size=side, in_channels=4, num_classes=1000, **(model_kwargs or {})).to(device)
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


def _peak_memory_mib(model_name: str, side: int, batch: int, mode: str, device: str,
                     model_kwargs: dict[str, Any] | None = None) -> float:
    """Peak memory of one call above what was held before it, MiB (see the module docstring)."""
    if device.startswith("cuda"):
        call = _call(model_name, side, batch, mode, device, model_kwargs)
        call()
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        call()
        synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20
    spec = json.dumps(dict(model=model_name, side=side, batch=batch, mode=mode, threads=torch.get_num_threads(),
                           model_kwargs=model_kwargs or {}))
    # Large blocks mmap'd, as in weightformer.bench.memory, so that what one call frees goes back to the OS
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    proc = subprocess.run([sys.executable, "-m", "weightformer.bench.dit", "--memory-worker", spec],
                          capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"memory worker for {spec} failed ({proc.returncode}): {last}")
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["peak_mib"])


def _memory_worker(spec_text: str) -> None:
    spec = json.loads(spec_text)
    torch.set_num_threads(spec["threads"])
    call = _call(spec["model"], spec["side"], spec["batch"], spec["mode"], "cpu", spec["model_kwargs"])
    call()
    before = _proc_status_kib("VmRSS")
    _reset_peak_rss()
    call()
    print(json.dumps({"peak_mib": (_proc_status_kib("VmHWM") - before) / 1024}))


def benchmark(models: Sequence[str], sides: Sequence[int], batch: int = 1, repeats: int = 3,
              max_seconds: float = 20.0, device: str = "cpu", memory: bool = True,
              model_kwargs: dict[str, Any] | None = None,
              on_side: Callable[[list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
    """One row per (side, mode, model): median seconds per call and peak MiB, or the reason it was skipped.
    ``model_kwargs`` override the variants' arguments (smaller models for tests); ``on_side`` gets the
    rows so far after each side (to save partial results)."""
    rows: list[dict[str, Any]] = []
    stopped: dict[tuple[str, str], int] = {}
    for side in sides:
        for mode in MODES:
            live = [m for m in models if (m, mode) not in stopped]
            calls = {m: _call(m, side, batch, mode, device, model_kwargs) for m in live}
            first = {m: time_call(fn, device) for m, fn in calls.items()}  # warm-up, and the cut-off test
            timed = {m: fn for m, fn in calls.items() if first[m] <= max_seconds}
            samples = round_robin(timed, repeats, device, {}) if timed else {}
            for m in models:
                row: dict[str, Any] = {"model": m, "side": side, "pixels": side * 8, "tokens": (side // int(m[-1])) ** 2,
                                       "mode": mode, "batch": batch}
                if m not in live:
                    row["skipped"] = f"a smaller side took over {max_seconds:g} s"
                elif m not in timed:
                    row.update(seconds=first[m], skipped=f"one call took {first[m]:.1f} s > {max_seconds:g} s")
                    stopped[(m, mode)] = side
                else:
                    row["seconds"] = median(samples[m])
                    if memory:
                        row["peak_mib"] = _peak_memory_mib(m, side, batch, mode, device, model_kwargs)
                rows.append(row)
                print(json.dumps(row), flush=True)
            del calls
        if on_side is not None:
            on_side(rows)
    return rows


def _markdown(rows: list[dict[str, Any]], machine: dict[str, Any], args: argparse.Namespace,
              sides: Sequence[int]) -> str:
    wf, attn = args.models
    lines = [f"# WF-DiT vs DiT: time and peak memory by latent side ({machine.get('device', 'cpu')})",
             "", f"Machine: {describe(machine)}", "",
             (f"Batch {args.batch}, 4 latent channels, median of {args.repeats} interleaved repetitions; "
              f"peak memory above the resident set before the call. Command: `weightformer bench dit "
              f"{' '.join(args.argv)}`."), "", ANCHOR, "",
             f"| side (px) | tokens | mode | {wf} s | {attn} s | speed-up | {wf} MiB | {attn} MiB | memory saved |",
             "|---|---|---|---|---|---|---|---|---|"]
    index = {(r["model"], r["side"], r["mode"]): r for r in rows}
    for side in sides:
        for mode in MODES:
            a, b = index[(wf, side, mode)], index[(attn, side, mode)]

            def cell(r: dict[str, Any], key: str, fmt: str) -> str:
                if key == "seconds" and "seconds" in r and "skipped" in r:  # the one (warm-up) call that hit the cut-off
                    return f"{r['seconds']:.1f} (1 call, cut off)"
                return format(r[key], fmt) if key in r and "skipped" not in r else ("skipped" if "skipped" in r else "-")

            ok = "skipped" not in a and "skipped" not in b
            speed = f"{b['seconds'] / a['seconds']:.2f}x" if ok else "-"
            saved = (f"{100 * (1 - a['peak_mib'] / b['peak_mib']):.1f}%" if ok and "peak_mib" in a and b["peak_mib"] > 0
                     else "-")
            lines.append(f"| {side} ({side * 8}) | {a['tokens']} | {mode} | {cell(a, 'seconds', '.3f')} | "
                         f"{cell(b, 'seconds', '.3f')} | {speed} | {cell(a, 'peak_mib', '.0f')} | "
                         f"{cell(b, 'peak_mib', '.0f')} | {saved} |")
    return "\n".join(lines) + "\n"


OUTPUT_NAMES = ("dit.json", "dit.md")


def build_parser() -> argparse.ArgumentParser:
    """The options of ``weightformer bench dit``; a bad one (a number that is not finite or out of
    range included) is one ``error:`` line and exit status 2."""
    p = argparse.ArgumentParser(prog="weightformer bench dit", description=" ".join(__doc__.split("\n\n")[0].split()))
    p.error = one_line_error(p)  # type: ignore[method-assign]
    p.add_argument("--models", nargs=2, default=["wf_dit_s_2", "dit_s_2"], metavar=("WF_DIT", "DIT"),
                   help="the two variants compared (default: wf_dit_s_2 dit_s_2)")
    p.add_argument("--sides", type=number(1, integer=True), nargs="+", default=[32, 64, 128, 256],
                   help="latent sides, 8 px each, multiples of the patch sizes (default: 32 64 128 256, i.e. 256 "
                        "to 2048 px)")
    p.add_argument("--batch", type=number(1, integer=True), default=1, help="default: %(default)s")
    p.add_argument("--repeats", type=number(1, integer=True), default=3,
                   help="interleaved repetitions per point (default: %(default)s)")
    p.add_argument("--max-seconds", type=number(0, inclusive=False), default=20.0,
                   help="stop growing a model once one call takes longer, seconds > 0 (default: %(default)s)")
    p.add_argument("--device", default=default_device(), help="cpu, cuda, cuda:N or auto (default: %(default)s, here)")
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
    args.argv = argv

    def run() -> int:
        unknown = [m for m in args.models if m not in DIT_VARIANTS]
        if unknown:
            raise ConfigError(f"unknown model(s) {unknown}; choose from {', '.join(DIT_VARIANTS)}")
        if args.models[0] == args.models[1]:
            raise ConfigError(f"--models names {args.models[0]} twice; pass the two variants to compare")
        bad = [s for s in args.sides if any(s % int(m[-1]) for m in args.models)]
        if bad:
            raise ConfigError(f"--sides must be multiples of the models' patch sizes "
                              f"({', '.join(sorted({m[-1] for m in args.models}))}), got {bad}")
        args.device = check_device(args.device)  # one line for cuda without a GPU, as every bench command
        args.out = args.out or str(Path("benchmarks/results") / torch.device(args.device).type / "dit")
        out = Path(args.out)
        machine = machine_info(args.device)

        def save(rows: list[dict[str, Any]]) -> None:  # after every side: a long sweep keeps what it measured
            done = sorted({r["side"] for r in rows})
            document = {"machine": machine, "config": {k: v for k, v in vars(args).items() if k != "memory_worker"},
                        "sides_done": done, "anchor": ANCHOR, "rows": rows}
            write_atomic(out / "dit.json", (json.dumps(document, indent=2) + "\n").encode())
            write_atomic(out / "dit.md", _markdown(rows, machine, args, done).encode())

        with removed_if_failed(out):
            claim_out_dir(out, OUTPUT_NAMES, args.overwrite, "weightformer bench dit",
                          log=lambda message: print(message, flush=True))
            benchmark(args.models, sorted(set(args.sides)), args.batch, args.repeats, args.max_seconds, args.device,
                      not args.no_memory, on_side=save)
        print(f"wrote {out / 'dit.json'} and {out / 'dit.md'}")
        return 0

    return run_reporting_errors(run)


if __name__ == "__main__":
    sys.exit(main())
