"""``weightformer ablate CONFIG.yaml``: train a grid of variants × seeds with one recipe, then tabulate.

The config file (see configs/ablations/) is a mapping::

    name: dynamic_period            # names the table
    output: runs/ablations/period   # run folders: <output>/<variant>/seed<seed>/
    seeds: [0, 1]
    recipe: {data: mnist, epochs: 3}                        # TrainConfig settings every run shares
    variants:                                               # name -> settings over the recipe
      period_3: {model_kwargs: {dynamic_period: 3}}
      deit: {model: deit_tiny_patch16_224, model_kwargs: {patch_size: 4, embed_dim: 96, depth: 4, num_heads: 4}}

Each run goes through :func:`weightformer.engine.train` in its own folder. A finished run leaves
``result.json`` there and is skipped next time; an interrupted one resumes from its ``last.pt``.
The table gives, per variant, the mean ± std over seeds of the last epoch's top-1 (and the best
epoch's), the parameters, FLOPs per image (:func:`weightformer.bench.flops.count_flops`) and
inference img/s at the training resolution, and is written as Markdown, JSON and a PNG plot.
"""

from __future__ import annotations

import argparse
import json
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
from ..engine.config import config_fields, load_yaml, resolve_config
from ..engine.errors import ConfigError

__all__ = ["AblationConfig", "load_ablation", "main", "measure_cost", "run_ablation", "summarise"]

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


def _check_settings(values: Any, where: str) -> dict[str, Any]:
    if not isinstance(values, dict):
        raise ConfigError(f"{where} must be a mapping of training settings, got {values!r}")
    for key in values:
        if key not in config_fields(ClassificationConfig) or key in ("output", "seed", "resume", "overwrite"):
            raise ConfigError(f"{where}: {key!r} is not a setting a variant may set; use classification settings "
                              f"other than output, seed, resume and overwrite (the runner sets those)")
    return values


