"""``weightformer ablate CONFIG.yaml``: train a grid of variants × seeds with one recipe, then tabulate.

The config (see configs/ablations/) maps ``name``, ``output`` (run folders ``<output>/<variant>/seed<seed>/``),
``seeds``, ``recipe`` (TrainConfig settings every run shares) and ``variants`` (name -> settings over the recipe).
Everything is checked before the first run (settings resolved, every variant's model built on the ``meta``
device); a finished run (``result.json``) is skipped, an interrupted one resumed, and one whose recorded
settings differ from the file's is refused unless ``--rerun-changed``. The table (mean ± std top-1 over seeds,
params, FLOPs, img/s) is written as Markdown, JSON and a PNG plot.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..classification.config import ClassificationConfig
from ..engine.config import config_fields, load_yaml, yaml_reason
from ..engine.errors import USER_ERRORS, ConfigError, brief
from ..engine.metrics import json_text, read_metrics
from ..engine.outputs import write_atomic

__all__ = ["AblationConfig", "RunPlan", "check_variant_model", "load_ablation",
           "main", "measure_cost", "plan_ablation", "plan_run", "resolved_settings", "run_ablation", "setting_changes",
           "summarise"]

_KEYS = ("name", "output", "seeds", "recipe", "variants", "throughput_batch")


@dataclass
class AblationConfig:
    """A grid: ``variants`` (name -> TrainConfig settings) × ``seeds``, over a shared ``recipe``."""

    name: str
    output: Path
    seeds: list[int]
    recipe: dict[str, Any]
    variants: dict[str, dict[str, Any]]
    throughput_batch: int = 64  # images per forward pass when timing inference
    source: str = field(default="", repr=False)

    def folder(self, variant: str, seed: int) -> Path:
        return self.output / variant / f"seed{seed}"


def _check_settings(values: Any, where: str) -> dict[str, Any]:
    if not isinstance(values, dict):
        raise ConfigError(f"{where} must be a mapping of training settings, got {brief(values)}")
    for key in values:
        if key not in config_fields(ClassificationConfig) or key in ("output", "seed", "resume", "overwrite"):
            raise ConfigError(f"{where}: {brief(key)} is not a setting a variant may set; use classification settings "
                              f"other than output, seed, resume and overwrite (the runner sets those)")
    return values


def _is_int(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def load_ablation(path: str | os.PathLike) -> AblationConfig:
    """Read and check an ablation YAML file (ConfigError on anything wrong, naming the key)."""
    path = Path(path)
    where = f"ablation config {path}"
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        raise ConfigError(f"{where} {what}; pass a YAML file such as configs/ablations/dynamic_period.yaml")
    try:
        raw = load_yaml(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where} is not a text file (not UTF-8); pass a YAML file") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where} is not valid YAML ({yaml_reason(exc)})") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping with keys {', '.join(_KEYS)}")
    unknown = sorted(set(raw) - set(_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(_KEYS)}")
    variants = raw.get("variants")
    if not isinstance(variants, dict) or not variants:
        raise ConfigError(f"{where}: 'variants' must map variant names to settings, e.g. "
                          f"{{period_3: {{model_kwargs: {{dynamic_period: 3}}}}}}")
    seeds = raw.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(_is_int(s, 0) for s in seeds):
        raise ConfigError(f"{where}: 'seeds' must be a list of non-negative integers, got {brief(seeds)}")
    check_seeds(seeds, f"{where}: 'seeds'")
    batch = raw.get("throughput_batch", 64)
    if not _is_int(batch, 1):
        raise ConfigError(f"{where}: 'throughput_batch' must be a positive number of images, got {brief(batch)}")
    for name in variants:
        if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
            raise ConfigError(f"{where}: variant name {brief(name)} must be a plain folder name")
    return AblationConfig(
        name=str(raw.get("name") or path.stem), output=Path(raw.get("output") or f"runs/ablations/{path.stem}"),
        seeds=seeds, recipe=_check_settings(raw.get("recipe", {}), "recipe"),
        variants={name: _check_settings(v or {}, f"variant {brief(name)}") for name, v in variants.items()},
        throughput_batch=batch, source=str(path))


def check_seeds(seeds: Sequence[int], where: str) -> None:
    """ConfigError for a seed given twice (the two would be one run, counted twice in the mean ± std)."""
    twice = sorted({seed for seed in seeds if list(seeds).count(seed) > 1})
    if twice:
        raise ConfigError(f"{where} gives seed(s) {', '.join(map(str, twice))} twice; each seed is one run, list it once")


def run_settings(config: AblationConfig, variant: str, seed: int) -> dict[str, Any]:
    """The TrainConfig overrides of one run: recipe, then the variant (model_kwargs merged key by key)."""
    settings = {**config.recipe, **config.variants[variant]}
    settings["model_kwargs"] = {**config.recipe.get("model_kwargs", {}), **config.variants[variant].get("model_kwargs", {})}
    return {**settings, "seed": seed, "output": str(config.folder(variant, seed)), "resume": "auto"}


class GridStopped(Exception):
    """A signal stopped a run of the grid (its last.pt is saved): the grid stops too, with the signal's exit code."""

    def __init__(self, signal_name: str):
        super().__init__(signal_name)
        self.signal_name = signal_name


