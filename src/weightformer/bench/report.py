"""Writers for a sweep's result document: JSON, CSV, a Markdown table and the log-log scaling plot.

Every file is written whole to a temporary file beside it and renamed over the old one, so a kill
mid-write leaves the previous file, never half of one. ``check_out_dir`` checks, before a sweep
starts, that the folder can take them; ``claim_out_dir`` is the output rule of every bench command
(``weightformer bench``, ``bench dense``, ``bench dit``), the engine's (:mod:`weightformer.engine.outputs`)
for a folder that holds a command's named files.
"""

import csv
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..engine.errors import ConfigError
from ..engine.outputs import claim_outputs
from .journal import JOURNAL_NAME, write_atomic
from .machine import describe, provenance
from .settings import OUTPUT_NAMES

# How each memory figure is measured, by the method a memory row records (memory.MemoryReport.method).
MEMORY_METHODS = {
    "cpu": "peak resident set (VmHWM after clear_refs) during the call minus the resident set before it, each "
           "model in a fresh process warmed up by one call on a 64×64 image",
    "cuda": "torch.cuda.max_memory_allocated during the call minus torch.cuda.memory_allocated before it, after "
            "a warm-up call on a 64×64 image",
}

CSV_COLUMNS = [
    "model",
    "label",
    "resolution",
    "tokens",
    "batch",
    "measurement",
    "status",
    "value",
    "unit",
    "ratio_vs_baseline",
    "baseline_model",
    "seconds_per_call",
    "iterations",
    "samples_s",
    "peak_mib",
    "baseline_mib",
    "method",
    "params",
    "gmacs_per_image",
    "reason",
]


class OutputError(ConfigError):
    """The output folder cannot take the results (a file in its place, no permission, a read-only place,
    or earlier results there that the command was not asked to move aside): a user's mistake, one line."""


def check_out_dir(out_dir: Path, names: Sequence[str] = (*OUTPUT_NAMES, JOURNAL_NAME), flag: str = "--out") -> None:
    """Make ``out_dir`` and check that files ``names`` can be written there; ``OutputError`` if not.

    ``flag`` names the option the folder came from, in the message.
    """
    out_dir = Path(out_dir)
    for parent in (out_dir, *out_dir.parents):
        if parent.exists() and not parent.is_dir():
            raise OutputError(f"{flag} {out_dir}: {parent} is a file, not a folder; give a folder path")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out_dir, prefix=".write-check-"):
            pass
    except OSError as error:
        why = error.strerror or error
        raise OutputError(f"{flag} {out_dir}: cannot write there ({why}); give a writable folder") from None
    for name in names:
        path = out_dir / name
        if path.exists() and (not path.is_file() or not os.access(path, os.W_OK)):
            raise OutputError(f"{flag} {out_dir}: {path} exists and cannot be replaced by a file; move it away")


def claim_out_dir(out_dir: Path, names: Sequence[str], overwrite: bool, command: str, flag: str = "--out",
                  keep: bool = False, hint: str = "", log: Callable[[str], None] = print) -> List[Path]:
    """The output rule of every bench command, applied before the work: ``out_dir`` can take the files
    ``names`` (:func:`check_out_dir`) and holds none of them, unless ``overwrite``: then those there are
    moved aside (``<name>.previous-<time>``, :func:`weightformer.engine.outputs.move_aside`), never
    deleted. Other files in the folder (another suite's subfolder, a profile) are never touched.
    ``keep`` (the sweep's ``--resume`` with its journal there) leaves the files in place, to be continued;
    ``hint`` ends the refusal's message.

    Returns the new names of the files moved aside, each also told to ``log``; raises :class:`OutputError`
    (one line) where the folder cannot be used.
    """
    out_dir = Path(out_dir)
    check_out_dir(out_dir, names, flag)
    if keep:
        return []
    try:
        moved = claim_outputs([out_dir / name for name in names], overwrite, command, flag, hint=hint)
    except ConfigError as exc:
        raise OutputError(str(exc)) from None
    if moved:
        log(f"--overwrite: the earlier results moved aside ({', '.join(p.name for p in moved)}, in {out_dir})")
    return moved