def load_ablation(path: str | os.PathLike) -> AblationConfig:
    """Read and check an ablation YAML file (ConfigError on anything wrong, naming the key)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"ablation config {path} does not exist; pass a YAML file such as configs/ablations/dynamic_period.yaml")
    try:
        raw = load_yaml(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"ablation config {path} is not valid YAML ({str(exc).splitlines()[0]})") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"ablation config {path} must be a mapping with keys {', '.join(_KEYS)}")
    unknown = sorted(set(raw) - set(_KEYS))
    if unknown:
        raise ConfigError(f"ablation config {path}: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(_KEYS)}")
    variants = raw.get("variants")
    if not isinstance(variants, dict) or not variants:
        raise ConfigError(f"ablation config {path}: 'variants' must map variant names to settings, e.g. "
                          f"{{period_3: {{model_kwargs: {{dynamic_period: 3}}}}}}")
    seeds = raw.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and s >= 0 for s in seeds):
        raise ConfigError(f"ablation config {path}: 'seeds' must be a list of non-negative integers, got {seeds!r}")
    for name in variants:
        if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
            raise ConfigError(f"ablation config {path}: variant name {name!r} must be a plain folder name")
    return AblationConfig(
        name=str(raw.get("name") or path.stem),
        output=Path(raw.get("output") or f"runs/ablations/{path.stem}"),
        seeds=seeds,
        recipe=_check_settings(raw.get("recipe", {}), "recipe"),
        variants={name: _check_settings(v or {}, f"variant {name!r}") for name, v in variants.items()},
        throughput_batch=int(raw.get("throughput_batch", 64)),
        source=str(path),
    )


def run_settings(config: AblationConfig, variant: str, seed: int) -> dict[str, Any]:
    """The TrainConfig overrides of one run: recipe, then the variant (model_kwargs merged key by key)."""
    settings = {**config.recipe, **config.variants[variant]}
    settings["model_kwargs"] = {**config.recipe.get("model_kwargs", {}), **config.variants[variant].get("model_kwargs", {})}
    folder = config.output / variant / f"seed{seed}"
    return {**settings, "seed": seed, "output": str(folder), "resume": "auto"}


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _last_and_best(metrics_path: Path) -> tuple[float, float, int]:
    """(last epoch's top-1, best top-1, epochs evaluated) from a run's metrics.jsonl."""
    records = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    top1 = [r["val_top1"] for r in records]
    return top1[-1], max(top1), len(top1)


class GridStopped(Exception):
    """A signal stopped a run of the grid (its last.pt is saved): the grid stops too, with the signal's exit code."""

    def __init__(self, signal_name: str):
        super().__init__(signal_name)
        self.signal_name = signal_name


def train_one(config: AblationConfig, variant: str, seed: int) -> dict[str, Any]:
    """Train (or resume) one run and record its result.json; returns the result."""
    from ..engine import train

    settings = run_settings(config, variant, seed)
    folder = Path(settings["output"])
    start = time.perf_counter()
    result = train(settings, task="classification")
    if result.stopped_by is not None:
        raise GridStopped(result.stopped_by)  # the run saved last.pt; the next `weightformer ablate` resumes it
    last, best, epochs = _last_and_best(folder / "metrics.jsonl")
    record = {"variant": variant, "seed": seed, "top1_last": last, "top1_best": best, "epochs": epochs,
              "train_seconds": round(time.perf_counter() - start, 1), "settings": settings}
    _write_atomic(folder / "result.json", json.dumps(record, indent=2) + "\n")
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
    return {"params": sum(p.numel() for p in model.parameters()), "flops": flops,
            "img_per_s": batch / median(times)}


def _variant_cost(config: AblationConfig, variant: str) -> dict[str, float]:
    """The cost of a variant, measured from its first run's model and cached in cost.json (measured
    again if the cached one was for another model)."""
    from ..engine import read_checkpoint

    path = config.output / variant / "cost.json"
    meta = read_checkpoint(config.output / variant / f"seed{config.seeds[0]}" / "last.pt")["meta"]
    model = {k: meta[k] for k in ("model", "model_kwargs", "num_classes", "in_chans", "img_size")}
    if path.is_file():
        cached = json.loads(path.read_text())
        if cached.get("for") == model:
            return {k: cached[k] for k in ("params", "flops", "img_per_s")}
    cost = measure_cost(meta["model"], meta["model_kwargs"], meta["num_classes"], meta["in_chans"], meta["img_size"],
                        batch=config.throughput_batch)
    _write_atomic(path, json.dumps({**cost, "for": model}, indent=2) + "\n")
    return cost


def _mean_std(values: list[float]) -> tuple[float, float | None]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def summarise(config: AblationConfig, results: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per variant: mean ± std top-1 (last and best epoch) over seeds, and the variant's cost."""
    rows = []
    for variant, runs in results.items():
        last_mean, last_std = _mean_std([r["top1_last"] for r in runs])
        best_mean, best_std = _mean_std([r["top1_best"] for r in runs])
        rows.append({"variant": variant, "seeds": [r["seed"] for r in runs], "top1_last_mean": last_mean,
                     "top1_last_std": last_std, "top1_best_mean": best_mean, "top1_best_std": best_std,
                     **_variant_cost(config, variant), "settings": config.variants[variant]})
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of :func:`summarise`'s rows."""
    def pm(mean: float, std: float | None) -> str:
        return f"{mean:.2f} ± {std:.2f}" if std is not None else f"{mean:.2f}"

    lines = ["| variant | top-1 last (%) | top-1 best (%) | seeds | params | MFLOPs | img/s |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['variant']} | {pm(r['top1_last_mean'], r['top1_last_std'])} | "
                     f"{pm(r['top1_best_mean'], r['top1_best_std'])} | {len(r['seeds'])} | {r['params'] / 1e6:.3f}M | "
                     f"{r['flops'] / 1e6:.1f} | {r['img_per_s']:.0f} |")
    return "\n".join(lines)


def plot_table(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Top-1 (mean ± std over seeds) per variant as a bar chart, with MFLOPs under each name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(rows)), 3.2))
    names = [f"{r['variant']}\n{r['flops'] / 1e6:.0f} MFLOPs" for r in rows]
    ax.bar(names, [r["top1_last_mean"] for r in rows], yerr=[r["top1_last_std"] or 0 for r in rows], capsize=3)
    low = min(r["top1_last_mean"] for r in rows)
    ax.set_ylim(max(0.0, low - 10), 100)
    ax.set_ylabel("top-1 (%), last epoch")
    ax.set_title(title)
    ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


