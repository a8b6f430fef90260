"""The classification sweep: every cls subject at every resolution, timed side by side, with medians and ratios
against the DeiT of the same size, FLOPs, parameters and extra peak memory. Each subject is timed as one
:class:`Variant` per runtime (eager, torch.compile) and precision (fp32, autocast to bf16 or fp16), and its
ratio is against the DeiT variant of the same runtime and precision. A point predicted over the per-call
budget (its FLOPs over the model's last FLOP rate) is skipped; one out of memory is recorded as "oom". Each point
goes to the journal (``points.jsonl``) as it is measured; a resumed sweep takes the points already there.
"""

from __future__ import annotations

import csv
import io
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from . import memory
from .checks import (ALLOCATORS, DTYPES, MEASUREMENTS, MODES, PATCH, RUNTIMES, SWEEP_FILES, check_choices,
                     check_device, check_models, check_number, check_resolution)
from .flops import count_flops
from .journal import Journal, Key
from .memory import guarded, release
from .results import describe, machine_info, provenance, write_results
from .subjects import INFER, TRAIN, Subject, get_subject, param_count, prepare
from .timing import iterations_for, keep_freed_memory, median, paired_ratio, side_by_side, time_call

THROUGHPUT = {INFER: "infer_throughput", TRAIN: "train_throughput"}
MEMORY = {INFER: "infer_memory", TRAIN: "train_memory"}
SKIPPED, OOM = "skipped", "oom"  # row statuses besides "ok"
ROW_ORDER = ("infer_throughput", "train_throughput", "infer_memory", "train_memory")
TRAIN_COST = 3.0  # a training step (forward, backward, optimizer) costs about three forwards
MEMORY_BUDGET_FACTOR = 4.0  # a memory point is one call, so it may take longer than a timed point's call
MEMORY_METHODS = {
    "cpu": "peak resident set (VmHWM after clear_refs) during the call minus the resident set before it, each "
           "model in a fresh process warmed up by one call on a 64×64 image",
    "cuda": "torch.cuda.max_memory_allocated during the call minus torch.cuda.memory_allocated before it, after "
            "a warm-up call on a 64×64 image",
}
CSV_COLUMNS = ["model", "label", "subject", "runtime", "dtype", "resolution", "tokens", "batch", "measurement",
               "status", "value", "unit", "ratio_vs_baseline", "baseline_model", "seconds_per_call", "iterations",
               "samples_s", "peak_mib", "baseline_mib", "method", "first_call_s", "params", "gmacs_per_image", "reason"]
SHORT_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


@dataclass(frozen=True)
class Variant:
    """``subject`` as timed: under ``runtime`` (eager PyTorch, or torch.compile with dynamic shapes as
    ``train --compile`` applies it) and ``dtype`` (float32, or autocast to a lower precision). Its name is the
    subject's, with ``+compile`` and ``+bf16``/``+fp16`` where not eager fp32."""

    subject: Subject
    runtime: str = "eager"
    dtype: str = "float32"

    def _extras(self) -> List[Tuple[str, str]]:
        """(name suffix, label) of each way this variant differs from eager fp32."""
        extras = [("compile", "torch.compile")] if self.runtime == "compile" else []
        if self.dtype != "float32":
            extras.append((SHORT_DTYPES[self.dtype],) * 2)
        return extras

    @property
    def name(self) -> str:
        return self.subject.name + "".join(f"+{suffix}" for suffix, _ in self._extras())

    @property
    def baseline(self) -> str:
        return self.subject.baseline + "".join(f"+{suffix}" for suffix, _ in self._extras())

    @property
    def label(self) -> str:
        extras = [label for _, label in self._extras()]
        return self.subject.label + (f" ({', '.join(extras)})" if extras else "")

    @property
    def modes(self) -> Tuple[str, ...]:
        return self.subject.modes