# Settings that say how a run is carried out, not what it computes: a change of them keeps its results.
_NOT_COMPARED = ("output", "resume", "overwrite", "workers", "log_interval")


def resolved_settings(config: AblationConfig, variant: str, seed: int) -> dict[str, Any]:
    """The settings one run resolves to as a new run of :func:`weightformer.engine.train`, as plain values:
    what keys a finished run."""
    from ..engine import prepare_config

    settings = {**run_settings(config, variant, seed), "resume": None}
    try:
        return prepare_config(settings, task="classification").cfg.to_dict()
    except ConfigError as exc:
        raise ConfigError(f"variant {variant!r}: {exc}") from exc


def setting_changes(recorded: dict[str, Any], wanted: dict[str, Any], ignore: Sequence[str] = ()) -> list[str]:
    """``"name old -> new"`` for each setting of ``wanted`` that ``recorded`` (a run's saved settings) holds with
    another value; settings the record lacks are not compared."""
    changes = []
    for name, value in wanted.items():
        if name in _NOT_COMPARED or name in ignore or name not in recorded:
            continue
        old, new = json.loads(json.dumps(recorded[name])), json.loads(json.dumps(value))  # tuples as lists
        if old == new:
            continue
        if isinstance(old, dict) and isinstance(new, dict):  # model_kwargs: name the keys that differ
            missing = object()
            changes += [f"{name}.{key} {old.get(key, '(unset)')!r} -> {new.get(key, '(unset)')!r}"
                        for key in dict.fromkeys([*old, *new]) if old.get(key, missing) != new.get(key, missing)]
        else:
            changes.append(f"{name} {old!r} -> {new!r}")
    return changes


@dataclass
class RunPlan:
    """What the grid does with one run: ``new`` (train it), ``resume`` (continue its last.pt),
    ``finished`` (reuse its result.json) or ``changed`` (its record differs from ``settings``)."""

    variant: str
    seed: int
    folder: Path
    settings: dict[str, Any]  # resolved (resolved_settings)
    status: str
    changes: list[str] = field(default_factory=list)


def _recorded_settings(path: Path) -> dict[str, Any] | None:
    """The resolved settings a checkpoint of a run was saved with."""
    from ..engine import load_model

    config = load_model(path, task="classification").checkpoint.get("config")
    return dict(config) if isinstance(config, dict) else None


