"""The long-range probe suite over designs: each design trained on each probe at 64 px (several seeds), run at
64 and 128 px with the same glyphs, and tabulated (mean ± std over seeds) with each design's cost.

    python benchmarks/examples/probe_suite.py --designs long_range long_range_local_dwc --seeds 0 1 --jobs 2
    python benchmarks/examples/probe_suite.py --probes path_link --designs long_range_local_dwc --seeds 0
    python benchmarks/examples/probe_suite.py --table-only         # the tables from the runs on disk
    python benchmarks/examples/probe_suite.py --epochs 24 --runs runs/probe_suite_24ep --out OUT  # a longer budget
    python benchmarks/examples/probe_suite.py --designs long_range_led --table-only \
        --keep benchmarks/results/probes/suite/designs.json   # these runs added to a committed table's

Each run is ``weightformer train --data PROBE:size=64,scale=2`` (``path_link`` with ``ends=matched``) with the
probe recipe (4-block 64-d model at patch 4, 12 epochs, batch 128; configs/classification/probe.yaml) and the
design's model, on one thread, into ``--runs``/<design>/<probe>/seed<N>/; a run with a finished ``last.pt`` is not
run again, and one trained on other data is refused. The evaluation is
:func:`weightformer.analysis.transfer.transfer_table` (``weightformer analyze transfer``): the held-out split
drawn afresh at each size at the trained glyph scale, 2,000 images per size (``--eval-images``). The held-out
relation (``HELD_OUT``, scale_match) comes last in every table. ``--keep`` adds the runs of an earlier record
(its JSON) that this call does not evaluate, with their own commands and accuracies, so a table can grow by a
design after the earlier runs' folders are gone. Costs: parameters and GFLOPs of each design at
WeightFormer-T's size (1000 classes) at 224² and 1248², counted on the meta device.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from long_range_tasks import ROOT, _mean_std, _run  # this folder's: one thread per run, this checkout's package

# design -> (timm model, model kwargs beyond the probe recipe's patch_size=4 embed_dim=64 depth=4)
DESIGNS: dict[str, tuple[str, dict[str, Any]]] = {
    "released": ("weightformer_tiny", {}),
    "long_range": ("weightformer_long_range_tiny", {}),
    "long_range_local_dwc": ("weightformer_long_range_tiny", {"dwc_dynamic_period": 3}),
    "long_range_gated": ("weightformer_long_range_tiny", {"linear_predictor": "double_centered_gated",
                                                          "dwc_dynamic_period": 3}),
    "long_range_late": ("weightformer_long_range_tiny", {"linear_predictor": "double_centered_gated",
                                                         "dwc_dynamic_period": 3, "dynamic_linear_start": "half"}),
    "long_range_offset_corr": ("weightformer_long_range_tiny", {"dwc_predictor": "offset_corr"}),
    "long_range_static_led": ("weightformer_long_range_tiny", {"linear_predictor": "double_centered_gated",
                                                               "dwc_predictor": "offset_corr", "dwc_static_led": True}),
    "long_range_led": ("weightformer_long_range_tiny", {"linear_predictor": "double_centered_gated_led",
                                                        "dwc_predictor": "offset_corr", "dwc_static_led": True}),
    "long_range_led_background": ("weightformer_long_range_tiny", {
        "linear_predictor": "double_centered_gated_led", "dwc_predictor": "offset_corr", "dwc_static_led": True,
        "dwc_padding": "background"}),
}
T_DEPTH = 17  # WeightFormer-T's, for the costs


def design_kwargs(design: str, depth: int) -> dict[str, Any]:
    """The design's model kwargs for a model of ``depth`` blocks: ``"half"`` is the later half's first block."""
    return {k: depth // 2 if v == "half" else v for k, v in DESIGNS[design][1].items()}
PROBE_SIZE, LARGE_SIZE, SCALE = 64, 128, 2
EVAL_IMAGES = 2000  # held-out images per size
LEARNED = 55.0  # % at 64 px, 4.5 binomial standard errors above chance at 2,000 images: below it, no share kept
# path_link's markers are as far apart in both classes: with its default ends=free their distance alone predicts 60%
# of the labels at 64 px, as much as the trained designs score (path_link_cues.py, docs/probes.md)
PROBE_OPTIONS = {"path_link": ["ends=matched"]}
PROBE_MODEL_KWARGS = {"patch_size": 4, "embed_dim": 64, "depth": 4, "drop_path_rate": 0.0}


def probe_data(probe: str) -> str:
    """The ``--data`` of the suite's runs of ``probe``."""
    return ",".join([f"{probe}:size={PROBE_SIZE}", f"scale={SCALE}", *PROBE_OPTIONS.get(probe, [])])


