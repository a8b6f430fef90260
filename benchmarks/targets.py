"""Every CPU target of the speed work, measured side by side in one run (fp32, 2 torch threads), and the
1248² inference-memory ratios.

    python benchmarks/targets.py [--repetitions 5] [--sweep-results benchmarks/results/cpu/results.json]
                                 [--allocator cached] [--out benchmarks/results/targets_cpu.json]

Throughput ratios are the median over rounds of each round's ratio (``timing.paired_ratio``); timings run with
glibc's malloc keeping freed memory (``--allocator cached``, as the sweep; ``system`` for glibc's defaults).

The inference-memory ratios (1248², batch 1: WeightFormer-T's extra peak over DeiT-T's with explicit
attention, target <= 9%, and with fused attention, target <= 0.7x) are taken from a sweep's results.json
when ``--sweep-results`` names one (its inference-memory rows are measured the same way, each model in a
fresh process), else measured here. Prints one line per target (measured value, threshold, met or not)
and writes the same, with the raw samples and the machine, as JSON. The GPU targets: benchmarks/gpu.py.
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

from weightformer.bench.checks import ALLOCATORS
from weightformer.bench.flops import count_flops
from weightformer.bench.memory import measure
from weightformer.bench.results import check_out_dir, describe, machine_info
from weightformer.bench.subjects import INFER, TRAIN, get_subject, prepare
from weightformer.bench.timing import iterations_for, keep_freed_memory, median, paired_ratio, side_by_side, time_call

HIGH, MID, LOW = 1248, 624, 224
TRAIN_BATCH = GEMM_BATCH = 16
GEMM_SIZE = 2048
INFERENCE_MEMORY_MODELS = ("wf-t", "deit-t", "deit-t-explicit")


def _target(name: str, measured: float, threshold: float, at_least: bool, unit: str, detail: str) -> Dict[str, Any]:
    return {"target": name, "measured": measured, "threshold": threshold, "comparison": ">=" if at_least else "<=",
            "unit": unit, "met": measured >= threshold if at_least else measured <= threshold, "detail": detail}


def _timed(calls: Dict[str, Any], repetitions: int, min_seconds: float) -> Dict[str, List[float]]:
    """Warm each call once, then time them side by side; seconds per call of every round."""
    iterations = {key: iterations_for(time_call(fn), min_seconds) for key, fn in calls.items()}
    return side_by_side(calls, repetitions, "cpu", iterations)


def _call(key: str, mode: str, resolution: int, batch: int):
    return prepare(get_subject("cls", key), mode, resolution, batch, "cpu")


def inference_targets(repetitions: int, min_seconds: float) -> tuple:
    """WeightFormer-T vs DeiT-T and vs naive at 1248², batch 1, and WeightFormer-T's 624² -> 1248² scaling."""
    points = (("wf-t", HIGH), ("wf-t-naive", HIGH), ("deit-t", HIGH), ("wf-t", MID))
    samples = _timed({f"{key}@{res}": _call(key, INFER, res, 1) for key, res in points}, repetitions, min_seconds)
    wf, naive, deit, wf_mid = (samples[f"{k}@{r}"] for k, r in points)
    return [
        _target("1248² b1 inference: WeightFormer-T / DeiT-T (fused) throughput", paired_ratio(deit, wf), 5.5, True,
                "×", f"WeightFormer-T {1 / median(wf):.3f} img/s, DeiT-T {1 / median(deit):.3f} img/s"),
        _target("624² -> 1248² (4× tokens): WeightFormer-T time ratio", paired_ratio(wf, wf_mid), 4.6, False, "×",
                f"{median(wf_mid):.3f} s -> {median(wf):.3f} s per image"),
        _target("1248² b1 inference: WeightFormer-T fast / naive throughput", paired_ratio(naive, wf), 1.15, True,
                "×", f"fast {median(wf):.3f} s, naive {median(naive):.3f} s per image"),
    ], samples


def small_inference_target(repetitions: int, min_seconds: float) -> tuple:
    """WeightFormer-S vs DeiT-S inference at 224², batch 16."""
    keys = ("wf-s", "deit-s")
    samples = _timed({key: _call(key, INFER, LOW, TRAIN_BATCH) for key in keys}, repetitions, min_seconds)
    wf, deit = (samples[k] for k in keys)
    return [
        _target("224² b16 inference: WeightFormer-S / DeiT-S (fused) throughput", paired_ratio(deit, wf), 0.97, True,
                "×", f"WeightFormer-S {TRAIN_BATCH / median(wf):.2f} img/s, "
                     f"DeiT-S {TRAIN_BATCH / median(deit):.2f} img/s"),
    ], samples


