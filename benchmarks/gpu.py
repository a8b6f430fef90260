"""The GPU comparison: WeightFormer-T against DeiT-T at 1248² (and 224²), bf16, each at its largest batch.

    python benchmarks/gpu.py [--resolutions 1248,224] [--models wf-t,deit-t,deit-t-explicit]
                             [--runtimes eager,compile] [--max-batch 1024]

For each resolution, runtime and model: find the largest inference batch that fits in GPU memory (doubling,
then bisection, under bf16 autocast and inference mode, capped at ``--max-batch``), time it side by side
with the other models (median of ``--repetitions`` interleaved rounds), and record
``torch.cuda.max_memory_allocated``. ``compile`` is ``torch.compile(model, dynamic=True)``: one graph per
model serves every batch of the search and every resolution; ``eager`` runs the modules as they are.
Memory is compared two ways, both written: each model's peak at its own largest batch (which fills
the GPU for both, so its ratio says little) and the peak at each baseline's largest batch (DeiT-T with
fused attention, and with explicit attention), which is the comparison the target's "no more than 9% of
its peak memory" refers to. A model whose largest batch is smaller than a baseline's has no figure there.
Target (1248²): WeightFormer-T throughput >= 7.7× DeiT-T's, at <= 9% of its peak memory, against each
baseline.

After the first resolution, an agreement check: WeightFormer-T (random weights) at odd, non-square and
large sizes, compiled against eager in fp32, and bf16 autocast (eager and compiled) against eager fp32:
the relative difference of the logits, ‖a − b‖ / ‖b‖, and whether every logit is finite.

Writes benchmarks/results/gpu/gpu_<gpu name>.json (``--out-dir``) after each stage, so a run cut short keeps what
it measured; an earlier result of the same GPU is refused unless ``--overwrite`` moves it aside.
``benchmarks/run_gpu.sh`` runs this after a profile of eager WeightFormer-T, in the order a short lease affords.
"""

import argparse
import gc
import re
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import torch

from weightformer.bench.memory import cuda_peak
from weightformer.engine.errors import ConfigError
from weightformer.bench.results import claim_out_dir, describe, machine_info, write_results
from weightformer.bench.subjects import INFER, get_subject, make_call
from weightformer.bench.timing import iterations_for, median, time_call

DTYPE = torch.bfloat16
RUNTIMES = ("compile", "eager")
BASELINES = ("deit-t", "deit-t-explicit")  # DeiT-T with fused (SDPA) and with explicit softmax(QKᵀ)V attention
# (height, width): 3×2 and 2×3 tokens (one pooled token), an odd 13×17 grid, 224² and 1248²
AGREEMENT_SIZES = [(48, 32), (32, 48), (208, 272), (224, 224), (1248, 1248)]


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
    except RuntimeError as error:  # Inductor's autotuning reports a failed allocation as a CUDA error
        if "out of memory" not in str(error):
            raise
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


def parse_runtimes(text: str) -> List[str]:
    runtimes = [r for r in text.split(",") if r]
    unknown = [r for r in runtimes if r not in RUNTIMES]
    if unknown or not runtimes:
        raise ConfigError(f"--runtimes must be a comma-separated list of {', '.join(RUNTIMES)}, got {text!r}")
    return runtimes


def runner(model: torch.nn.Module, runtime: str) -> torch.nn.Module:
    return torch.compile(model, dynamic=True) if runtime == "compile" else model


def compare(models: List[str], resolution: int, device: str, max_batch: int, repetitions: int,
            runtime: str = "compile") -> Dict[str, dict]:
    """Largest batch, throughput (median over interleaved rounds) and peak memory of each model at ``resolution``."""
    built = {key: runner(get_subject("cls", key).build(resolution, device), runtime) for key in models}
    results: Dict[str, dict] = {}
    for key, model in built.items():
        start = time.perf_counter()
        batch = largest_batch(model, resolution, device, max_batch)
        results[key] = {"largest_batch": batch, "batch_capped": batch == max_batch, "samples_s": [],
                        "search_s": time.perf_counter() - start}  # compilation included, when compiled
        print(f"  {key}: largest batch {batch} (search {results[key]['search_s']:.0f} s)", flush=True)
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
    for baseline in (key for key in BASELINES if key in runnable):
        common = results[baseline]["largest_batch"]
        for key, model in runnable.items():  # a model whose largest batch is smaller has no figure at this one
            if results[key]["largest_batch"] >= common:
                results[key].setdefault("memory_at_batch_of", {})[baseline] = peak_memory(
                    model, common, resolution, device)
    return results