@dataclass
class SweepConfig:
    """What to measure, checked on creation. ``None`` train/memory resolutions: every resolution. Memory is
    measured for each of ``memory_modes`` where that mode is timed, restricted to ``memory_resolutions``."""

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
    dtypes: Tuple[str, ...] = ("float32",)
    runtimes: Tuple[str, ...] = ("eager",)
    threads: Optional[int] = None
    allocator: str = "cached"  # see timing.keep_freed_memory; memory is measured in fresh processes either way

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
        check_choices("dtypes", self.dtypes, DTYPES)
        check_choices("runtimes", self.runtimes, RUNTIMES)
        check_choices("allocator", (self.allocator,), ALLOCATORS)
        if self.threads is not None:
            check_number("threads", self.threads, 1)

    def variants(self) -> List[Variant]:
        """Every model under every runtime and precision, in that order."""
        return [Variant(get_subject("cls", model), runtime, dtype)
                for model in self.models for runtime in self.runtimes for dtype in self.dtypes]

    def batch_for(self, resolution: int) -> int:
        return self.batch_sizes.get(resolution, self.default_batch)

    def measures(self, measurement: str, mode: str, resolution: int) -> bool:
        train_resolutions = self.resolutions if self.train_resolutions is None else self.train_resolutions
        timed = mode == INFER or resolution in train_resolutions
        if measurement == "memory":
            in_memory = self.memory_resolutions is None or resolution in self.memory_resolutions
            return "memory" in self.measurements and mode in self.memory_modes and timed and in_memory
        return measurement in self.measurements and timed

    def settings(self) -> Dict[str, Any]:
        """What every point depends on beyond its key (a journal measured otherwise is not resumed)."""
        info = machine_info(self.device)
        return {"device": self.device, "dtypes": list(self.dtypes), "runtimes": list(self.runtimes),
                "repetitions": self.repetitions, "min_rep_seconds": self.min_rep_seconds,
                "max_call_seconds": self.max_call_seconds, "allocator": self.allocator,
                "threads": torch.get_num_threads(),
                "machine": {k: info[k] for k in ("hostname", "cpu", "gpu", "python", "torch", "timm")}}


