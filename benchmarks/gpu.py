"""The GPU comparison: WeightFormer-T against DeiT-T at 1248² (and 224²), bf16, each at its largest batch.

    python benchmarks/gpu.py [--resolutions 1248,224] [--models wf-t,deit-t,deit-t-explicit] [--no-compile]

For each model and resolution: find the largest inference batch that fits in GPU memory (doubling,
then bisection, under bf16 autocast and inference mode, capped at ``--max-batch``), time it side by
side with the other models (median of ``--repetitions`` interleaved rounds), and record
``torch.cuda.max_memory_allocated``. The models run compiled (``torch.compile``) unless ``--no-compile``.
Memory is compared two ways, both written: each model's peak at its own largest batch (which fills
the GPU for both, so its ratio says little) and the peak at one common batch, DeiT-T's largest,
which is the comparison the target's "no more than 9% of its peak memory" refers to.
Target (1248²): WeightFormer-T throughput >= 7.7× DeiT-T's, at <= 9% of its peak memory.
Writes benchmarks/results/gpu/gpu_<gpu name>.json.
"""

import argparse
import gc
import json
import re
import sys
from pathlib import Path
from typing import Dict, List, Optional

import torch

from weightformer.bench.memory import cuda_peak
from weightformer.engine.errors import ConfigError
from weightformer.bench.results import check_out_dir, describe, machine_info
from weightformer.bench.subjects import INFER, get_subject, make_call
from weightformer.bench.timing import iterations_for, median, time_call

DTYPE = torch.bfloat16


def _images(batch: int, resolution: int, device: str) -> torch.Tensor:
    # Made on the GPU in bf16: a host-side fp32 batch of thousands of 1248² images would not fit in RAM.
    return torch.randn(batch, 3, resolution, resolution, device=device, dtype=DTYPE)


def inference_call(model: torch.nn.Module, images: torch.Tensor, dtype: torch.dtype):
    return make_call(get_subject("cls", "wf-t"), model, INFER, (images,), dtype=dtype)


def _release() -> None:
    gc.collect()
    torch.cuda.empty_cache()


def _fits(model: torch.nn.Module, batch: int, resolution: int, device: str) -> bool:
    try:
        inference_call(model, _images(batch, resolution, device), DTYPE)()
        torch.cuda.synchronize(device)
        return True
    except torch.OutOfMemoryError:
        return False
    finally:
        _release()


def largest_batch(model: torch.nn.Module, resolution: int, device: str, max_batch: int) -> int:
    """The largest inference batch of ``model`` at ``resolution`` that runs without running out of memory."""
    if not _fits(model, 1, resolution, device):
        return 0
    low, high = 1, 2
    while high <= max_batch and _fits(model, high, resolution, device):
        low, high = high, high * 2
    high = min(high, max_batch + 1)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if _fits(model, mid, resolution, device) else (low, mid)
    return low


def peak_memory(model: torch.nn.Module, batch: int, resolution: int, device: str) -> Dict[str, float]:
    """Peak and extra (over the resident models) allocated GiB of one inference call at ``batch``, input included."""
    baseline, peak = cuda_peak(lambda: inference_call(model, _images(batch, resolution, device), DTYPE)(), device)
    _release()
    return {"batch": batch, "peak_gib": peak / 2**30, "extra_gib": (peak - baseline) / 2**30}


