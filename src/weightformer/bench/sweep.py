"""The benchmark sweep: every model at every resolution, timed round-robin, reported as medians and ratios.

At each (resolution, mode) point the models are built side by side and timed in turn, one timed
repetition each per round, so that drifts in machine load hit every model alike. A point is skipped
(and recorded with the reason) when it is predicted to exceed the per-call time budget, from the
FLOPs of the new point and the rate the same model reached at the previous resolution, or when it
runs out of memory (status "oom": a measured outcome, the sweep goes on).

With a journal (``points.jsonl`` in the output folder, see ``journal``), every point is appended as
soon as it is measured, and a resumed sweep takes the points already there instead of measuring them.
"""

import gc
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

import torch

from . import memory
from .flops import count_flops
from .journal import Journal, Key
from .machine import machine_info
from .memory import is_oom
from .options import check_device, check_number  # shared by every bench command (re-exported here)
from .settings import DTYPES, MEASUREMENTS, MODES, PATCH, check_choices, check_models, check_resolution
from .timing import inference_call, iterations_for, median, round_robin, time_call, training_step
from .variants import INFER, TRAIN, Variant, build_variant, get_variant, param_count, random_batch

THROUGHPUT = {INFER: "infer_throughput", TRAIN: "train_throughput"}
MEMORY = {INFER: "infer_memory", TRAIN: "train_memory"}
# Row statuses besides "ok": not run (over the time budget, a worker timeout), or ran out of memory.
SKIPPED, OOM = "skipped", "oom"
# Order of the result rows: by resolution (as configured), then measurement, then model (as configured).
ROW_ORDER = ("infer_throughput", "train_throughput", "infer_memory", "train_memory")
# A training step (forward, backward, optimizer) costs about three forwards.
TRAIN_COST = 3.0
# A memory point is one call, so it may take longer than a timed point's call.
MEMORY_BUDGET_FACTOR = 4.0


@dataclass
class SweepConfig:
    """What to measure. ``None`` for the train/memory resolutions means every resolution.

    Memory is measured for each of ``memory_modes`` at the resolutions where that mode is timed (every
    resolution for inference, ``train_resolutions`` for training), restricted to ``memory_resolutions``.
    Every setting is checked on creation; a bad one raises ``ValueError`` naming the allowed values.
    """

    models: List[str]
    resolutions: List[int]
    batch_sizes: Dict[int, int] = field(default_factory=dict)  # resolution -> batch
    default_batch: int = 1
    measurements: Tuple[str, ...] = MEASUREMENTS
    train_resolutions: Optional[List[int]] = None
    memory_resolutions: Optional[List[int]] = None
    memory_modes: Tuple[str, ...] = MODES
    repetitions: int = 3
    min_rep_seconds: float = 1.0
    max_call_seconds: float = 15.0
    device: str = "cpu"
    dtype: str = "float32"
    threads: Optional[int] = None

    def __post_init__(self) -> None:
        check_models(self.models)
        if not self.resolutions:
            raise ValueError("no resolutions given; use e.g. 224,448")
        for res in [*self.resolutions, *(self.train_resolutions or []), *(self.memory_resolutions or [])]:
            check_resolution(res)
        for res, batch in self.batch_sizes.items():
            check_number(f"batch at {res}px", batch, 1)
        check_number("default batch", self.default_batch, 1)
        check_choices("measurements", self.measurements, MEASUREMENTS)
        check_choices("memory modes", self.memory_modes, MODES)
        check_number("repetitions", self.repetitions, 1)
        check_number("min_rep_seconds", self.min_rep_seconds, 0)
        check_number("max_call_seconds", self.max_call_seconds, 0, inclusive=False)
        self.device = check_device(self.device)  # one line for cuda without a GPU; auto becomes cuda or cpu
        check_choices("dtype", [self.dtype], DTYPES)
        if self.threads is not None:
            check_number("threads", self.threads, 1)

    def batch_for(self, resolution: int) -> int:
        return self.batch_sizes.get(resolution, self.default_batch)

    def measures(self, measurement: str, mode: str, resolution: int) -> bool:
        """Whether the sweep measures ``measurement`` ("infer", "train" or "memory") of ``mode`` at ``resolution``."""
        train_resolutions = self.resolutions if self.train_resolutions is None else self.train_resolutions
        timed = mode == INFER or resolution in train_resolutions
        if measurement == "memory":
            in_memory = self.memory_resolutions is None or resolution in self.memory_resolutions
            return "memory" in self.measurements and mode in self.memory_modes and timed and in_memory
        return measurement in self.measurements and timed

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def settings(self) -> Dict[str, Any]:
        """What every point depends on beyond its key: a journal measured otherwise is not resumed from."""
        info = machine_info(self.device)
        return {
            "device": self.device,
            "dtype": self.dtype,
            "repetitions": self.repetitions,
            "min_rep_seconds": self.min_rep_seconds,
            "max_call_seconds": self.max_call_seconds,
            "threads": torch.get_num_threads(),
            "machine": {k: info[k] for k in ("hostname", "cpu", "gpu", "python", "torch", "timm")},
        }