def plan_run(config: AblationConfig, variant: str, seed: int, settings: dict[str, Any]) -> RunPlan:
    """Compare a run's folder with the settings it should have (see :class:`RunPlan`)."""
    folder = config.folder(variant, seed)
    done, last = folder / "result.json", folder / "last.pt"
    plan = RunPlan(variant, seed, folder, settings, "new")
    if done.is_file():
        try:
            record = json.loads(done.read_text())
            recorded = record.get("config")
            if not all(math.isfinite(record[k]) for k in ("top1_last", "top1_best")):
                raise ValueError("its top-1 is not a finite number")
        except (ValueError, UnicodeDecodeError, AttributeError, KeyError, TypeError) as exc:
            raise ConfigError(f"{done} is not a result of this runner ({exc}); move it away to train the run "
                              f"again") from exc
        if recorded is None and last.is_file():  # a result.json without the settings: read them from last.pt
            recorded = _recorded_settings(last)
        plan.changes = ["its settings are not recorded"] if recorded is None else setting_changes(recorded, settings)
        plan.status = "changed" if plan.changes else "finished"
    elif last.is_file():  # interrupted: it may continue only under the settings it started with
        plan.changes = setting_changes(_recorded_settings(last) or {}, settings, ignore=("max_steps",))
        plan.status = "changed" if plan.changes else "resume"
    return plan


def _data_shape(data: str) -> tuple[int, int]:
    """(input channels, classes) of the data without opening it (a folder's classes are its train/ subfolders)."""
    from ..data import BUILTIN_DATASETS
    from ..data.errors import DataError

    spec = BUILTIN_DATASETS.get(data)
    if spec is not None:
        return spec.in_chans, spec.num_classes
    root = Path(data).expanduser()
    if not root.is_dir():
        raise DataError(f"data {data}: no such folder; pass an ImageFolder tree (train/ and val/ with one subfolder "
                        f"per class) or a built-in data set name such as mnist")
    train = root / "train"
    classes = sum(1 for p in train.iterdir() if p.is_dir()) if train.is_dir() else 0
    return 3, max(classes, 1)  # folders are read as RGB


def check_variant_model(variant: str, settings: dict[str, Any]) -> None:
    """Build a variant's model and give it one blank image of the run's size, as the run's
    :meth:`ClassificationTask.build_model` does, on PyTorch's ``meta`` device (shapes only; on the CPU for a
    model the meta device cannot run). A bad kwarg or size is one ConfigError naming the variant."""
    import torch

    from ..classification.model import build_classifier, check_input_size
    from ..classification.task import ClassificationTask
    from ..data.errors import DataError
    from ..engine import validate_config

    fields = config_fields(ClassificationConfig)
    cfg = validate_config(ClassificationConfig(**{k: v for k, v in settings.items() if k in fields}))
    task = ClassificationTask(cfg)
    try:
        in_chans, num_classes = _data_shape(cfg.data)
    except DataError as exc:
        raise DataError(f"variant {variant!r}: {exc}") from exc

    def check(device: torch.device) -> None:
        try:
            with device:
                model = build_classifier(meta)
        except AssertionError as exc:  # timm checks its arguments with asserts (e.g. embed_dim % num_heads)
            reason = str(exc).strip() or "an assertion failed"
            raise ConfigError(f"cannot build {cfg.model} with model arguments {meta['model_kwargs']}: {reason}; "
                              f"check its model_kwargs") from exc
        check_input_size(model, meta, device)

    try:
        meta = {"task": task.name, "model": cfg.model, "model_kwargs": task.model_kwargs(), "num_classes": num_classes,
                "in_chans": in_chans, "img_size": task.img_size}
        try:
            check(torch.device("meta"))
        except USER_ERRORS:
            raise
        except Exception:  # an operation without a meta kernel (or a data-dependent one): the real thing, on the CPU
            check(torch.device("cpu"))
    except ConfigError as exc:
        raise ConfigError(f"variant {variant!r}: {exc}") from exc


