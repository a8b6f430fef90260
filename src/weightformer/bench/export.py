"""``weightformer bench export``: CPU throughput of one classifier in PyTorch eager, ``torch.compile(dynamic=True)``
(under ``error_on_recompile``: one compilation serves every size) and onnxruntime (one dynamic-size ONNX file),
timed side by side at several image sizes; medians over rounds of ``repeats`` calls.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import timm
import torch

from ..engine.run_dir import hold_run_folder
from .results import claim_out_dir, machine_info, provenance, write_results
from .subjects import suite
from .timing import median, side_by_side

__all__ = ["measure", "run_command"]

# (batch, height, width). Non-square first: a square first input makes Dynamo "duck size" height and
# width into one symbol, and the non-square point would then compile a second time.
POINTS = ((4, 320, 256), (8, 224, 224), (2, 448, 448))
FILES = ("runtimes.json", "runtimes.md")


def measure(model_name: str = "weightformer_tiny", points=POINTS, rounds: int = 5, repeats: int = 2,
            threads: int = 1) -> dict:
    """Images per second (median over ``rounds``) of every runtime at each point, with compilation and export times."""
    torch.set_num_threads(threads)
    model = timm.create_model(model_name).eval()
    inputs = {p: torch.randn(p[0], 3, p[1], p[2]) for p in points}
    result: dict = {"model": model_name, "threads": threads, "rounds": rounds, "repeats": repeats}
    runtimes = suite("export")
    runners: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        runners["onnxruntime"] = runtimes["onnxruntime"].build(model, Path(tmp), threads)
        result["onnx_export_s"] = time.perf_counter() - start
    runners["eager"], runners["compile"] = runtimes["eager"].build(model), runtimes["compile"].build(model)
    torch._dynamo.config.error_on_recompile = True
    try:
        with torch.no_grad():
            compile_s = {}
            for p, x in inputs.items():
                start = time.perf_counter()
                runners["compile"](x)
                compile_s["x".join(map(str, p))] = time.perf_counter() - start
            result["compile_first_calls_s"] = compile_s
            for run in runners.values():  # warm-up
                for x in inputs.values():
                    run(x)
            calls = {(name, p): (lambda run=runners[name], x=x: run(x)) for p, x in inputs.items() for name in runtimes}
            samples = side_by_side(calls, rounds, iterations=dict.fromkeys(calls, repeats))
            result["points"] = [
                {"runtime": name, "batch": p[0], "height": p[1], "width": p[2],
                 "img_per_s": p[0] / median(samples[(name, p)]),
                 "seconds_per_call": [round(s, 5) for s in samples[(name, p)]]}
                for name in runtimes for p in points]
            check = torch.randn(2, 3, 208, 272)
            ref = model(check).numpy()
            result["max_abs_diff_208x272"] = {name: float(np.abs(np.asarray(runners[name](check)) - ref).max())
                                              for name in ("compile", "onnxruntime")}
    finally:
        torch._dynamo.config.error_on_recompile = False
    return result


def markdown(result: dict, provenance_lines: str) -> str:
    lines = [f"# {result['model']}: eager vs torch.compile vs onnxruntime (CPU)", "", provenance_lines, "",
             (f"{result['threads']} thread(s) for every runtime; median of {result['rounds']} "
              f"interleaved rounds of {result['repeats']} calls; random weights; fp32."), "",
             "| batch × size | eager img/s | torch.compile img/s | onnxruntime img/s | compile / eager | ort / eager |",
             "|---|---|---|---|---|---|"]
    by = {(r["runtime"], r["batch"], r["height"], r["width"]): r["img_per_s"] for r in result["points"]}
    for runtime, b, h, w in by:
        if runtime == "eager":
            e, c, o = by[("eager", b, h, w)], by[("compile", b, h, w)], by[("onnxruntime", b, h, w)]
            lines.append(f"| {b} × {h}×{w} | {e:.1f} | {c:.1f} | {o:.1f} | {c / e:.2f}× | {o / e:.2f}× |")
    compile_s = ", ".join(f"{k}: {v:.0f} s" for k, v in result["compile_first_calls_s"].items())
    lines += ["", (f"One ONNX file and one compiled program serve every size (compiled with "
                   f"`error_on_recompile`). First calls of the compiled model (compilation included): {compile_s}. "
                   f"ONNX export and onnxruntime check: {result['onnx_export_s']:.0f} s. Largest |difference| from "
                   f"eager at 2×208×272: {result['max_abs_diff_208x272']}."), ""]
    return "\n".join(lines)


def run_command(args: Any, command: str) -> int:
    with hold_run_folder(args.out, "--out"):
        claim_out_dir(args.out, FILES, args.overwrite, "weightformer bench export")
        torch.set_num_threads(args.threads)
        info = machine_info("cpu", command)  # before measuring: the load average the measurements began under
        result = {**measure(args.model, rounds=args.rounds, repeats=args.repeats, threads=args.threads),
                  "machine": info}
        table = markdown(result, provenance(info))
        write_results(args.out, dict(zip(FILES, (result, table))))
    print(table)
    return 0