def _release(device: str) -> None:
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _row(variant: Variant, resolution: int, batch: int, measurement: str, **fields: Any) -> Dict[str, Any]:
    grid = -(-resolution // PATCH)
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
    model = build_variant(variant, resolution, "meta")
    return count_flops(model, torch.empty(1, 3, resolution, resolution, device="meta")).flops


T = TypeVar("T")


class Sweep:
    """Runs a ``SweepConfig`` and collects result rows; ``run`` returns the whole result document.

    With ``journal`` (a ``points.jsonl`` path) each point is appended there as it is measured; with
    ``resume`` as well, the points already in it are taken from it instead of being measured again.
    """

    def __init__(
        self,
        config: SweepConfig,
        log: Callable[[str], None] = print,
        journal: Optional[Path] = None,
        resume: bool = False,
        command: Optional[str] = None,
    ):
        self.config = config
        self.command = command  # the command line recorded with the machine (default: this process's)
        self.log = log
        self.journal_path = journal
        self.resume = resume
        self.journal: Optional[Journal] = None
        self.rows: List[Dict[str, Any]] = []
        self.flops: List[Dict[str, Any]] = []
        self.measured = 0  # points measured by this run
        self.reused = 0  # points taken from the journal
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
    # recording: every point goes to the rows (or FLOP table) and, at once, to the journal
    # ---------------------------------------------------------------------------------------------
    def _save(self, key: Key, record: Dict[str, Any]) -> None:
        self.measured += 1
        if self.journal is not None:
            self.journal.append(key, record)

    def _record(self, row: Dict[str, Any], rate: Optional[Tuple[str, float]] = None) -> None:
        self.rows.append(row)
        if rate is not None:
            self.rates[(row["model"], rate[0])] = rate[1]
        self._save((row["model"], row["resolution"], row["batch"], row["measurement"]), {"row": row, "rate": rate})

    def _skip(self, variant: Variant, resolution: int, batch: int, measurement: str, status: str, reason: str) -> None:
        what = "out of memory" if status == OOM else "skip"
        self.log(f"  {what}: {variant.key} {measurement} {resolution}px: {reason}")
        self._record(_row(variant, resolution, batch, measurement, status=status, reason=reason))

    def _reuse(self, variant: Variant, resolution: int, batch: int, measurement: str) -> bool:
        """Take the point from the journal if it is there; True if it was."""
        entry = self.journal.get((variant.key, resolution, batch, measurement)) if self.journal else None
        if entry is None:
            return False
        if "flops" in entry:
            self.flops.append(entry["flops"])
        else:
            self.rows.append(entry["row"])
            if entry.get("rate"):
                mode, rate = entry["rate"]
                self.rates[(variant.key, mode)] = rate
        self.reused += 1
        return True

    def _guarded(self, fn: Callable[[], T]) -> Tuple[Optional[T], Optional[str]]:
        """``(fn(), None)``, or ``(None, reason)`` when it ran out of memory; any other error propagates."""
        try:
            return fn(), None
        except (RuntimeError, MemoryError) as error:
            if not is_oom(error):
                raise
            reason = f"out of memory: {_first_line(error)}"
        _release(self.config.device)  # outside the handler, so that the error's frames no longer hold tensors
        return None, reason

    # ---------------------------------------------------------------------------------------------
    # measurement
    # ---------------------------------------------------------------------------------------------
    def _prepare_call(
        self, variant: Variant, resolution: int, batch: int, mode: str
    ) -> Tuple[Callable[[], None], float]:
        """The point's callable (model and batch built) and the seconds of its warm-up call."""
        cfg = self.config
        model = build_variant(variant, resolution, cfg.device)
        images, labels = random_batch(batch, resolution, cfg.device)
        if mode == INFER:
            fn = inference_call(model, images, cfg.torch_dtype)
        else:
            fn = training_step(model, images, labels, cfg.torch_dtype)
        return fn, time_call(fn, cfg.device)

    def _timed_point(self, resolution: int, mode: str, variants: Sequence[Variant], plan: Dict[str, int]) -> None:
        cfg = self.config
        batch = cfg.batch_for(resolution)
        measurement = THROUGHPUT[mode]
        calls: Dict[str, Callable[[], None]] = {}
        iterations: Dict[str, int] = {}
        for variant in variants:
            if self._reuse(variant, resolution, batch, measurement):
                continue
            status, reason = SKIPPED, self._over_budget(variant, mode, plan[variant.key] * batch, cfg.max_call_seconds)
            prepared = None
            if reason is None:
                prepared, reason = self._guarded(lambda: self._prepare_call(variant, resolution, batch, mode))
                status = OOM
            if prepared is not None:
                fn, warm = prepared
                if warm > 2 * cfg.max_call_seconds:
                    status = SKIPPED
                    reason = f"warm-up call took {warm:.1f} s, over twice the {cfg.max_call_seconds:g} s budget"
                else:
                    calls[variant.key] = fn
                    iterations[variant.key] = iterations_for(warm, cfg.min_rep_seconds)
            if reason is not None:
                self._skip(variant, resolution, batch, measurement, status, reason)
        samples = round_robin(calls, cfg.repetitions, cfg.device, iterations)
        for variant in variants:
            if variant.key not in calls:
                continue
            seconds = median(samples[variant.key])
            self.log(f"  {variant.key:16s} {mode} {resolution}px b{batch}: {batch / seconds:8.2f} img/s")
            fields = dict(seconds_per_call=seconds, samples_s=samples[variant.key], iterations=iterations[variant.key])
            row = _row(variant, resolution, batch, measurement, value=batch / seconds, unit="img/s", **fields)
            self._record(row, rate=(mode, plan[variant.key] * batch / seconds))
        calls.clear()
        _release(cfg.device)

    def _count(self, variant: Variant, resolution: int, where: str) -> Dict[str, Any]:
        model = build_variant(variant, resolution, where)
        report = count_flops(model, torch.randn(1, 3, resolution, resolution).to(where))
        entry = {"model": variant.key, "resolution": resolution, "params": param_count(model)}
        entry.update(report.as_dict(), counted_on=where)
        return entry

    def _flops_point(self, resolution: int, variants: Sequence[Variant], plan: Dict[str, int]) -> None:
        cfg = self.config
        for variant in variants:
            if variant.grad_checkpointing:
                continue  # same forward as the variant without checkpointing
            if self._reuse(variant, resolution, 1, "flops"):
                continue
            # Counting runs one forward; past the budget, count on the meta device instead (same ops, no data).
            too_slow = self._over_budget(variant, INFER, plan[variant.key], cfg.max_call_seconds) is not None
            entry, _ = (None, None) if too_slow else self._guarded(lambda: self._count(variant, resolution, cfg.device))
            if entry is None:  # too slow, or out of memory on the device
                entry = self._count(variant, resolution, "meta")
            self.flops.append(entry)
            self._save((variant.key, resolution, 1, "flops"), {"flops": entry})
            _release(cfg.device)

    def _memory_point(self, resolution: int, mode: str, variants: Sequence[Variant], plan: Dict[str, int]) -> None:
        cfg = self.config
        batch = cfg.batch_for(resolution)
        measurement = MEMORY[mode]
        budget = MEMORY_BUDGET_FACTOR * cfg.max_call_seconds
        for variant in variants:
            if self._reuse(variant, resolution, batch, measurement):
                continue
            status, reason = SKIPPED, self._over_budget(variant, mode, plan[variant.key] * batch, budget)
            report = None
            if reason is None:
                try:
                    report, reason = self._guarded(
                        lambda: memory.measure(
                            variant.key, mode, resolution, batch, cfg.device, cfg.torch_dtype, timeout_s=4 * budget + 60
                        )
                    )
                    status = OOM
                except subprocess.TimeoutExpired as error:
                    reason = f"memory worker ran past its {error.timeout:.0f} s timeout"
            if report is None:
                self._skip(variant, resolution, batch, measurement, status, reason or "")
                continue
            self.log(f"  {variant.key:16s} {mode} memory {resolution}px b{batch}: {report.extra_mib:8.1f} MiB extra")
            fields = dict(peak_mib=report.peak_mib, baseline_mib=report.baseline_mib, method=report.method)
            row = _row(variant, resolution, batch, measurement, value=report.extra_mib, unit="MiB", **fields)
            self._record(row)

    # ---------------------------------------------------------------------------------------------
    # the sweep
    # ---------------------------------------------------------------------------------------------
    def run(self) -> Dict[str, Any]:
        """Measure everything in the config; return {machine, config, rows, flops, elapsed_s, points_*}.

        Raises ``journal.JournalMismatch`` before measuring anything if asked to resume from a journal
        measured with other settings.
        """
        cfg = self.config
        threads = torch.get_num_threads()
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        try:
            if self.journal_path is not None:
                self.journal = Journal(self.journal_path, cfg.settings(), resume=self.resume)
                if self.journal.entries:
                    self.log(f"resuming: {len(self.journal.entries)} point(s) already in {self.journal_path}")
                elif self.journal.discarded:
                    self.log(f"starting afresh: {self.journal.discarded} point(s) of an earlier run in "
                             f"{self.journal_path} discarded (--resume keeps them)")
            return self._run()
        finally:
            torch.set_num_threads(threads)

    def _run(self) -> Dict[str, Any]:
        cfg = self.config
        machine = machine_info(cfg.device, self.command)  # at the start: the load average the sweep began under
        start = time.perf_counter()
        variants = [get_variant(key) for key in cfg.models]
        for resolution in cfg.resolutions:
            self.log(f"resolution {resolution}px, batch {cfg.batch_for(resolution)}")
            plan = {v.key: planned_flops(v, resolution) for v in variants}
            if cfg.measures("infer", INFER, resolution):
                self._timed_point(resolution, INFER, [v for v in variants if INFER in v.modes], plan)
            if "flops" in cfg.measurements:
                self._flops_point(resolution, variants, plan)
            if cfg.measures("train", TRAIN, resolution):
                self._timed_point(resolution, TRAIN, [v for v in variants if TRAIN in v.modes], plan)
            for mode in MODES:
                if cfg.measures("memory", mode, resolution):
                    self._memory_point(resolution, mode, [v for v in variants if mode in v.modes], plan)
        # One order whichever points came from the journal: resolution, measurement, model, as configured.
        self.rows.sort(
            key=lambda r: (
                cfg.resolutions.index(r["resolution"]), ROW_ORDER.index(r["measurement"]), cfg.models.index(r["model"])
            )
        )
        attach_ratios(self.rows)
        attach_flops(self.rows, self.flops)
        return {
            "machine": machine,
            "config": asdict(cfg),
            "elapsed_s": round(time.perf_counter() - start, 1),
            "points_measured": self.measured,
            "points_reused": self.reused,
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