def gemm_target(pairs: int, min_seconds: float) -> tuple:
    """WeightFormer-T inference at 224², batch 16, as a share of a 2048³ fp32 matmul's GFLOP/s, timed side by side."""
    subject = get_subject("cls", "wf-t")
    model = subject.build(LOW, "cpu")
    model_flops = count_flops(model, torch.randn(GEMM_BATCH, 3, LOW, LOW)).flops
    a, b = (torch.randn(GEMM_SIZE, GEMM_SIZE, generator=torch.Generator().manual_seed(i)) for i in (0, 1))
    out = torch.empty(GEMM_SIZE, GEMM_SIZE)
    calls = {"gemm": lambda: torch.mm(a, b, out=out), "model": prepare(subject, INFER, LOW, GEMM_BATCH, "cpu", model=model)}
    seconds = _timed(calls, pairs, min_seconds)
    gemm = [2.0 * GEMM_SIZE**3 / s / 1e9 for s in seconds["gemm"]]
    forward = [model_flops / s / 1e9 for s in seconds["model"]]
    gemm_rate, model_rate = median(gemm), median(forward)
    return [_target("224² b16 inference: WeightFormer-T GFLOP/s as % of 2048³ fp32 GEMM", 100.0 * model_rate / gemm_rate,
                    60.0, True, "%", f"model {model_rate:.1f} GFLOP/s ({model_flops / GEMM_BATCH / 1e9:.3f} "
                                     f"GFLOP/img), GEMM {gemm_rate:.1f} GFLOP/s")], \
        {"gemm_gflops": gemm, "model_gflops": forward, "model_flops_per_batch": model_flops}


def training_targets(repetitions: int, min_seconds: float) -> tuple:
    """Training steps (forward, backward, AdamW) at 224², batch 16: WeightFormer-T vs DeiT-T and vs naive."""
    keys = ("wf-t", "wf-t-naive", "deit-t")
    samples = _timed({key: _call(key, TRAIN, LOW, TRAIN_BATCH) for key in keys}, repetitions, min_seconds)
    wf, naive, deit = (samples[k] for k in keys)
    return [
        _target("224² b16 training step: WeightFormer-T / DeiT-T (fused) rate", paired_ratio(deit, wf), 1.05, True,
                "×", f"WeightFormer-T {TRAIN_BATCH / median(wf):.2f} img/s, "
                     f"DeiT-T {TRAIN_BATCH / median(deit):.2f} img/s"),
        _target("224² b16 training step: WeightFormer-T fast / naive rate", paired_ratio(naive, wf), 1.1, True, "×",
                f"fast {median(wf):.3f} s, naive {median(naive):.3f} s per step"),
    ], samples


def memory_targets() -> tuple:
    """Extra peak RSS of one training step at 1248², batch 1, each in a fresh subprocess."""
    reports = {key: measure("cls", key, TRAIN, HIGH, 1) for key in ("wf-t", "wf-t-ckpt", "deit-t", "wf-t-naive")}
    extra = {key: r.extra_mib for key, r in reports.items()}
    return [
        _target("1248² b1 training step extra peak memory: WeightFormer-T / DeiT-T (fused)",
                extra["wf-t"] / extra["deit-t"], 1.0, False, "×",
                f"WeightFormer-T {extra['wf-t']:.0f} MiB, DeiT-T {extra['deit-t']:.0f} MiB, "
                f"naive {extra['wf-t-naive']:.0f} MiB"),
        _target("1248² b1 training step extra peak memory: WeightFormer-T grad-ckpt / DeiT-T (fused)",
                extra["wf-t-ckpt"] / extra["deit-t"], 0.3, False, "×",
                f"WeightFormer-T checkpointed {extra['wf-t-ckpt']:.0f} MiB"),
    ], {key: r.as_dict() for key, r in reports.items()}


