"""CPU throughput of one model in three runtimes: PyTorch eager, ``torch.compile(dynamic=True)`` and
onnxruntime (a dynamic-size ONNX export), at several image sizes with one compiled program and one
ONNX file for all of them.

    python -m weightformer.export.bench --out benchmarks/results/cpu/export

Each round times every (runtime, size) once, in turn, so slow drifts of a shared machine spread over
all of them; the figures are medians over rounds. The compiled model runs with
``torch._dynamo.config.error_on_recompile``: one compilation serves every size, or the run fails.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import timm
import torch

from ..bench.machine import machine_info, provenance
from .onnx import to_onnx

__all__ = ["main", "measure"]

# (batch, height, width). Non-square first: a square first input makes Dynamo "duck size" height and
# width into one symbol, and the non-square point would then compile a second time.
POINTS = ((4, 320, 256), (8, 224, 224), (2, 448, 448))


def _timed(call: Callable[[], object], repeats: int) -> float:
    """Median seconds of ``repeats`` calls."""
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def measure(model_name: str = "weightformer_tiny", points=POINTS, rounds: int = 5, repeats: int = 2,
            threads: int = 1) -> dict:
    """Images per second (median over ``rounds``) of eager, compiled and onnxruntime at each point, plus
    the one-off costs: compilation (first call) and ONNX export."""
    import onnxruntime as ort

    torch.set_num_threads(threads)
    model = timm.create_model(model_name).eval()
    inputs = {p: torch.randn(p[0], 3, p[1], p[2]) for p in points}
    result: dict = {"model": model_name, "threads": threads, "rounds": rounds, "repeats": repeats}

    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        to_onnx(model, Path(tmp) / "model.onnx", check_at=[(1, 320, 256), (3, 208, 272)])
        result["onnx_export_s"] = time.perf_counter() - start
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        session = ort.InferenceSession(str(Path(tmp) / "model.onnx"), options, providers=["CPUExecutionProvider"])

    compiled = torch.compile(model, dynamic=True)
    torch._dynamo.config.error_on_recompile = True
    compile_s = {}
    with torch.no_grad():
        for p, x in inputs.items():
            start = time.perf_counter()
            compiled(x)
            compile_s["x".join(map(str, p))] = time.perf_counter() - start
    result["compile_first_calls_s"] = compile_s

    runners = {
        "eager": lambda x: model(x),
        "compile": lambda x: compiled(x),
        "onnxruntime": lambda x: session.run(None, {"images": x.numpy()}),
    }
    seconds: dict = {(name, p): [] for name in runners for p in points}
    with torch.no_grad():
        for name, run in runners.items():  # warm-up
            for p, x in inputs.items():
                run(x)
        for _ in range(rounds):
            for p, x in inputs.items():
                for name, run in runners.items():
                    seconds[(name, p)].append(_timed(lambda run=run, x=x: run(x), repeats))
    result["points"] = [
        {"runtime": name, "batch": p[0], "height": p[1], "width": p[2],
         "img_per_s": p[0] / statistics.median(seconds[(name, p)]),
         "seconds_per_call": [round(s, 5) for s in seconds[(name, p)]]}
        for name in runners for p in points
    ]
    check = torch.randn(2, 3, 208, 272)
    with torch.no_grad():
        ref = model(check).numpy()
        result["max_abs_diff_208x272"] = {
            "compile": float(np.abs(compiled(check).numpy() - ref).max()),
            "onnxruntime": float(np.abs(session.run(None, {"images": check.numpy()})[0] - ref).max()),
        }
    torch._dynamo.config.error_on_recompile = False
    return result


def markdown(result: dict, provenance_lines: str) -> str:
    """A table of img/s per size and runtime, with the speed-ups over eager, under ``provenance_lines``
    (the machine, its load at the start and the command: ``bench.machine.provenance``)."""
    lines = [f"# {result['model']}: eager vs torch.compile vs onnxruntime (CPU)", "",
             provenance_lines, "",
             (f"{result['threads']} thread(s) for every runtime; median of {result['rounds']} "
              f"interleaved rounds of {result['repeats']} calls; random weights; fp32."), "",
             "| batch × size | eager img/s | torch.compile img/s | onnxruntime img/s | compile / eager | ort / eager |",
             "|---|---|---|---|---|---|"]
    by = {(r["runtime"], r["batch"], r["height"], r["width"]): r["img_per_s"] for r in result["points"]}
    for runtime, b, h, w in by:
        if runtime != "eager":
            continue
        e, c, o = by[("eager", b, h, w)], by[("compile", b, h, w)], by[("onnxruntime", b, h, w)]
        lines.append(f"| {b} × {h}×{w} | {e:.1f} | {c:.1f} | {o:.1f} | {c / e:.2f}× | {o / e:.2f}× |")
    compile_s = ", ".join(f"{k}: {v:.0f} s" for k, v in result["compile_first_calls_s"].items())
    lines += ["", (f"One ONNX file and one compiled program serve every size (compiled with "
                   f"`error_on_recompile`). First calls of the compiled model (compilation included): {compile_s}. "
                   f"ONNX export and onnxruntime check: {result['onnx_export_s']:.0f} s. Largest |difference| from "
                   f"eager at 2×208×272: {result['max_abs_diff_208x272']}."), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m weightformer.export.bench", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="weightformer_tiny")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="benchmarks/results/cpu/export")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    info = machine_info("cpu")  # before measuring: the load average the measurements began under
    result = measure(args.model, rounds=args.rounds, repeats=args.repeats, threads=args.threads)
    result["machine"] = info
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "runtimes.json").write_text(json.dumps(result, indent=2) + "\n")
    table = markdown(result, provenance(info))
    (out / "runtimes.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