def train_one(config: AblationConfig, variant: str, seed: int, fresh: bool = False) -> dict[str, Any]:
    """Train (or resume) one run and record its result.json; returns the result. ``fresh``: start anew though
    the folder holds a run of other settings (its files are moved aside, never deleted)."""
    from ..engine import train
    from ..engine.outputs import move_aside

    settings = run_settings(config, variant, seed)
    folder = Path(settings["output"])
    if fresh:
        settings.update(resume=None, overwrite=True)  # the engine moves the old run's files to previous-<time>/
        if (folder / "result.json").exists():
            move_aside(folder / "result.json")
    start = time.perf_counter()
    result = train(settings, task="classification")
    if result.stopped_by is not None:
        raise GridStopped(result.stopped_by)  # the run saved last.pt; the next `weightformer ablate` resumes it
    top1 = [r["val_top1"] for r in read_metrics(folder / "metrics.jsonl")]
    record = {"variant": variant, "seed": seed, "top1_last": top1[-1], "top1_best": max(top1), "epochs": len(top1),
              "train_seconds": round(time.perf_counter() - start, 1), "settings": settings,
              "config": _recorded_settings(folder / "last.pt")}  # what the run resolved to: the key of its result
    write_atomic(folder / "result.json", json_text(record, indent=2) + "\n")
    return record


def measure_cost(model_name: str, model_kwargs: dict[str, Any], num_classes: int, in_chans: int, img_size: int,
                 batch: int = 64, repeats: int = 5) -> dict[str, float]:
    """Parameters, FLOPs per image and inference img/s (median of ``repeats`` timed batches) of a model."""
    import timm
    import torch

    from ..bench.flops import count_flops
    from ..bench.timing import median

    model = timm.create_model(model_name, num_classes=num_classes, in_chans=in_chans, **model_kwargs).eval()
    images = torch.randn(batch, in_chans, img_size, img_size)
    flops = count_flops(model, images[:1]).flops
    times = []
    with torch.inference_mode():
        model(images)  # warm-up
        for _ in range(repeats):
            tick = time.perf_counter()
            model(images)
            times.append(time.perf_counter() - tick)
    return {"params": sum(p.numel() for p in model.parameters()), "flops": flops, "img_per_s": batch / median(times)}


def _variant_cost(config: AblationConfig, variant: str) -> dict[str, float]:
    """A variant's cost, measured from its first run's model and cached in cost.json (for that model)."""
    from ..engine import load_model

    path = config.output / variant / "cost.json"
    meta = load_model(config.folder(variant, config.seeds[0]) / "last.pt", task="classification").meta
    model = {k: meta[k] for k in ("model", "model_kwargs", "num_classes", "in_chans", "img_size")}
    if path.is_file():
        cached = json.loads(path.read_text())
        if cached.get("for") == model:
            return {k: cached[k] for k in ("params", "flops", "img_per_s")}
    cost = measure_cost(meta["model"], meta["model_kwargs"], meta["num_classes"], meta["in_chans"], meta["img_size"],
                        batch=config.throughput_batch)
    write_atomic(path, json_text({**cost, "for": model}, indent=2) + "\n")
    return cost