def run_ablation(config: AblationConfig, only: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Train every unfinished run of the grid (skipping those with result.json), then summarise all of it.

    Writes ``table.md``, ``table.json`` and ``table.png`` into ``config.output`` and returns the rows.
    """
    from tqdm import tqdm

    variants = list(only or config.variants)
    missing = [v for v in variants if v not in config.variants]
    if missing:
        raise ConfigError(f"--only {', '.join(missing)}: not a variant of {config.source}; choose from "
                          f"{', '.join(config.variants)}")
    for variant in variants:  # every setting checked before the first run, not when its turn comes
        resolve_config(ClassificationConfig, None, (run_settings(config, variant, config.seeds[0]),))
    runs = [(v, s) for v in variants for s in config.seeds]
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for variant, seed in tqdm(runs, desc=f"ablation {config.name}", unit="run"):
        done = config.output / variant / f"seed{seed}" / "result.json"
        if done.is_file():
            tqdm.write(f"skip {variant} seed {seed}: finished ({done})")
            results[variant].append(json.loads(done.read_text()))
            continue
        results[variant].append(train_one(config, variant, seed))
    rows = summarise(config, results)
    table = format_table(rows)
    command = f"weightformer ablate {config.source} --seeds {' '.join(map(str, config.seeds))}"
    command += f" --only {' '.join(only)}" if only else ""
    header = (f"# ablation {config.name}\n\ncommand: `{command}`\n\n"
              f"recipe: `{json.dumps(config.recipe)}`, seeds {config.seeds}\n\n")
    _write_atomic(config.output / "table.md", header + table + "\n")
    _write_atomic(config.output / "table.json", json.dumps(
        {"name": config.name, "recipe": config.recipe, "seeds": config.seeds, "rows": rows}, indent=2) + "\n")
    plot_table(rows, config.output / "table.png", config.name)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """``weightformer ablate CONFIG.yaml [--only V ...] [--output DIR]``."""
    from ..engine.cli import SIGNAL_EXIT_CODES, run_reporting_errors

    parser = argparse.ArgumentParser(
        prog="weightformer ablate",
        description="Train a grid of model variants over seeds with one recipe (resumable: finished runs are "
                    "skipped) and print a table of mean ± std top-1, params, FLOPs and img/s.")
    parser.add_argument("config", metavar="CONFIG.yaml", help="the grid, e.g. configs/ablations/dynamic_period.yaml")
    parser.add_argument("--only", nargs="+", metavar="VARIANT", help="run and tabulate only these variants")
    parser.add_argument("--output", help="run folder of the grid (default: the config's output)")
    parser.add_argument("--seeds", nargs="+", type=int, metavar="SEED", help="these seeds instead of the config's")
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
            rows = run_ablation(config, only=args.only)
        except GridStopped as stop:
            print(f"stopped by {stop.signal_name}; run the same command again to resume the grid", file=sys.stderr)
            return SIGNAL_EXIT_CODES.get(stop.signal_name, 130)
        print(format_table(rows))
        print(f"table: {config.output / 'table.md'}, plot: {config.output / 'table.png'}")
        return 0

    return run_reporting_errors(command)