def train_command(design: str, probe: str, seed: int, out: Path, epochs: int | None = None) -> list[str]:
    """The run's ``weightformer train`` command; ``epochs``: the recipe's (12) unless given."""
    model = DESIGNS[design][0]
    kwargs = {**PROBE_MODEL_KWARGS, **design_kwargs(design, PROBE_MODEL_KWARGS["depth"])}
    return ["weightformer", "train", "--data", probe_data(probe), "--model", model,
            "--model-kwargs", *(f"{k}={v}" for k, v in kwargs.items()),
            *(["--epochs", str(epochs)] if epochs is not None else []), "--seed", str(seed), "--output", str(out)]


def run_one(design: str, probe: str, seed: int, runs: Path, epochs: int | None = None) -> Path:
    """The run's ``last.pt``, trained first unless the run has finished (a run cut short starts again)."""
    out = runs / design / probe / f"seed{seed}"
    if epochs_done(out) < (epochs or recipe_epochs()):
        out.mkdir(parents=True, exist_ok=True)
        _run([*train_command(design, probe, seed, out, epochs), "--overwrite"], out.parent / f"seed{seed}.log")
    return out / "last.pt"


def recipe_epochs() -> int:
    """The probe recipe's epochs (configs/classification/probe.yaml)."""
    import yaml

    return int(yaml.safe_load((ROOT / "configs" / "classification" / "probe.yaml").read_text())["epochs"])


def run_epochs(run: Path) -> int | None:
    """The epochs a run folder's training was configured for (its config.yaml), None where it has none."""
    import yaml

    return int(yaml.safe_load((run / "config.yaml").read_text())["epochs"]) if (run / "config.yaml").is_file() else None


def epochs_done(run: Path) -> int:
    """The last epoch a run folder's training finished (its metrics.jsonl; 0 where none)."""
    lines = (run / "metrics.jsonl").read_text().splitlines() if (run / "metrics.jsonl").is_file() else []
    return int(json.loads(lines[-1]).get("epoch", 0)) if lines and (run / "last.pt").is_file() else 0


def evaluate(checkpoints: list[Path], cache: Path, images: int) -> list[dict[str, Any]]:
    """Each checkpoint's accuracy at both sizes on ``images`` held-out images per size, kept in ``cache`` (a JSON
    file) by path, modification time and number of images."""
    from weightformer.analysis.transfer import transfer_table

    known = json.loads(cache.read_text()) if cache.is_file() else {}
    rows = []
    for path in checkpoints:
        key = f"{path}:{path.stat().st_mtime_ns}:val={images}"
        if key not in known:
            known[key] = transfer_table([str(path)], [PROBE_SIZE, LARGE_SIZE], val=images)[0]
            cache.write_text(json.dumps(known, indent=1) + "\n")
        rows.append(known[key])
    return rows


def design_costs(design: str) -> dict[str, float]:
    """Parameters (M) and GFLOPs (2 × multiply-adds) at WeightFormer-T's size (17 blocks), 224² and 1248²."""
    import timm
    import torch

    import weightformer  # noqa: F401  (registers the models)
    from weightformer.bench.flops import count_flops

    model_name, kwargs = DESIGNS[design][0], design_kwargs(design, T_DEPTH)
    out: dict[str, float] = {}
    for size in (224, 1248):
        with torch.device("meta"):
            model = timm.create_model(model_name, img_size=size, **kwargs).eval()
        out[f"gflops_{size}"] = count_flops(model, torch.empty(1, 3, size, size, device="meta")).flops / 1e9
    out["params_M"] = sum(p.numel() for p in model.parameters()) / 1e6  # the same at any size: no position table
    return out


