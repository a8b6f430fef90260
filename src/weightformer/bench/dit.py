"""``weightformer bench dit``: WeightFormer-DiT against DiT with fused and with explicit attention (the N×N scores
in memory), across latent sides, forward and training step: median seconds of interleaved repetitions and
the memory probe's extra peak. Before each point one call's time is predicted from the same model's at the
previous side, scaled by FLOPs (a first training step: 3× the forward); a point over ``--max-seconds`` is
skipped and its model grows no further. Explicit attention's fp32 scores (two B·H·N² tensors in a forward,
depth + 2 in a step) over the memory available make a point "out of memory (predicted)".
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..engine.metrics import json_text
from . import timing
from .subjects import INFER, Subject, dit_arguments, dit_subject, make_call

MODES = ("forward", "train")
ATTENTION = ("fused", "explicit")
DEFAULT_SIDES = (32, 64, 128, 224)
ANCHOR = ("DiG (arXiv 2405.18428): DiG-S/2 is 2.5x faster than DiT-S/2 and uses 75.7% less GPU memory at "
          "1792x1792 px (latent side 224); WeightFormer-DiT should beat both.")
TRAIN_COST = 3.0  # a training step costs about three forwards
MEMORY_SHARE = 0.8  # a point may be predicted to need at most this share of the memory available
OK, SKIPPED, OOM = "ok", "skipped", "oom"
FILES = ("dit.json", "dit.md")
GIB = 2**30


def subjects(models: Sequence[str], attention: Sequence[str]) -> list[Subject]:
    wf, dit = models
    return [dit_subject(wf), *(dit_subject(dit, kind) for kind in attention)]


def _call(subject: Subject, side: int, batch: int, mode: str, device: str,
          model_kwargs: dict[str, Any] | None = None) -> Callable[[], None]:
    args, target = subject.inputs(batch, side, device)
    model = subject.build(side, device, **(model_kwargs or {}))
    return make_call(subject, model, INFER if mode == "forward" else mode, args, target)


def forward_flops(subject: Subject, side: int, batch: int, model_kwargs: dict[str, Any] | None = None) -> int:
    """FLOPs of one forward, counted on the meta device, attention matmuls included."""
    import torch

    from .flops import count_flops

    model = subject.build(side, "meta", **(model_kwargs or {}))
    labels = torch.zeros(batch, dtype=torch.long, device="meta")
    return count_flops(model, torch.empty(batch, 4, side, side, device="meta"), labels, labels).flops


def score_bytes(subject: Subject, side: int, batch: int, mode: str, model_kwargs: dict[str, Any] | None = None) -> int:
    """Bytes of explicit attention's fp32 scores alive at once; 0 for the others."""
    if subject.attention != "explicit":
        return 0
    arguments = dit_arguments(subject.options["model"], model_kwargs)
    tokens = (side // subject.options["patch"]) ** 2
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


def benchmark(models: Sequence[str], sides: Sequence[int], batch: int = 1, repeats: int = 3,
              max_seconds: float = 200.0, device: str = "cpu", memory: bool = True,
              model_kwargs: dict[str, Any] | None = None, attention: Sequence[str] = ATTENTION,
              on_side: Callable[[list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
    """One row per (side, mode, model): status (ok, skipped, oom), median seconds per call, extra peak MiB, and
    why a point was not measured. ``model_kwargs`` override the variants' arguments; ``on_side`` gets the
    rows so far after each side."""
    from . import memory as probe

    flops: dict[tuple[str, int], int] = {}
    last: dict[tuple[str, str], tuple[int, float]] = {}  # (model, mode) -> (side, seconds per call)
    stopped: dict[tuple[str, str], str] = {}  # (model, mode) -> why it grows no further
    rows: list[dict[str, Any]] = []

    def flops_at(subject: Subject, side: int) -> int:
        if (subject.name, side) not in flops:
            flops[(subject.name, side)] = forward_flops(subject, side, batch, model_kwargs)
        return flops[(subject.name, side)]

    def predicted_seconds(subject: Subject, mode: str, side: int) -> float | None:
        if (subject.name, mode) in last:
            last_side, seconds = last[(subject.name, mode)]
            return seconds * flops_at(subject, side) / flops_at(subject, last_side)
        forward = last.get((subject.name, "forward"))
        return TRAIN_COST * forward[1] if mode == "train" and forward is not None and forward[0] == side else None

    for side in sides:
        for mode in MODES:
            side_rows: dict[str, dict[str, Any]] = {}
            calls: dict[str, Callable[[], None]] = {}
            for subject in subjects(models, attention):
                key = (subject.name, mode)
                row: dict[str, Any] = {"model": subject.name, "variant": subject.options["model"],
                                       "attention": subject.attention, "side": side, "pixels": side * 8,
                                       "tokens": (side // subject.options["patch"]) ** 2, "mode": mode,
                                       "batch": batch, "status": OK, "forward_gflops": flops_at(subject, side) / 1e9}
                side_rows[subject.name] = row
                need = score_bytes(subject, side, batch, mode, model_kwargs)
                available = available_bytes(device) if need else 0
                predicted = predicted_seconds(subject, mode, side)
                if key in stopped:
                    row.update(status=SKIPPED, reason=stopped[key])
                elif need > MEMORY_SHARE * available:
                    row.update(status=OOM, oom="predicted", reason=(
                        f"out of memory (predicted): explicit attention holds {need / GIB:.1f} GiB of fp32 scores "
                        f"at once, more than {MEMORY_SHARE:.0%} of the {available / GIB:.1f} GiB available"))
                    stopped[key] = "out of memory at a smaller side"
                elif predicted is not None and predicted > max_seconds:
                    row.update(status=SKIPPED, predicted_seconds=predicted,
                               reason=f"predicted {predicted:.1f} s per call exceeds the {max_seconds:g} s budget")
                    stopped[key] = f"a smaller side was over the {max_seconds:g} s budget"
                else:
                    def warm() -> tuple[Callable[[], None], float]:  # the warm-up, and the cut-off test
                        call = _call(subject, side, batch, mode, device, model_kwargs)
                        return call, timing.time_call(call, device)

                    prepared, oom = probe.guarded(warm, device)
                    call, first = prepared or (None, 0.0)
                    if oom is not None:
                        row.update(status=OOM, oom="measured", reason=f"out of memory (measured): {oom}")
                        stopped[key] = "out of memory at a smaller side"
                    if call is not None and first > max_seconds:
                        row.update(status=SKIPPED, seconds=first, cut_off=True,
                                   reason=f"one call took {first:.1f} s > the {max_seconds:g} s budget")
                        stopped[key] = f"a smaller side took over {max_seconds:g} s"
                    elif call is not None:
                        calls[subject.name] = call
                    if predicted is not None:
                        row["predicted_seconds"] = predicted
                    probe.release("cpu")
            samples = timing.side_by_side(calls, repeats, device)
            calls.clear()
            probe.release(device)
            for subject in subjects(models, attention):
                row = side_rows[subject.name]
                if subject.name in samples:
                    row.update(seconds=timing.median(samples[subject.name]), samples_s=samples[subject.name])
                    last[(subject.name, mode)] = (side, row["seconds"])
                    if memory:
                        try:
                            report, oom = probe.guarded(lambda: probe.measure(
                                "dit", subject.name, INFER if mode == "forward" else mode, side, batch, device,
                                timeout_s=4 * max_seconds + 120, **(model_kwargs or {})), device)
                            row.update(report.as_dict() if oom is None else
                                       {"memory_oom": f"out of memory (measured): {oom}"})
                        except subprocess.TimeoutExpired as error:
                            row["memory_skipped"] = f"memory worker ran past its {error.timeout:.0f} s timeout"
                rows.append(row)
                print(json_text(row), flush=True)
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
    """``numerator[key] / denominator[key]``; for seconds timed side by side, the median of each round's ratio."""
    if key in numerator and key in denominator and numerator["status"] == denominator["status"] == OK \
            and denominator[key] > 0:
        rounds, base_rounds = numerator.get("samples_s") or [], denominator.get("samples_s") or []
        if key == "seconds" and rounds and len(rounds) == len(base_rounds):
            return f"{timing.paired_ratio(rounds, base_rounds):.2f}x"
        return f"{numerator[key] / denominator[key]:.2f}x"
    return "-"


def markdown(document: dict[str, Any]) -> str:
    """The table of ``document`` (rows, machine, config): one line per side and mode."""
    from .results import markdown_grid, provenance

    config, rows = document["config"], document["rows"]
    wf, dit = config["models"]
    index = {(r["model"], r["side"], r["mode"]): r for r in rows}
    others = [f"{dit} {kind}" for kind in config["attention"]]
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
    grid, notes = [], []
    for side in document["sides_done"]:
        for mode in MODES:
            a = index.get((wf, side, mode))
            bs = [index.get((k, side, mode)) for k in others]
            if a is None or None in bs:
                continue
            cells = ([f"{side} ({side * 8})", str(a["tokens"]), mode, _seconds_cell(a)] + [_seconds_cell(b) for b in bs]
                     + [_ratio(b, a, "seconds") for b in bs] + [_memory_cell(a)] + [_memory_cell(b) for b in bs]
                     + [_ratio(a, b, "extra_mib") for b in bs])
            grid.append(cells)
            for r in (a, *bs):
                for key in ("reason", "memory_oom", "memory_skipped"):
                    if key in r and not r[key].startswith("a smaller side"):  # said once, at the side that stopped it
                        notes.append(f"- {r['model']}, {mode}, side {side}: {r[key]}")
    lines += markdown_grid(header, grid)
    if notes:
        lines += ["", "Points not measured, and why:", "", *notes]
    return "\n".join(lines) + "\n"


def run_command(args: Any, command: str) -> int:
    """``weightformer bench dit``; the files are written after every side, so a long run keeps what it measured."""
    import torch

    from ..engine.errors import ConfigError
    from ..engine.outputs import removed_if_failed
    from ..engine.run_dir import hold_run_folder
    from ..models.dit_variants import DIT_VARIANTS
    from .checks import check_device
    from .results import claim_out_dir, default_out, log, machine_info, write_results

    unknown = [m for m in args.models if m not in DIT_VARIANTS]
    if unknown:
        raise ConfigError(f"unknown model(s) {unknown}; choose from {', '.join(DIT_VARIANTS)}")
    if args.models[0] == args.models[1]:
        raise ConfigError(f"--models names {args.models[0]} twice; pass the two variants to compare")
    if [DIT_VARIANTS[m]["mixer"] for m in args.models] != ["weightformer", "attention"]:
        raise ConfigError(f"--models takes a WeightFormer-DiT, then an attention DiT (e.g. wf_dit_s_2 dit_s_2), "
                          f"got {' '.join(args.models)}")
    patches = sorted({dit_subject(m).options["patch"] for m in args.models})
    bad = [s for s in args.sides if any(s % p for p in patches)]
    if bad:
        raise ConfigError(f"--sides must be multiples of the models' patch sizes ({', '.join(map(str, patches))}), "
                          f"got {bad}")
    args.device = check_device(args.device)  # one line for cuda without a GPU, as every bench command
    if args.threads:
        torch.set_num_threads(args.threads)
    out = default_out(args.out, args.device, "dit")
    machine = machine_info(args.device, command)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}

    def save(rows: list[dict[str, Any]]) -> None:
        document = {"machine": machine, "config": config, "sides_done": sorted({r["side"] for r in rows}),
                    "anchor": ANCHOR, "rows": rows}
        write_results(out, dict(zip(FILES, (document, markdown(document)))))

    with removed_if_failed(out), hold_run_folder(out, "--out"):  # one process writes the files after each side
        claim_out_dir(out, FILES, args.overwrite, "weightformer bench dit", log=log)
        benchmark(args.models, sorted(set(args.sides)), args.batch, args.repeats, args.max_seconds, args.device,
                  not args.no_memory, attention=list(dict.fromkeys(args.attention)), on_side=save)
    print(f"wrote {out / FILES[0]} and {out / FILES[1]}")
    return 0