def write_json(result: Dict[str, Any], path: Path) -> None:
    """The whole result document, machine and config included."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, (json.dumps(result, indent=2) + "\n").encode())


def write_csv(result: Dict[str, Any], path: Path) -> None:
    """One line per (model, resolution, batch, measurement); the machine is named in a leading comment."""
    path.parent.mkdir(parents=True, exist_ok=True)
    f = io.StringIO(newline="")
    command = result["machine"].get("command")
    f.write(f"# machine: {describe(result['machine'])}" + (f"; command: {command}" if command else "") + "\n")
    writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    for row in result["rows"]:
        writer.writerow({**row, "samples_s": ";".join(f"{s:.6g}" for s in row["samples_s"])})
    write_atomic(path, f.getvalue().encode())


def _cell(row: Optional[Dict[str, Any]], digits: int, ratio: bool = True) -> str:
    if row is None:
        return "—"
    if row["status"] != "ok":
        return "OOM" if row["status"] == "oom" else "skipped"
    text = f"{row['value']:.{digits}f}"
    if ratio and row["ratio_vs_baseline"] is not None and row["model"] != row["baseline_model"]:
        text += f" ({row['ratio_vs_baseline']:.2f}×)"
    return text


def markdown_table(result: Dict[str, Any]) -> str:
    """A Markdown table per resolution: params, GMACs, throughputs and extra peak memory, with ratios vs DeiT."""
    rows: List[Dict[str, Any]] = result["rows"]
    index = {(r["model"], r["resolution"], r["measurement"]): r for r in rows}
    flops = {(f["model"], f["resolution"]): f for f in result.get("flops", [])}
    models = list(dict.fromkeys(r["model"] for r in rows)) or list(dict.fromkeys(f["model"] for f in flops.values()))
    resolutions = sorted({r["resolution"] for r in rows} | {f["resolution"] for f in flops.values()})
    labels = {r["model"]: r["label"] for r in rows}
    where = "cuda" if str(result["config"]["device"]).startswith("cuda") else "cpu"
    memory_header = "peak RSS" if where == "cpu" else "CUDA max allocated"
    lines = [
        provenance(result["machine"]),
        "",
        f"{result['config']['dtype']}. Throughput in images/s (higher is better). Memory in MiB (lower is better) "
        f"is the extra peak of one call (one forward, or one training step) over a warmed-up process: "
        f"{MEMORY_METHODS[where]}. Ratios in brackets are against the DeiT of the same size with fused "
        "attention, at the same point. GMACs per image include attention matmuls.",
        "",
    ]
    for res in resolutions:
        batch = next((r["batch"] for r in rows if r["resolution"] == res), 1)
        lines += [
            f"### {res}×{res} (batch {batch})",
            "",
            f"| Model | Params (M) | GMACs | Inference img/s | Training img/s "
            f"| Inference memory (MiB, {memory_header}) | Training memory (MiB, {memory_header}) |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for model in models:
            cells = [index.get((model, res, m)) for m in ("infer_throughput", "train_throughput", "infer_memory", "train_memory")]
            entry = flops.get((model.removesuffix("-ckpt"), res))
            if entry is None and all(c is None for c in cells):
                continue
            params = f"{entry['params'] / 1e6:.2f}" if entry else "—"
            gmacs = f"{entry['macs'] / 1e9:.2f}" if entry else "—"
            label = labels.get(model, model)
            lines.append(
                f"| {label} | {params} | {gmacs} | {_cell(cells[0], 2)} | {_cell(cells[1], 2)} "
                f"| {_cell(cells[2], 0)} | {_cell(cells[3], 0)} |"
            )
        lines.append("")
    skipped = [r for r in rows if r["status"] != "ok"]
    if skipped:
        lines += ["Points skipped or out of memory (OOM):", ""]
        lines += [
            f"- {r['label']}, {r['measurement']}, {r['resolution']}px: "
            f"{'OOM, ' if r['status'] == 'oom' else ''}{r['reason']}"
            for r in skipped
        ]
        lines.append("")
    return "\n".join(lines)


def write_markdown(result: Dict[str, Any], path: Path) -> None:
    """Write ``markdown_table(result)`` to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, markdown_table(result).encode())


def plot_scaling(result: Dict[str, Any], path: Path) -> None:
    """The scaling figure: inference throughput and peak memory against resolution, both axes logarithmic.

    Memory is the training step's extra peak where measured, else the inference call's.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r["status"] == "ok"]
    memory_kind = "train_memory" if any(r["measurement"] == "train_memory" for r in rows) else "infer_memory"
    memory_label = {"train_memory": "training step", "infer_memory": "inference"}[memory_kind]
    panels = [
        ("infer_throughput", "inference throughput (img/s)"),
        (memory_kind, f"{memory_label} extra peak memory (MiB)"),
    ]
    # One colour per model across both panels; WeightFormer solid, DeiT dashed.
    models = list(dict.fromkeys(r["model"] for r in rows))
    colours = {model: f"C{i % 10}" for i, model in enumerate(models)}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, (measurement, ylabel) in zip(axes, panels):
        for model in models:
            points = sorted((r["resolution"], r["value"]) for r in rows if r["model"] == model and r["measurement"] == measurement)
            if not points:
                continue
            label = next(r["label"] for r in rows if r["model"] == model)
            style = "-" if model.startswith("wf") else "--"
            xs, ys = zip(*points)
            ax.plot(xs, ys, style, color=colours[model], marker="o", label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        resolutions = sorted({r["resolution"] for r in rows})
        if resolutions:
            ax.set_xticks(resolutions)
            # Batch sizes differ between resolutions, and memory is per call, so name the batch too.
            batch_of = {r["resolution"]: r["batch"] for r in rows}
            ax.set_xticklabels([f"{r}\nbatch {batch_of[r]}" for r in resolutions])
            ax.minorticks_off()
        ax.set_xlabel("resolution (px per side)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(f"{describe(result['machine'])}, {result['config']['dtype']}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    image = io.BytesIO()
    fig.savefig(image, dpi=120, format="png")
    plt.close(fig)
    write_atomic(path, image.getvalue())


def write_all(result: Dict[str, Any], out_dir: Path) -> List[Path]:
    """results.json, results.csv, results.md and scaling.png under ``out_dir``; returns the paths."""
    out_dir = Path(out_dir)
    paths = [out_dir / name for name in OUTPUT_NAMES]
    write_json(result, paths[0])
    write_csv(result, paths[1])
    write_markdown(result, paths[2])
    plot_scaling(result, paths[3])
    return paths
