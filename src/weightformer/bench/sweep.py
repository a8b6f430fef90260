"""The benchmark sweep: every model at every resolution, timed round-robin, reported as medians and ratios.

At each (resolution, mode) point the models are built side by side and timed in turn, one timed
repetition each per round, so that drifts in machine load hit every model alike. A point is skipped
(and recorded with the reason) when it is predicted to exceed the per-call time budget, from the
FLOPs of the new point and the rate the same model reached at the previous resolution, or when it
runs out of memory.
"""

import gc
import subprocess
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from . import memory
from .flops import count_flops
from .machine import machine_info
from .timing import inference_call, iterations_for, median, round_robin, time_call, training_step
from .variants import INFER, TRAIN, Variant, build_model, get_variant, param_count, random_batch

THROUGHPUT = {INFER: "infer_throughput", TRAIN: "train_throughput"}
MEMORY = {INFER: "infer_memory", TRAIN: "train_memory"}
MEASUREMENTS = ("infer", "train", "memory", "flops")
# A training step (forward, backward, optimizer) costs about three forwards.
TRAIN_COST = 3.0
# A memory point is one call, so it may take longer than a timed point's call.
MEMORY_BUDGET_FACTOR = 4.0


@dataclass
class SweepConfig:
    """What to measure. ``None`` for the train/memory resolutions means every resolution."""

    models: List[str]
    resolutions: List[int]
    batch_sizes: Dict[int, int] = field(default_factory=dict)  # resolution -> batch
    default_batch: int = 1
    measurements: Tuple[str, ...] = MEASUREMENTS
    train_resolutions: Optional[List[int]] = None
    memory_resolutions: Optional[List[int]] = None
    memory_modes: Tuple[str, ...] = (TRAIN,)
    repetitions: int = 3
    min_rep_seconds: float = 1.0
    max_call_seconds: float = 15.0
    device: str = "cpu"
    dtype: str = "float32"
    threads: Optional[int] = None

    def __post_init__(self) -> None:
        for key in self.models:
            get_variant(key)
        unknown = set(self.measurements) - set(MEASUREMENTS)
        if unknown:
            raise ValueError(f"unknown measurements {sorted(unknown)}; choose from {MEASUREMENTS}")
        if self.repetitions < 1:
            raise ValueError(f"repetitions must be >= 1, got {self.repetitions}")

    def batch_for(self, resolution: int) -> int:
        return self.batch_sizes.get(resolution, self.default_batch)

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


def _is_oom(error: BaseException) -> bool:
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()