def compare(models: List[str], resolution: int, device: str, max_batch: int, repetitions: int,
            compile: bool = True) -> Dict[str, dict]:
    """Largest batch, throughput (median over interleaved rounds) and peak memory of each model at ``resolution``."""
    built = {key: get_subject("cls", key).build(resolution, device) for key in models}
    if compile:  # torch.compile's default: a second batch size compiles once more, with the batch dynamic
        built = {key: torch.compile(model) for key, model in built.items()}
    results: Dict[str, dict] = {}
    for key, model in built.items():
        batch = largest_batch(model, resolution, device, max_batch)
        results[key] = {"largest_batch": batch, "batch_capped": batch == max_batch, "samples_s": []}
        print(f"  {key}: largest batch {batch}", flush=True)
    runnable = {key: model for key, model in built.items() if results[key]["largest_batch"]}
    iterations = {}
    for key, model in runnable.items():
        results[key]["memory_at_largest_batch"] = peak_memory(model, results[key]["largest_batch"], resolution, device)
        iterations[key] = iterations_for(time_call(inference_call(
            model, _images(results[key]["largest_batch"], resolution, device), DTYPE), device), 1.0)
        _release()
    # Each model's largest batch fills the GPU on its own, so only one input is resident at a time.
    for _ in range(repetitions):
        for key, model in runnable.items():
            fn = inference_call(model, _images(results[key]["largest_batch"], resolution, device), DTYPE)
            results[key]["samples_s"].append(time_call(fn, device, iterations[key]))
            del fn
            _release()
    for key in runnable:
        seconds = median(results[key]["samples_s"])
        results[key].update(seconds_per_call=seconds, img_per_s=results[key]["largest_batch"] / seconds)
        print(f"  {key}: {results[key]['img_per_s']:.1f} img/s", flush=True)
    if "deit-t" in runnable:
        common = results["deit-t"]["largest_batch"]
        for key, model in runnable.items():
            results[key]["memory_at_deit_t_batch"] = peak_memory(model, common, resolution, device)
    return results


def targets(results: Dict[str, dict]) -> List[Dict[str, object]]:
    """The GPU targets at 1248², from ``compare``'s results."""
    wf, deit = results.get("wf-t", {}), results.get("deit-t", {})
    if "img_per_s" not in wf or "img_per_s" not in deit:
        return [{"target": "GPU 1248² targets", "met": None, "detail": "WeightFormer-T or DeiT-T did not run"}]
    speed = wf["img_per_s"] / deit["img_per_s"]
    memory = wf["memory_at_deit_t_batch"]["peak_gib"] / deit["memory_at_deit_t_batch"]["peak_gib"]
    return [
        {"target": "1248² bf16 throughput, largest batches: WeightFormer-T / DeiT-T", "measured": speed,
         "threshold": 7.7, "comparison": ">=", "met": speed >= 7.7},
        {"target": "1248² bf16 peak memory at DeiT-T's largest batch: WeightFormer-T / DeiT-T", "measured": memory,
         "threshold": 0.09, "comparison": "<=", "met": memory <= 0.09},
    ]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="wf-t,deit-t,deit-t-explicit", help="comma-separated model keys")
    parser.add_argument("--resolutions", default="1248,224", help="comma-separated image sides")
    parser.add_argument("--max-batch", type=int, default=4096, help="stop the batch search here")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--no-compile", action="store_true", help="run the models eagerly")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out-dir", type=Path, default=Path("benchmarks/results/gpu"))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: benchmarks/gpu.py needs a CUDA GPU; none is visible (torch.cuda.is_available() is False)",
              file=sys.stderr)
        return 2
    try:
        check_out_dir(args.out_dir, names=[], flag="--out-dir")  # before the measurements, not after them
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    machine = machine_info(args.device)
    print(f"machine: {describe(machine)}", flush=True)
    document = {"machine": machine, "dtype": "bfloat16 autocast", "mode": "inference",
                "compiled": not args.no_compile, "resolutions": {}}
    for resolution in (int(r) for r in args.resolutions.split(",") if r):
        print(f"resolution {resolution}", flush=True)
        document["resolutions"][str(resolution)] = compare(
            [m for m in args.models.split(",") if m], resolution, args.device, args.max_batch, args.repetitions,
            not args.no_compile)
    if "1248" in document["resolutions"]:
        document["targets"] = targets(document["resolutions"]["1248"])
        for t in document["targets"]:
            status = {True: "met", False: "NOT MET", None: "not measured"}[t["met"]]
            print(f"{t['target']}: {t.get('measured', float('nan')):.3f} "
                  f"({t.get('comparison', '')} {t.get('threshold', '')}) {status}")
    out = args.out_dir / ("gpu_" + re.sub(r"[^a-z0-9]+", "_", machine["gpu"].lower()).strip("_") + ".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