def summarise(config: AblationConfig, results: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per variant: mean ± std top-1 (last and best epoch) over seeds, and the variant's cost."""
    rows = []
    for variant, runs in results.items():
        row: dict[str, Any] = {"variant": variant, "seeds": [r["seed"] for r in runs]}
        for key in ("top1_last", "top1_best"):
            values = [r[key] for r in runs]
            row[f"{key}_mean"] = statistics.fmean(values)
            row[f"{key}_std"] = statistics.stdev(values) if len(values) > 1 else None
        rows.append({**row, **_variant_cost(config, variant), "settings": config.variants[variant]})
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of :func:`summarise`'s rows."""
    def pm(r: dict[str, Any], key: str) -> str:
        mean, std = r[f"{key}_mean"], r[f"{key}_std"]
        return f"{mean:.2f} ± {std:.2f}" if std is not None else f"{mean:.2f}"

    lines = ["| variant | top-1 last (%) | top-1 best (%) | seeds | params | MFLOPs | img/s |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['variant']} | {pm(r, 'top1_last')} | {pm(r, 'top1_best')} | {len(r['seeds'])} | "
              f"{r['params'] / 1e6:.3f}M | {r['flops'] / 1e6:.1f} | {r['img_per_s']:.0f} |" for r in rows]
    return "\n".join(lines)


def plot_table(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Top-1 (mean ± std over seeds) per variant as a bar chart, with MFLOPs under each name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(rows)), 3.2))
    names = [f"{r['variant']}\n{r['flops'] / 1e6:.0f} MFLOPs" for r in rows]
    ax.bar(names, [r["top1_last_mean"] for r in rows], yerr=[r["top1_last_std"] or 0 for r in rows], capsize=3)
    ax.set_ylim(max(0.0, min(r["top1_last_mean"] for r in rows) - 10), 100)
    ax.set_ylabel("top-1 (%), last epoch")
    ax.set_title(title)
    ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)


def plan_ablation(config: AblationConfig, only: Sequence[str] | None = None,
                  rerun_changed: bool = False) -> list[RunPlan]:
    """Everything checked before the first run: the variants named, every run's settings resolved, every
    variant's model built (:func:`check_variant_model`) and every run folder compared with what it should hold
    (:func:`plan_run`). A run of changed settings is a ConfigError unless ``rerun_changed``."""
    variants = list(dict.fromkeys(only or config.variants))
    missing = [v for v in variants if v not in config.variants]
    if missing:
        raise ConfigError(f"--only {', '.join(missing)}: not a variant of {config.source}; choose from "
                          f"{', '.join(config.variants)}")
    check_seeds(config.seeds, "--seeds")
    resolved = {(v, s): resolved_settings(config, v, s) for v in variants for s in config.seeds}
    for variant in variants:  # the model does not depend on the seed: one check per variant
        check_variant_model(variant, resolved[(variant, config.seeds[0])])
    plans = [plan_run(config, v, s, resolved[(v, s)]) for v in variants for s in config.seeds]
    changed = [plan for plan in plans if plan.status == "changed"]
    if changed and not rerun_changed:
        first = changed[0]
        more = f" (and {len(changed) - 1} more run(s))" if len(changed) > 1 else ""
        kind = "finished" if (first.folder / "result.json").is_file() else "interrupted"
        raise ConfigError(f"the {kind} run {first.folder} was trained with other settings than "
                          f"{config.source or 'the grid'} gives {first.variant!r} now: "
                          f"{', '.join(first.changes)}{more}; its numbers are not this variant's. Pass --rerun-changed "
                          f"to train such runs again (their old files are moved aside, never deleted), or restore the "
                          f"settings they were trained with")
    return plans


def run_ablation(config: AblationConfig, only: Sequence[str] | None = None,
                 rerun_changed: bool = False) -> list[dict[str, Any]]:
    """Check everything (:func:`plan_ablation`), train every unfinished run, then write ``table.md``,
    ``table.json`` and ``table.png`` into ``config.output``; returns the rows."""
    from ..engine.outputs import removed_if_failed
    from ..engine.run_dir import hold_run_folder

    with removed_if_failed(config.output), hold_run_folder(config.output):  # a grid belongs to one process, as each of its runs does
        return _run_grid(config, only, rerun_changed)