def earlier_record(path: Path, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The record at ``path`` (``--keep``: a designs.json this script wrote), refused in one line if it is not one."""
    from weightformer.data.probes import SUITE

    try:
        record = json.loads(path.read_text())
        missing = [key for key in ("command", "machine", "epochs", "eval_images", "runs") if key not in record]
        bad = [r for r in record.get("runs", []) if r.get("design") not in DESIGNS or r.get("probe") not in SUITE
               or not isinstance(r.get("seed"), int)
               or not {str(PROBE_SIZE), str(LARGE_SIZE)} <= set(r.get("accuracy", {}))]
    except OSError as exc:
        parser.error(f"--keep {path}: {exc.strerror or exc}")
    except (ValueError, AttributeError, TypeError) as exc:
        parser.error(f"--keep {path} is not a probe_suite.py record (designs.json): {exc}")
    if missing or bad:
        parser.error(f"--keep {path} is not a probe_suite.py record (designs.json): "
                     + (f"no {', '.join(missing)}" if missing else f"a run it names is not this script's: {bad[0]}"))
    return record


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-seed accuracies at both sizes, their ratio and the share of the above-chance accuracy kept."""
    small = [r["accuracy"][str(PROBE_SIZE)] for r in rows]
    large = [r["accuracy"][str(LARGE_SIZE)] for r in rows]
    return {"small": small, "large": large, "ratio": [b / a for a, b in zip(small, large)],
            "kept": [(b - 50) / (a - 50) if a >= LEARNED else None for a, b in zip(small, large)]}


def _kept(kept: list[float | None]) -> str:
    """The above-chance share's mean ± std, or a dash where a seed did not learn the relation at 64 px (None)."""
    return "— (not learned)" if None in kept else _mean_std(kept, 2)


def markdown(table: dict[str, dict[str, dict[str, Any]]], costs: dict[str, dict[str, float]],
             probes: list[str], images: int, epochs: int) -> str:
    from weightformer.data.probes import HELD_OUT

    lines = [f"Trained {epochs} epochs at {PROBE_SIZE} px. "
             f"Held-out accuracy (%) on {images:,} images per size; mean ± std over seeds. Above chance kept: "
             f"(acc₁₂₈ − 50) / (acc₆₄ − 50), where every seed reached {LEARNED:.0f}% at {PROBE_SIZE} px.", "",
             f"| design | probe | seeds | {PROBE_SIZE} px | {LARGE_SIZE} px | {LARGE_SIZE} / {PROBE_SIZE} | "
             "above chance kept | per seed (64 → 128) |", "|---" * 8 + "|"]
    for design, per_probe in table.items():
        for probe in probes:
            if probe not in per_probe:
                continue
            s = per_probe[probe]
            seeds = " / ".join(f"{a:.1f} → {b:.1f}" for a, b in zip(s["small"], s["large"]))
            name = f"{probe} (held out)" if probe in HELD_OUT else probe
            lines.append(f"| {design} | {name} | {len(s['small'])} | {_mean_std(s['small'], 1)} | {_mean_std(s['large'], 1)} | "
                         f"{_mean_std(s['ratio'], 2)} | {_kept(s['kept'])} | {seeds} |")
    lines += ["", "| design | model | params at T size | GFLOPs at 224² | GFLOPs at 1248² |", "|---|---|---|---|---|"]
    for design, c in costs.items():
        model, kwargs = DESIGNS[design]
        shown = " ".join(f"{k}={v}" for k, v in kwargs.items())
        lines.append(f"| {design} | `{model}`{' ' + shown if shown else ''} | {c['params_M']:.2f}M | "
                     f"{c['gflops_224']:.3f} | {c['gflops_1248']:.2f} |")
    if any("half" in DESIGNS[d][1].values() for d in costs):
        lines += ["", f"`half`: depth // 2, the first block of the later half ({PROBE_MODEL_KWARGS['depth'] // 2} of "
                      f"the probes' {PROBE_MODEL_KWARGS['depth']} blocks, {T_DEPTH // 2} of T's {T_DEPTH})."]
    return "\n".join(lines) + "\n"


def plot(table: dict[str, dict[str, dict[str, Any]]], probes: list[str], path: Path) -> None:
    """One panel per probe: accuracy (mean, std as error bars) at each size, one line per design."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [p for p in probes if any(p in per_probe for per_probe in table.values())]
    fig, axes = plt.subplots(1, len(shown), figsize=(2.6 * len(shown), 3.3), sharey=True, squeeze=False)
    colours = {design: f"C{i}" for i, design in enumerate(table)}  # one colour per design in every panel
    for ax, probe in zip(axes[0], shown):
        for design, per_probe in table.items():
            if probe in per_probe:
                s = per_probe[probe]
                means = [statistics.mean(s["small"]), statistics.mean(s["large"])]
                stds = [statistics.stdev(v) if len(v) > 1 else 0.0 for v in (s["small"], s["large"])]
                ax.errorbar([PROBE_SIZE, LARGE_SIZE], means, yerr=stds, marker="o", capsize=3, label=design,
                            color=colours[design])
        ax.axhline(50.0, color="grey", linestyle=":", linewidth=1)
        ax.set_title(probe, fontsize=8)
        ax.set_xticks([PROBE_SIZE, LARGE_SIZE])
        ax.set_xlabel("canvas (px)", fontsize=7)
    axes[0][0].set_ylabel("held-out top-1 (%)")
    handles = [plt.Line2D([], [], color=colours[d], marker="o", label=d) for d in table]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    from weightformer.data.probes import SUITE

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--designs", nargs="+", default=list(DESIGNS), choices=list(DESIGNS))
    parser.add_argument("--probes", nargs="+", default=list(SUITE), choices=list(SUITE))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (each on one thread)")
    parser.add_argument("--epochs", type=int, help="training epochs (default: the recipe's 12); keep each budget's "
                                                   "runs in a --runs folder of their own")
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "probe_suite")
    parser.add_argument("--table-only", action="store_true", help="no training: the runs on disk")
    parser.add_argument("--eval-images", type=int, default=EVAL_IMAGES,
                        help="held-out images per size (default %(default)s: a binomial standard error of at most "
                             "1.1 points; on 1,000 one checkpoint read 52.6 and 55.8%% on two draws)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "probes" / "suite" / "designs")
    parser.add_argument("--keep", type=Path, metavar="JSON",
                        help="an earlier record (designs.json): its runs not evaluated here join the table")
    args = parser.parse_args(argv)
    earlier = earlier_record(args.keep, parser) if args.keep else None
    probes = [p for p in SUITE if p in args.probes]  # report order: the held-out relation last
    todo = [(d, p, s) for d in args.designs for p in probes for s in args.seeds]
    epochs = args.epochs or recipe_epochs()
    for d, p, s in todo:  # a run of another budget is refused before anything is trained (or trained over)
        run = args.runs / d / p / f"seed{s}"
        if run_epochs(run) not in (None, epochs):
            parser.error(f"{run} was trained for {run_epochs(run)} epochs, not {epochs}; pass --epochs "
                         f"{run_epochs(run)}, or a --runs folder of {epochs}-epoch runs")
    if args.table_only:
        found = [(d, p, s) for d, p, s in todo if epochs_done(args.runs / d / p / f"seed{s}") == epochs]
        for job in sorted(set(todo) - set(found)):
            if (args.runs.joinpath(*job[:2], f"seed{job[2]}") / "last.pt").is_file():
                print(f"skipped (not finished): {args.runs.joinpath(*job[:2], f'seed{job[2]}')}", file=sys.stderr)
        if not found and not earlier:
            parser.error(f"no finished {epochs}-epoch run of these designs, probes and seeds under {args.runs}; "
                         f"pass the folder they were trained into with --runs")
        checkpoints = [args.runs / d / p / f"seed{s}" / "last.pt" for d, p, s in found]
        todo = found
    else:
        with ThreadPoolExecutor(args.jobs) as pool:
            checkpoints = list(pool.map(lambda job: run_one(*job, args.runs, args.epochs), todo))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows = evaluate(checkpoints, args.runs / "transfer_cache.json", args.eval_images)
    for (_, probe, _), path, row in zip(todo, checkpoints, rows):  # each row names the data its checkpoint saw
        if row["trained_on"] != probe_data(probe):
            parser.error(f"{path} was trained on {row['trained_on']!r}, not the suite's {probe_data(probe)!r}; "
                         f"move that run away (or delete it) and run again")
    runs = [{"design": d, "probe": p, "seed": s,
             "command": shlex.join(train_command(d, p, s, args.runs / d / p / f"seed{s}", args.epochs)),
             "accuracy": row["accuracy"]} for (d, p, s), row in zip(todo, rows)]
    if earlier:
        for key, ours in (("epochs", epochs), ("eval_images", args.eval_images)):
            if earlier[key] != ours:
                parser.error(f"--keep {args.keep} holds runs with {key}={earlier[key]}, these have {ours}; "
                             f"keep a record of the same budget and evaluation")
        evaluated = {(r["design"], r["probe"], r["seed"]) for r in runs}
        runs += [r for r in earlier["runs"] if (r["design"], r["probe"], r["seed"]) not in evaluated]
    runs.sort(key=lambda r: (list(DESIGNS).index(r["design"]), list(SUITE).index(r["probe"]), r["seed"]))
    table: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for run in runs:
        table.setdefault(run["design"], {}).setdefault(run["probe"], []).append(run)
    table = {d: {p: summarize(r) for p, r in per_probe.items()} for d, per_probe in table.items()}
    costs = {d: design_costs(d) for d in table}
    from weightformer.bench.results import machine_info

    command = "python benchmarks/examples/probe_suite.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    record = {"machine": {**machine_info(command=command), "threads_per_run": 1}, "command": command,
              "epochs": epochs, "sizes": [PROBE_SIZE, LARGE_SIZE], "scale": SCALE,
              "eval_images": args.eval_images, "designs": {d: list(DESIGNS[d]) for d in table},
              "runs": runs, "summary": table, "costs": costs}
    if earlier:  # where the kept runs were measured (and, for a record that kept runs itself, where those were)
        record["kept_from"] = {"path": str(args.keep), **{k: earlier[k] for k in ("command", "machine", "kept_from")
                                                          if k in earlier}}
    from weightformer.atomic import write_atomic  # the record --keep read may be the one rewritten here

    write_atomic(args.out.with_suffix(".json"), json.dumps(record, indent=1) + "\n")
    tabulated = [p for p in SUITE if any(p in per_probe for per_probe in table.values())]  # kept ones too
    text = markdown(table, costs, tabulated, args.eval_images, epochs)
    write_atomic(args.out.with_suffix(".md"), text)
    plot(table, tabulated, args.out.with_suffix(".png"))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