def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖ in fp32."""
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()


def agreement(device: str, batch: int = 2) -> Dict[str, dict]:
    """WeightFormer-T's logits at each of ``AGREEMENT_SIZES``: compiled fp32, eager bf16 and compiled bf16
    against eager fp32 (relative difference), and whether each is finite."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model("weightformer_tiny").to(device).eval()
    compiled = torch.compile(model, dynamic=True)
    rows: Dict[str, dict] = {}
    for height, width in AGREEMENT_SIZES:
        torch.manual_seed(1)
        images = torch.randn(batch, 3, height, width, device=device)
        with torch.inference_mode():
            reference = model(images)
            outputs = {"compile_fp32": compiled(images)}
            with torch.autocast(device_type=torch.device(device).type, dtype=DTYPE):
                outputs["eager_bf16"] = model(images)
                outputs["compile_bf16"] = compiled(images)
        row = {"finite": bool(reference.isfinite().all()) and all(bool(o.isfinite().all()) for o in outputs.values())}
        row.update({name: relative_difference(out, reference) for name, out in outputs.items()})
        rows[f"{height}x{width}"] = row
        print(f"  {height}×{width}: " + ", ".join(f"{k} {v:.2e}" if isinstance(v, float) else f"{k} {v}"
                                                  for k, v in row.items()), flush=True)
    _release()
    return {"batch": batch, "model": "weightformer_tiny, random weights (seed 0)",
            "allow_tf32": {"matmul": torch.backends.cuda.matmul.allow_tf32, "cudnn": torch.backends.cudnn.allow_tf32},
            "sizes": rows}


def targets(results: Dict[str, dict], runtime: str) -> List[Dict[str, object]]:
    """The GPU targets at 1248², from ``compare``'s results, against each DeiT-T baseline that ran."""
    wf = results.get("wf-t", {})
    rows: List[Dict[str, object]] = []
    for baseline in BASELINES:
        deit = results.get(baseline, {})
        if "img_per_s" not in wf or "img_per_s" not in deit:
            continue
        speed = wf["img_per_s"] / deit["img_per_s"]
        memory = wf["memory_at_batch_of"][baseline]["peak_gib"] / deit["memory_at_batch_of"][baseline]["peak_gib"]
        rows += [
            {"target": f"1248² bf16 throughput, largest batches: WeightFormer-T / {baseline}", "runtime": runtime,
             "measured": speed, "threshold": 7.7, "comparison": ">=", "met": speed >= 7.7},
            {"target": f"1248² bf16 peak memory at {baseline}'s largest batch: WeightFormer-T / {baseline}",
             "runtime": runtime, "measured": memory, "threshold": 0.09, "comparison": "<=", "met": memory <= 0.09},
        ]
    return rows or [{"target": "GPU 1248² targets", "runtime": runtime, "met": None,
                     "detail": "WeightFormer-T or every DeiT-T baseline did not run"}]


def result_name(gpu: str) -> str:
    """The result file of a GPU: ``gpu_<its name in lower case, runs of other characters as _>.json``."""
    return "gpu_" + re.sub(r"[^a-z0-9]+", "_", gpu.lower()).strip("_") + ".json"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="wf-t,deit-t,deit-t-explicit", help="comma-separated model keys")
    parser.add_argument("--resolutions", default="1248,224", help="comma-separated image sides")
    parser.add_argument("--runtimes", default="eager,compile", help="comma-separated, measured in the order given: eager, compile")
    parser.add_argument("--max-batch", type=int, default=1024, help="stop the batch search here")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--no-agreement", action="store_true", help="skip the compiled/bf16 agreement check")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out-dir", type=Path, default=Path("benchmarks/results/gpu"))
    parser.add_argument("--overwrite", action="store_true", help="move an earlier result of this GPU aside first")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: benchmarks/gpu.py needs a CUDA GPU; none is visible (torch.cuda.is_available() is False)",
              file=sys.stderr)
        return 2
    machine = machine_info(args.device)
    name = result_name(machine["gpu"])
    try:
        runtimes = parse_runtimes(args.runtimes)
        # before the measurements, not after them: the folder is writable and no earlier result is lost
        claim_out_dir(args.out_dir, [name], args.overwrite, "benchmarks/gpu.py", flag="--out-dir")
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"machine: {describe(machine)}", flush=True)
    document = {"machine": machine, "dtype": "bfloat16 autocast", "mode": "inference",
                "compile": "torch.compile(model, dynamic=True)", "max_batch": args.max_batch, "runtimes": {}}

    def write() -> None:
        write_results(args.out_dir, {name: document})

    for index, resolution in enumerate(int(r) for r in args.resolutions.split(",") if r):
        for runtime in runtimes:
            print(f"resolution {resolution}, {runtime}", flush=True)
            results = compare([m for m in args.models.split(",") if m], resolution, args.device, args.max_batch,
                              args.repetitions, runtime)
            document["runtimes"].setdefault(runtime, {})[str(resolution)] = results
            if resolution == 1248:
                document.setdefault("targets", []).extend(targets(results, runtime))
            write()
        if index == 0 and not args.no_agreement:
            print("agreement: WeightFormer-T logits against eager fp32", flush=True)
            document["agreement"] = agreement(args.device)
            write()
    for t in document.get("targets", []):
        status = {True: "met", False: "NOT MET", None: "not measured"}[t["met"]]
        print(f"{t['target']} ({t['runtime']}): {t.get('measured', float('nan')):.3f} "
              f"({t.get('comparison', '')} {t.get('threshold', '')}) {status}")
    print(f"wrote {args.out_dir / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