def _run_grid(config: AblationConfig, only: Sequence[str] | None, rerun_changed: bool) -> list[dict[str, Any]]:
    from ..progress import progress

    plans = plan_ablation(config, only, rerun_changed)
    results: dict[str, list[dict[str, Any]]] = {plan.variant: [] for plan in plans}
    for plan in progress(plans, desc=f"ablation {config.name}", unit="run"):
        done = plan.folder / "result.json"
        if plan.status == "finished":
            print(f"skip {plan.variant} seed {plan.seed}: finished ({done})")
            results[plan.variant].append(json.loads(done.read_text()))
            continue
        if plan.status == "changed":
            print(f"train {plan.variant} seed {plan.seed} again: its settings changed ({', '.join(plan.changes)})")
        results[plan.variant].append(train_one(config, plan.variant, plan.seed, fresh=plan.status == "changed"))
    rows = summarise(config, results)
    command = f"weightformer ablate {config.source} --seeds {' '.join(map(str, config.seeds))}"
    command += f" --only {' '.join(only)}" if only else ""
    header = (f"# ablation {config.name}\n\ncommand: `{command}`\n\n"
              f"recipe: `{json.dumps(config.recipe)}`, seeds {config.seeds}\n\n")
    table = json_text({"name": config.name, "recipe": config.recipe, "seeds": config.seeds, "rows": rows}, indent=2)
    _move_aside_a_different_table(config.output, table + "\n")
    write_atomic(config.output / "table.md", header + format_table(rows) + "\n")
    write_atomic(config.output / "table.json", table + "\n")
    plot_table(rows, config.output / "table.png", config.name)
    return rows


TABLE_FILES = ("table.md", "table.json", "table.png")


def _move_aside_a_different_table(folder: Path, table_json: str) -> None:
    """A table of other rows (another --only or --seeds, or runs trained since) moves to
    ``<name>.previous-<time>`` with its markdown and plot, never overwritten; the same table is rewritten."""
    from ..engine.outputs import move_aside

    old = folder / "table.json"
    if not old.exists() or old.read_text() == table_json:
        return
    for name in TABLE_FILES:
        if (folder / name).exists():
            print(f"an earlier table of other rows: {name} moved to {move_aside(folder / name).name}")


def main(argv: Sequence[str] | None = None) -> int:
    """``weightformer ablate CONFIG.yaml [--only V ...] [--output DIR]``."""
    from ..engine.cli import SIGNAL_EXIT_CODES, OneLineParser, run_reporting_errors

    parser = OneLineParser(
        prog="weightformer ablate",
        description="Train a grid of model variants over seeds with one recipe (resumable: finished runs are "
                    "skipped) and print a table of mean ± std top-1, params, FLOPs and img/s.")
    parser.add_argument("config", metavar="CONFIG.yaml", help="the grid, e.g. configs/ablations/dynamic_period.yaml")
    parser.add_argument("--only", nargs="+", metavar="VARIANT", help="run and tabulate only these variants")
    parser.add_argument("--output", help="run folder of the grid (default: the config's output)")
    parser.add_argument("--seeds", nargs="+", type=int, metavar="SEED", help="these seeds instead of the config's")
    parser.add_argument("--rerun-changed", action="store_true",
                        help="train again the runs whose recorded settings differ from what the config gives now "
                             "(default: refuse them; their old files are moved aside, never deleted)")
    args = parser.parse_args(list(argv) if argv is not None else None)

    def command() -> int:
        config = load_ablation(args.config)
        if args.output:
            config.output = Path(args.output)
        if args.seeds:
            if any(seed < 0 for seed in args.seeds):
                raise ConfigError(f"--seeds must be non-negative integers, got {args.seeds}")
            config.seeds = list(args.seeds)
        try:
            rows = run_ablation(config, only=args.only, rerun_changed=args.rerun_changed)
        except GridStopped as stop:
            print(f"stopped by {stop.signal_name}; run the same command again to resume the grid", file=sys.stderr)
            return SIGNAL_EXIT_CODES.get(stop.signal_name, 130)
        print(format_table(rows))
        print(f"table: {config.output / 'table.md'}, plot: {config.output / 'table.png'}")
        return 0

    return run_reporting_errors(command)