def _row(variant: Variant, resolution: int, batch: int, measurement: str, **fields: Any) -> Dict[str, Any]:
    grid = -(-resolution // PATCH)
    return {"model": variant.name, "label": variant.label, "subject": variant.subject.name,
            "runtime": variant.runtime, "dtype": variant.dtype, "family": variant.subject.family,
            "baseline_model": variant.baseline, "first_call_s": None, "resolution": resolution, "tokens": grid * grid,
            "batch": batch, "measurement": measurement, "status": "ok", "value": None, "unit": None,
            "ratio_vs_baseline": None, "seconds_per_call": None, "samples_s": [], "iterations": None, "peak_mib": None,
            "baseline_mib": None, "method": None, "reason": "", **fields}


def planned_flops(subject: Subject, resolution: int) -> int:
    """Per-image FLOPs of ``subject`` at ``resolution``, counted on the meta device."""
    return count_flops(subject.build(resolution, "meta"), torch.empty(1, 3, resolution, resolution, device="meta")).flops


class Sweep:
    """Runs a ``SweepConfig``; ``run`` returns the result document. Each point is appended to ``journal``
    (a ``points.jsonl`` path) as it is measured; with ``resume``, the points already there are reused."""

    def __init__(self, config: SweepConfig, log: Callable[[str], None] = print, journal: Optional[Path] = None,
                 resume: bool = False, command: Optional[str] = None):
        self.config, self.log, self.command = config, log, command
        self.journal_path, self.resume = journal, resume
        self.journal: Optional[Journal] = None
        self.rows: List[Dict[str, Any]] = []
        self.flops: List[Dict[str, Any]] = []
        self.measured = self.reused = 0  # points measured by this run / taken from the journal
        self.rates: Dict[Tuple[str, str], float] = {}  # (model, mode) -> FLOP/s at the last measured point

    def _over_budget(self, variant: Variant, mode: str, flops_per_call: float, budget: float) -> Optional[str]:
        """Why a call of ``flops_per_call`` is predicted over ``budget`` from the variant's last FLOP rate (else
        the eager fp32 inference rate of its subject or of that without checkpointing); None if it is not."""
        rate, factor = self.rates.get((variant.name, mode)), 1.0
        if rate is None:
            rate = self.rates.get((variant.subject.name.removesuffix("-ckpt"), INFER))
            factor = TRAIN_COST if mode == TRAIN else 1.0
        predicted = None if rate is None else flops_per_call / rate * factor
        if predicted is not None and predicted > budget:
            return f"predicted {predicted:.1f} s per call exceeds the {budget:g} s budget"
        return None

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
        self.log(f"  {'out of memory' if status == OOM else 'skip'}: {variant.name} {measurement} {resolution}px: "
                 f"{reason}")
        self._record(_row(variant, resolution, batch, measurement, status=status, reason=reason))

    def _reuse(self, name: str, resolution: int, batch: int, measurement: str) -> bool:
        entry = self.journal.get((name, resolution, batch, measurement)) if self.journal else None
        if entry is None:
            return False
        if "flops" in entry:
            self.flops.append(entry["flops"])
        else:
            self.rows.append(entry["row"])
            if entry.get("rate"):
                mode, rate = entry["rate"]
                self.rates[(name, mode)] = rate
        self.reused += 1
        return True

    def _guarded(self, fn: Callable[[], Any]) -> Tuple[Any, Optional[str]]:
        value, oom = guarded(fn, self.config.device)
        return value, oom and f"out of memory: {oom}"

    def _prepare_call(self, variant: Variant, resolution: int, batch: int, mode: str) -> Tuple[Callable, float, float]:
        """The variant's call, the seconds of its first call (compilation included) and of a warm one."""
        cfg = self.config
        model = variant.subject.build(resolution, cfg.device)
        if variant.runtime == "compile":
            from ..engine.loop import compiled

            model = compiled(model, "inductor")
        fn = prepare(variant.subject, mode, resolution, batch, cfg.device, getattr(torch, variant.dtype), model=model)
        first = time_call(fn, cfg.device)
        return fn, first, time_call(fn, cfg.device) if variant.runtime == "compile" else first

    def _timed_point(self, resolution: int, mode: str, variants: Sequence[Variant], plan: Dict[str, int]) -> None:
        cfg = self.config
        batch, measurement = cfg.batch_for(resolution), THROUGHPUT[mode]
        calls: Dict[str, Callable[[], None]] = {}
        iterations: Dict[str, int] = {}
        first_calls: Dict[str, float] = {}  # compiled variants: the seconds of the call that compiled
        # Compiled programs live while their point is timed; a reset between points keeps each first call a
        # compilation and no code object past Dynamo's recompile limit (past it, Dynamo silently runs eager).
        if any(v.runtime == "compile" for v in variants):
            torch._dynamo.reset()
        for variant in variants:
            if self._reuse(variant.name, resolution, batch, measurement):
                continue
            flops = plan[variant.subject.name] * batch
            status, reason = SKIPPED, self._over_budget(variant, mode, flops, cfg.max_call_seconds)
            prepared = None
            if reason is None:
                prepared, reason = self._guarded(lambda: self._prepare_call(variant, resolution, batch, mode))
                status = OOM
            if prepared is not None:
                fn, first, warm = prepared
                if variant.runtime == "compile":
                    first_calls[variant.name] = first
                if warm > 2 * cfg.max_call_seconds:
                    status = SKIPPED
                    reason = f"warm-up call took {warm:.1f} s, over twice the {cfg.max_call_seconds:g} s budget"
                else:
                    calls[variant.name] = fn
                    iterations[variant.name] = iterations_for(warm, cfg.min_rep_seconds)
            if reason is not None:
                self._skip(variant, resolution, batch, measurement, status, reason)
        samples = side_by_side(calls, cfg.repetitions, cfg.device, iterations)
        for variant in variants:
            if variant.name not in calls:
                continue
            seconds = median(samples[variant.name])
            first = first_calls.get(variant.name)
            compiled = "" if first is None else f" (first call {first:.1f} s)"
            self.log(f"  {variant.name:22s} {mode} {resolution}px b{batch}: {batch / seconds:8.2f} img/s{compiled}")
            row = _row(variant, resolution, batch, measurement, value=batch / seconds, unit="img/s",
                       seconds_per_call=seconds, samples_s=samples[variant.name], iterations=iterations[variant.name],
                       first_call_s=first)
            self._record(row, rate=(mode, plan[variant.subject.name] * batch / seconds))
        calls.clear()
        release(cfg.device)

    def _count(self, subject: Subject, resolution: int, where: str) -> Dict[str, Any]:
        model = subject.build(resolution, where)
        report = count_flops(model, torch.randn(1, 3, resolution, resolution).to(where))
        return {"model": subject.name, "resolution": resolution, "params": param_count(model), "flops": report.flops,
                "macs": report.macs, "ops": report.ops, "counted_on": where}

    def _flops_point(self, resolution: int, subjects: Sequence[Subject], plan: Dict[str, int]) -> None:
        cfg = self.config
        for subject in subjects:
            if subject.name.endswith("-ckpt") or self._reuse(subject.name, resolution, 1, "flops"):
                continue  # checkpointing: the same forward as the variant without it
            # Counting runs one forward; past the budget, count on the meta device instead (same ops, no data).
            too_slow = self._over_budget(Variant(subject), INFER, plan[subject.name], cfg.max_call_seconds) is not None
            entry, _ = (None, None) if too_slow else self._guarded(lambda: self._count(subject, resolution, cfg.device))
            if entry is None:  # too slow, or out of memory on the device
                entry = self._count(subject, resolution, "meta")
            self.flops.append(entry)
            self._save((subject.name, resolution, 1, "flops"), {"flops": entry})
            release(cfg.device)

    def _memory_point(self, resolution: int, mode: str, variants: Sequence[Variant], plan: Dict[str, int]) -> None:
        cfg = self.config
        batch, measurement = cfg.batch_for(resolution), MEMORY[mode]
        budget = MEMORY_BUDGET_FACTOR * cfg.max_call_seconds
        for variant in variants:
            if self._reuse(variant.name, resolution, batch, measurement):
                continue
            status, reason = SKIPPED, self._over_budget(variant, mode, plan[variant.subject.name] * batch, budget)
            report = None
            if reason is None:
                try:
                    report, reason = self._guarded(lambda: memory.measure(
                        "cls", variant.subject.name, mode, resolution, batch, cfg.device, variant.dtype,
                        timeout_s=4 * budget + 60))
                    status = OOM
                except subprocess.TimeoutExpired as error:
                    reason = f"memory worker ran past its {error.timeout:.0f} s timeout"
            if report is None:
                self._skip(variant, resolution, batch, measurement, status, reason or "")
                continue
            self.log(f"  {variant.name:22s} {mode} memory {resolution}px b{batch}: {report.extra_mib:8.1f} MiB extra")
            self._record(_row(variant, resolution, batch, measurement, value=report.extra_mib, unit="MiB",
                              peak_mib=report.peak_mib, baseline_mib=report.baseline_mib, method=report.method))

    def run(self) -> Dict[str, Any]:
        """{machine, config, rows, flops, elapsed_s, points_*}; JournalMismatch before any measurement if the
        journal to resume was measured with other settings."""
        threads = torch.get_num_threads()
        if self.config.threads:
            torch.set_num_threads(self.config.threads)
        try:
            if self.journal_path is not None:
                self.journal = Journal(self.journal_path, self.config.settings(), resume=self.resume)
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
        if cfg.allocator == "cached":
            keep_freed_memory()
        machine = machine_info(cfg.device, self.command)  # at the start: the load average the sweep began under
        start = time.perf_counter()
        variants = cfg.variants()
        subjects = list({v.subject.name: v.subject for v in variants}.values())
        eager = [v for v in variants if v.runtime == "eager"]  # memory is measured of eager calls only
        for resolution in cfg.resolutions:
            self.log(f"resolution {resolution}px, batch {cfg.batch_for(resolution)}")
            plan = {s.name: planned_flops(s, resolution) for s in subjects}
            if cfg.measures("infer", INFER, resolution):
                self._timed_point(resolution, INFER, [v for v in variants if INFER in v.modes], plan)
            if "flops" in cfg.measurements:
                self._flops_point(resolution, subjects, plan)
            if cfg.measures("train", TRAIN, resolution):
                self._timed_point(resolution, TRAIN, [v for v in variants if TRAIN in v.modes], plan)
            for mode in MODES:
                if cfg.measures("memory", mode, resolution):
                    self._memory_point(resolution, mode, [v for v in eager if mode in v.modes], plan)
        # One order whichever points came from the journal: resolution, measurement, variant, as configured.
        order = [v.name for v in variants]
        self.rows.sort(key=lambda r: (cfg.resolutions.index(r["resolution"]), ROW_ORDER.index(r["measurement"]),
                                      order.index(r["model"])))
        attach_ratios(self.rows)
        flops = {(f["model"], f["resolution"]): f for f in self.flops}
        for row in self.rows:  # params and GMACs per image (the same for checkpointed variants)
            entry = flops.get((row["subject"].removesuffix("-ckpt"), row["resolution"]))
            row["params"] = entry["params"] if entry else None
            row["gmacs_per_image"] = entry["macs"] / 1e9 if entry else None
        return {"machine": machine, "config": asdict(cfg), "elapsed_s": round(time.perf_counter() - start, 1),
                "points_measured": self.measured, "points_reused": self.reused, "rows": self.rows, "flops": self.flops}


def attach_ratios(rows: List[Dict[str, Any]]) -> None:
    """Set each ok row's ``ratio_vs_baseline``: its value over its baseline model's at the same point; for
    throughput timed side by side, the median of each round's ratio (:func:`timing.paired_ratio`)."""
    index = {(r["model"], r["resolution"], r["batch"], r["measurement"]): r for r in rows if r["status"] == "ok"}
    for row in rows:
        base = index.get((row["baseline_model"], row["resolution"], row["batch"], row["measurement"]))
        if row["status"] != "ok" or base is None or not base["value"]:
            continue
        rounds, base_rounds = row.get("samples_s") or [], base.get("samples_s") or []
        if rounds and len(rounds) == len(base_rounds):  # seconds per call: the baseline's over the row's
            row["ratio_vs_baseline"] = paired_ratio(base_rounds, rounds)
        else:  # memory, or points from a journal timed in different runs
            row["ratio_vs_baseline"] = row["value"] / base["value"]


def _cell(row: Optional[Dict[str, Any]], digits: int) -> str:
    if row is None:
        return "—"
    if row["status"] != "ok":
        return "OOM" if row["status"] == "oom" else "skipped"
    text = f"{row['value']:.{digits}f}"
    if row["ratio_vs_baseline"] is not None and row["model"] != row["baseline_model"]:
        text += f" ({row['ratio_vs_baseline']:.2f}×)"
    return text


def markdown_table(result: Dict[str, Any]) -> str:
    rows: List[Dict[str, Any]] = result["rows"]
    index = {(r["model"], r["resolution"], r["measurement"]): r for r in rows}
    flops = {(f["model"], f["resolution"]): f for f in result.get("flops", [])}
    models = list(dict.fromkeys(r["model"] for r in rows)) or list(dict.fromkeys(m for m, _ in flops))
    labels = {r["model"]: r["label"] for r in rows}
    subjects = {r["model"]: r["subject"] for r in rows}
    where = "cuda" if str(result["config"]["device"]).startswith("cuda") else "cpu"
    header = "peak RSS" if where == "cpu" else "CUDA max allocated"
    lines = [provenance(result["machine"]), "",
             "fp32 unless a row says bf16 or fp16 (autocast); eager PyTorch unless it says torch.compile "
             "(Inductor, dynamic shapes, as `train --compile`). Throughput in images/s (higher is better). "
             "Memory in MiB (lower is better) "
             f"is the extra peak of one call (one forward, or one training step) over a warmed-up process: "
             f"{MEMORY_METHODS[where]}. Ratios in brackets are against the DeiT of the same size with fused "
             "attention, in the same runtime and precision, at the same point. GMACs per image include attention "
             "matmuls.", ""]
    for res in sorted({r["resolution"] for r in rows} | {res for _, res in flops}):
        batch = next((r["batch"] for r in rows if r["resolution"] == res), 1)
        lines += [f"### {res}×{res} (batch {batch})", "",
                  f"| Model | Params (M) | GMACs | Inference img/s | Training img/s "
                  f"| Inference memory (MiB, {header}) | Training memory (MiB, {header}) |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for model in models:
            cells = [index.get((model, res, m)) for m in ROW_ORDER]
            entry = flops.get((subjects.get(model, model).removesuffix("-ckpt"), res))
            if entry is None and all(c is None for c in cells):
                continue
            params = f"{entry['params'] / 1e6:.2f}" if entry else "—"
            gmacs = f"{entry['macs'] / 1e9:.2f}" if entry else "—"
            lines.append(f"| {labels.get(model, model)} | {params} | {gmacs} | {_cell(cells[0], 2)} | "
                         f"{_cell(cells[1], 2)} | {_cell(cells[2], 0)} | {_cell(cells[3], 0)} |")
        lines.append("")
    first_calls = [r for r in rows if r["status"] == "ok" and r.get("first_call_s") is not None]
    if first_calls:
        lines += ["First calls of the compiled variants (compilation included; the timed calls above exclude it):",
                  ""]
        lines += [f"- {r['label']}, {r['measurement'].replace('_throughput', '')}, {r['resolution']}px: "
                  f"{r['first_call_s']:.1f} s" for r in first_calls]
        lines.append("")
    skipped = [r for r in rows if r["status"] != "ok"]
    if skipped:
        lines += ["Points skipped or out of memory (OOM):", ""]
        lines += [f"- {r['label']}, {r['measurement']}, {r['resolution']}px: "
                  f"{'OOM, ' if r['status'] == 'oom' else ''}{r['reason']}" for r in skipped]
        lines.append("")
    return "\n".join(lines)


def csv_text(result: Dict[str, Any]) -> str:
    f = io.StringIO(newline="")
    command = result["machine"].get("command")
    f.write(f"# machine: {describe(result['machine'])}" + (f"; command: {command}" if command else "") + "\n")
    writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    for row in result["rows"]:
        writer.writerow({**row, "samples_s": ";".join(f"{s:.6g}" for s in row["samples_s"])})
    return f.getvalue()


def plot_scaling(result: Dict[str, Any]) -> bytes:
    """PNG: inference throughput and extra peak memory (training's where measured) against resolution, log-log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r["status"] == "ok"]
    memory_kind = "train_memory" if any(r["measurement"] == "train_memory" for r in rows) else "infer_memory"
    panels = [("infer_throughput", "inference throughput (img/s)"),
              (memory_kind, f"{'training step' if memory_kind == 'train_memory' else 'inference'} extra peak "
                            f"memory (MiB)")]
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, (measurement, ylabel) in zip(axes, panels):
        for i, model in enumerate(models):  # one colour per model across both panels; WeightFormer solid, DeiT dashed
            points = sorted((r["resolution"], r["value"]) for r in rows
                            if r["model"] == model and r["measurement"] == measurement)
            if points:
                label = next(r["label"] for r in rows if r["model"] == model)
                ax.plot(*zip(*points), "-" if model.startswith("wf") else "--", color=f"C{i % 10}", marker="o",
                        label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        resolutions = sorted({r["resolution"] for r in rows})
        if resolutions:  # batch sizes differ between resolutions, and memory is per call: name the batch too
            batch_of = {r["resolution"]: r["batch"] for r in rows}
            ax.set_xticks(resolutions)
            ax.set_xticklabels([f"{r}\nbatch {batch_of[r]}" for r in resolutions])
            ax.minorticks_off()
        ax.set_xlabel("resolution (px per side)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(describe(result["machine"]), fontsize=9)
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, dpi=120, format="png")
    plt.close(fig)
    return image.getvalue()


def write_all(result: Dict[str, Any], out_dir: Path) -> List[Path]:
    contents = (result, csv_text(result), markdown_table(result), lambda: plot_scaling(result))
    return write_results(out_dir, dict(zip(SWEEP_FILES, contents)))