def _release(device: str) -> None:
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def _row(variant: Variant, resolution: int, batch: int, measurement: str, **fields: Any) -> Dict[str, Any]:
    grid = -(-resolution // 16)  # every benchmarked model has 16×16 patches
    row = {
        "model": variant.key,
        "label": variant.label,
        "family": variant.family,
        "baseline_model": variant.baseline,
        "resolution": resolution,
        "tokens": grid * grid,
        "batch": batch,
        "measurement": measurement,
        "status": "ok",
        "value": None,
        "unit": None,
        "ratio_vs_baseline": None,
        "seconds_per_call": None,
        "samples_s": [],
        "iterations": None,
        "peak_mib": None,
        "baseline_mib": None,
        "method": None,
        "reason": "",
    }
    row.update(fields)
    return row


def planned_flops(variant: Variant, resolution: int) -> int:
    """Per-image FLOPs of ``variant`` at ``resolution``, counted on the meta device (no compute, no memory)."""
    model = build_model(variant, resolution, "meta")
    return count_flops(model, torch.empty(1, 3, resolution, resolution, device="meta")).flops


class Sweep:
    """Runs a ``SweepConfig`` and collects result rows; ``run`` returns the whole result document."""

    def __init__(self, config: SweepConfig, log: Callable[[str], None] = print):
        self.config = config
        self.log = log
        self.rows: List[Dict[str, Any]] = []
        self.flops: List[Dict[str, Any]] = []
        # (model, mode) -> FLOP/s reached at the last measured point, for predicting the next one.
        self.rates: Dict[Tuple[str, str], float] = {}

    # ---------------------------------------------------------------------------------------------
    # planning
    # ---------------------------------------------------------------------------------------------
    def _predicted_seconds(self, variant: Variant, mode: str, flops_per_call: float) -> Optional[float]:
        """Seconds one call should take, from the FLOP rate the model reached last; None if never measured."""
        rate = self.rates.get((variant.key, mode))
        if rate is not None:
            return flops_per_call / rate
        # Fall back on the model's inference rate (checkpointed variants: that of the plain variant).
        rate = self.rates.get((variant.key.removesuffix("-ckpt"), INFER))
        if rate is None:
            return None
        return flops_per_call / rate * (TRAIN_COST if mode == TRAIN else 1.0)

    def _over_budget(self, variant: Variant, mode: str, flops_per_call: float, budget: float) -> Optional[str]:
        predicted = self._predicted_seconds(variant, mode, flops_per_call)
        if predicted is not None and predicted > budget:
            return f"predicted {predicted:.1f} s per call exceeds the {budget:g} s budget"
        return None

    # ---------------------------------------------------------------------------------------------
    # measurement
    # ---------------------------------------------------------------------------------------------
    def _timed_point(self, resolution: int, mode: str, variants: Sequence[Variant], plan: Dict[str, int]) -> None:
        cfg = self.config
        batch = cfg.batch_for(resolution)
        measurement = THROUGHPUT[mode]
        calls: Dict[str, Callable[[], None]] = {}
        iterations: Dict[str, int] = {}
        for variant in variants:
            reason = self._over_budget(variant, mode, plan[variant.key] * batch, cfg.max_call_seconds)
            if reason is None:
                try:
                    model = build_model(variant, resolution, cfg.device)
                    images, labels = random_batch(batch, resolution, cfg.device)
                    if mode == INFER:
                        fn = inference_call(model, images, cfg.torch_dtype)
                    else:
                        fn = training_step(model, images, labels, cfg.torch_dtype)
                    warm = time_call(fn, cfg.device)
                    if warm > 2 * cfg.max_call_seconds:
                        reason = f"warm-up call took {warm:.1f} s, over twice the {cfg.max_call_seconds:g} s budget"
                    else:
                        calls[variant.key] = fn
                        iterations[variant.key] = iterations_for(warm, cfg.min_rep_seconds)
                except RuntimeError as error:
                    if not _is_oom(error):
                        raise
                    reason = f"out of memory: {str(error).splitlines()[0]}"
                    _release(cfg.device)
            if reason is not None:
                self.log(f"  skip {variant.key} {mode} {resolution}px: {reason}")
                self.rows.append(_row(variant, resolution, batch, measurement, status="skipped", reason=reason))
        samples = round_robin(calls, cfg.repetitions, cfg.device, iterations)
        for variant in variants:
            if variant.key not in calls:
                continue
            seconds = median(samples[variant.key])
            self.rates[(variant.key, mode)] = plan[variant.key] * batch / seconds
            self.log(f"  {variant.key:16s} {mode} {resolution}px b{batch}: {batch / seconds:8.2f} img/s")
            self.rows.append(
                _row(
                    variant,
                    resolution,
                    batch,
                    measurement,
                    value=batch / seconds,
                    unit="img/s",
                    seconds_per_call=seconds,
                    samples_s=samples[variant.key],
                    iterations=iterations[variant.key],
                )
            )
        calls.clear()
        _release(cfg.device)

    def _flops_point(self, resolution: int, variants: Sequence[Variant], plan: Dict[str, int]) -> None:
        cfg = self.config
        for variant in variants:
            if variant.grad_checkpointing:
                continue  # same forward as the variant without checkpointing
            # Counting runs one forward; past the budget, count on the meta device instead (same ops, no data).
            too_slow = self._over_budget(variant, INFER, plan[variant.key], cfg.max_call_seconds) is not None
            where = "meta" if too_slow else cfg.device
            model = build_model(variant, resolution, where)
            report = count_flops(model, torch.randn(1, 3, resolution, resolution).to(where))
            entry = {"model": variant.key, "resolution": resolution, "params": param_count(model)}
            entry.update(report.as_dict(), counted_on=where)
            self.flops.append(entry)
            del model
            _release(cfg.device)

    def _memory_point(self, resolution: int, mode: str, variants: Sequence[Variant], plan: Dict[str, int]) -> None:
        cfg = self.config
        batch = cfg.batch_for(resolution)
        for variant in variants:
            budget = MEMORY_BUDGET_FACTOR * cfg.max_call_seconds
            reason = self._over_budget(variant, mode, plan[variant.key] * batch, budget)
            report = None
            if reason is None:
                try:
                    report = memory.measure(
                        variant.key, mode, resolution, batch, cfg.device, cfg.torch_dtype, timeout_s=4 * budget + 60
                    )
                except subprocess.TimeoutExpired as error:
                    reason = f"memory worker ran past its {error.timeout:.0f} s timeout"
                except RuntimeError as error:
                    if not _is_oom(error):
                        raise
                    reason = f"out of memory: {str(error).splitlines()[0]}"
                    _release(cfg.device)
            if report is None:
                self.log(f"  skip {variant.key} {mode} memory {resolution}px: {reason}")
                self.rows.append(_row(variant, resolution, batch, MEMORY[mode], status="skipped", reason=reason))
                continue
            self.log(f"  {variant.key:16s} {mode} memory {resolution}px b{batch}: {report.extra_mib:8.1f} MiB extra")
            self.rows.append(
                _row(
                    variant,
                    resolution,
                    batch,
                    MEMORY[mode],
                    value=report.extra_mib,
                    unit="MiB",
                    peak_mib=report.peak_mib,
                    baseline_mib=report.baseline_mib,
                    method=report.method,
                )
            )

    # ---------------------------------------------------------------------------------------------
    # the sweep
    # ---------------------------------------------------------------------------------------------
    def run(self) -> Dict[str, Any]:
        """Measure everything in the config; return {machine, config, rows, flops, elapsed_s}."""
        cfg = self.config
        threads = torch.get_num_threads()
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        try:
            return self._run()
        finally:
            torch.set_num_threads(threads)

    def _run(self) -> Dict[str, Any]:
        cfg = self.config
        start = time.perf_counter()
        variants = [get_variant(key) for key in cfg.models]
        train_res = cfg.resolutions if cfg.train_resolutions is None else cfg.train_resolutions
        memory_res = cfg.resolutions if cfg.memory_resolutions is None else cfg.memory_resolutions
        for resolution in cfg.resolutions:
            self.log(f"resolution {resolution}px, batch {cfg.batch_for(resolution)}")
            plan = {v.key: planned_flops(v, resolution) for v in variants}
            if "infer" in cfg.measurements:
                self._timed_point(resolution, INFER, [v for v in variants if INFER in v.modes], plan)
            if "flops" in cfg.measurements:
                self._flops_point(resolution, variants, plan)
            if "train" in cfg.measurements and resolution in train_res:
                self._timed_point(resolution, TRAIN, [v for v in variants if TRAIN in v.modes], plan)
            if "memory" in cfg.measurements and resolution in memory_res:
                for mode in cfg.memory_modes:
                    self._memory_point(resolution, mode, [v for v in variants if mode in v.modes], plan)
        attach_ratios(self.rows)
        attach_flops(self.rows, self.flops)
        return {
            "machine": machine_info(cfg.device),
            "config": asdict(cfg),
            "elapsed_s": round(time.perf_counter() - start, 1),
            "rows": self.rows,
            "flops": self.flops,
        }


def attach_ratios(rows: List[Dict[str, Any]]) -> None:
    """Set each ok row's ``ratio_vs_baseline``: its median over its baseline model's, at the same point.

    For throughput the ratio above 1 means faster than the baseline; for memory, below 1 means less.
    """
    index = {(r["model"], r["resolution"], r["batch"], r["measurement"]): r for r in rows if r["status"] == "ok"}
    for row in rows:
        base = index.get((row["baseline_model"], row["resolution"], row["batch"], row["measurement"]))
        if row["status"] == "ok" and base is not None and base["value"]:
            row["ratio_vs_baseline"] = row["value"] / base["value"]


def attach_flops(rows: List[Dict[str, Any]], flops: List[Dict[str, Any]]) -> None:
    """Copy params and per-image GMACs from the FLOP table into each row (the same for checkpointed variants)."""
    index = {(f["model"], f["resolution"]): f for f in flops}
    for row in rows:
        key = row["model"].removesuffix("-ckpt")
        entry = index.get((key, row["resolution"]))
        row["params"] = entry["params"] if entry else None
        row["gmacs_per_image"] = entry["macs"] / 1e9 if entry else None