def inference_memory_from_results(document: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """The 1248², batch-1 inference-memory rows of a sweep's result document, by model; ``ValueError``
    naming what is missing if one of :data:`INFERENCE_MEMORY_MODELS` was not measured there."""
    rows = {r["model"]: r for r in document["rows"] if r["measurement"] == "infer_memory"
            and r["resolution"] == HIGH and r["batch"] == 1 and r["status"] == "ok"}
    missing = [key for key in INFERENCE_MEMORY_MODELS if key not in rows]
    if missing:
        raise ValueError(f"the sweep results have no {HIGH}² batch-1 inference memory of {', '.join(missing)}")
    return {key: {"extra_mib": rows[key]["value"], **{k: rows[key][k] for k in ("peak_mib", "baseline_mib", "method")}}
            for key in INFERENCE_MEMORY_MODELS}


def measure_inference_memory(sweep_results: Optional[Path]) -> tuple:
    """The 1248² inference-memory targets from ``sweep_results`` (a sweep's results.json), or measured here."""
    if sweep_results is not None:
        reports = inference_memory_from_results(json.loads(sweep_results.read_text()))
        source = f"from {sweep_results}"
    else:
        reports = {key: measure("cls", key, INFER, HIGH, 1).as_dict() for key in INFERENCE_MEMORY_MODELS}
        source = "measured by this script"
    wf, fused, explicit = (reports[key]["extra_mib"] for key in INFERENCE_MEMORY_MODELS)
    detail = (f"extra peak of one forward over a warmed-up process, each model in a fresh process ({source}): "
              f"WeightFormer-T {wf:.0f} MiB, DeiT-T fused {fused:.0f} MiB, DeiT-T explicit {explicit:.0f} MiB")
    return [
        _target("1248² b1 inference extra peak memory: WeightFormer-T / DeiT-T (explicit attention)",
                wf / explicit, 0.09, False, "×", detail),
        _target("1248² b1 inference extra peak memory: WeightFormer-T / DeiT-T (fused)", wf / fused, 0.7, False, "×",
                detail),
    ], reports


def format_table(targets: List[Dict[str, Any]]) -> str:
    """The targets as an aligned text table."""
    width = max(len(t["target"]) for t in targets)
    lines = [f"{'target':{width}s}  {'measured':>9s}  {'threshold':>11s}  status"]
    for t in targets:
        value, threshold = f"{t['measured']:.2f}{t['unit']}", f"{t['comparison']} {t['threshold']:g}{t['unit']}"
        lines.append(f"{t['target']:{width}s}  {value:>9s}  {threshold:>11s}  {'met' if t['met'] else 'NOT MET'}")
        lines.append(f"{'':{width}s}    {t['detail']}")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repetitions", type=int, default=5, help="interleaved rounds (and GEMM pairs)")
    parser.add_argument("--min-rep-seconds", type=float, default=0.5, help="a timed repetition lasts at least this")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--allocator", choices=ALLOCATORS, default="cached",
                        help="cached: glibc keeps freed memory for reuse while timing (as the sweep); "
                             "system: its defaults")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/targets_cpu.json"))
    parser.add_argument("--sweep-results", type=Path, default=None,
                        help="a sweep's results.json to take the 1248² inference memory from (default: measure it)")
    args = parser.parse_args(argv)
    try:
        check_out_dir(args.out.parent, names=[args.out.name], flag="--out")  # before the measurements, not after
        if args.sweep_results is not None:  # readable and holding the points, before the measurements
            inference_memory_from_results(json.loads(args.sweep_results.read_text()))
    except (OSError, ValueError, KeyError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    machine = machine_info("cpu")
    machine["allocator"] = "keeps freed memory" if args.allocator == "cached" and keep_freed_memory() else "system"
    print(f"machine: {describe(machine)}", flush=True)
    targets: List[Dict[str, Any]] = []
    raw: Dict[str, Any] = {}
    for name, run in (("inference", lambda: inference_targets(args.repetitions, args.min_rep_seconds)),
                      ("small-model inference", lambda: small_inference_target(args.repetitions, args.min_rep_seconds)),
                      ("gemm", lambda: gemm_target(args.repetitions, args.min_rep_seconds)),
                      ("training", lambda: training_targets(args.repetitions, args.min_rep_seconds)),
                      ("memory", memory_targets),
                      ("inference memory", lambda: measure_inference_memory(args.sweep_results))):
        print(f"measuring {name} targets ...", flush=True)
        found, raw[name] = run()
        targets += found
    print(format_table(targets))
    print("GPU targets (7.7× DeiT-T throughput at <= 9% of its memory, bf16, 1248²): need CUDA, see benchmarks/gpu.py")
    document = {"machine": machine, "targets": targets, "raw": raw,
                "settings": {"dtype": "float32", "threads": args.threads, "repetitions": args.repetitions,
                             "allocator": args.allocator,
                             "sweep_results": None if args.sweep_results is None else str(args.sweep_results)}}
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
