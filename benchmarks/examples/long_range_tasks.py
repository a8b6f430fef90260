"""The long-range design in every task: detection's, segmentation's and generation's offline jobs with the
released backbone, the long-range design, its predictor at the released placement and the attention
baseline, at one budget and several seeds; then a table of scores and costs.

    python benchmarks/examples/long_range_tasks.py                    # every run not done yet, then the tables
    python benchmarks/examples/long_range_tasks.py --tasks seg --seeds 0 1 2 --jobs 2
    python benchmarks/examples/long_range_tasks.py --table-only       # the tables from the runs on disk

Each run is the task's own command line (``weightformer det|seg|gen train`` on its offline data with the
offline recipe, ``--epochs`` set to this benchmark's budget), printed as it starts and kept in the
table's JSON, with OMP_NUM_THREADS=1, into ``--runs``/<task>/<variant>/seed<N>/. A run whose folder holds
a finished ``last.pt`` is not run again. Variants:

- ``released``: the recipe's model (``weightformer_tiny`` / ``wf_dit_s_4`` at the recipe's size);
- ``long_range``: the same command with ``--long-range`` (every block dynamic, the long-range predictor);
- ``released_placement``: ``--model-kwargs linear_predictor=P`` with P the long-range design's predictor
  (``LONG_RANGE_ARGS``): the predictor at the released placement (blocks 1, 4, 7, ... dynamic), so
  placement and predictor can be told apart;
- ``long_range_centered``: ``--long-range --model-kwargs linear_predictor=centered``: every block dynamic
  with the ``centered`` predictor (docs/analysis.md §5, resolution transfer);
- ``long_range_local_dwc``: ``--long-range --model-kwargs dwc_dynamic_period=3``: the long-range design with
  the release's dynamic depthwise conv only in the released blocks (docs/analysis.md §6);
- ``long_range_gated``: that, with ``linear_predictor=double_centered_gated`` (the gain on a log scale, §6);
- ``long_range_late``: that, with ΔW only in the later half of the blocks (``dynamic_linear_start`` = depth // 2);
- ``long_range_static_led``: ``--long-range --model-kwargs linear_predictor=double_centered_gated
  dwc_predictor=offset_corr dwc_static_led=True``: every block's ΔW and conv dynamic, the conv led by a static
  kernel drawn as the static blocks' (docs/analysis.md §6);
- ``long_range_led``: that with ``linear_predictor=double_centered_gated_led``: ΔW's gain started at a tenth as
  well, so every block starts close to a static one (docs/analysis.md §6);
- ``long_range_led_background``: that with ``dwc_padding=background``: every depthwise conv padded with the
  canvas's per-channel median in place of zeros (docs/analysis.md §6);
- ``attention``: DeiT (det, seg) or DiT (gen) at the same width and depth, heads of 32 channels (``--head-channels``), the
  recipe's other model settings; both drawn with timm's ViT init (DiT's blocks with ``block_init=vit``).

Scores are the last epoch's (the budget is the same for all): bbox/segm mAP, mIoU; for generation the
samples of ``weightformer gen sample`` (``--samples-per-class``, 20 by default; DDIM 50 steps, cfg 4, seed 0) scored by
``weightformer gen eval`` (the judge's class accuracy and judge_fd). Costs, measured here after the runs
on each variant's first model, one thread: parameters, GMACs per image (the backbone's for
det and seg, whose heads are the same for all variants; the whole denoiser for gen; attention's matmuls
counted) and inference images per second (batches of 8, median of 7 timed calls after 2 warm-ups, with
attention fused where timm fuses it).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "long_range"
VARIANTS = ("released", "long_range", "released_placement", "long_range_centered", "long_range_local_dwc",
            "long_range_gated", "long_range_late", "long_range_static_led", "long_range_led",
            "long_range_led_background", "attention")
# The budget: the offline jobs' schedules at half length (det 16 -> 8 epochs, seg 50 -> 25, gen 13 -> 6),
# so that 4 variants x 2 seeds x 3 tasks fit an afternoon on 2 CPU cores.
EPOCHS = {"det": 8, "seg": 25, "gen": 6}
HEAD_CHANNELS = 32  # the attention baselines' channels per head (--head-channels)
BATCH = 8  # images per timed inference call


TASKS = {"det": "detection", "seg": "segmentation", "gen": "generation"}


def _recipe_kwargs(task: str) -> dict[str, Any]:
    """The offline recipe's model, model_kwargs and img_size, as ``weightformer TASK train`` resolves them."""
    from weightformer.engine.cli import build_parser, train_overrides
    from weightformer.engine.loop import prepare_config
    from weightformer.engine.registry import get_task

    owner = get_task(TASKS[task])
    cfg = prepare_config(train_overrides(build_parser(owner).parse_args(["train"]), owner), task=owner).cfg
    return {"model": cfg.model, "model_kwargs": dict(cfg.model_kwargs), "img_size": cfg.img_size, "epochs": cfg.epochs}


def _kwargs_flags(kwargs: dict[str, Any]) -> list[str]:
    return ["--model-kwargs", *(f"{k}={v}" for k, v in kwargs.items())]


def variant_flags(task: str, variant: str) -> list[str]:
    """What the variant adds to the task's offline command line."""
    if variant == "released":
        return []
    if variant == "long_range":
        return ["--long-range"]
    if variant == "long_range_centered":
        return ["--long-range", "--model-kwargs", "linear_predictor=centered"]
    if variant == "long_range_local_dwc":
        return ["--long-range", "--model-kwargs", "dwc_dynamic_period=3"]
    if variant == "long_range_gated":
        return ["--long-range", "--model-kwargs", "linear_predictor=double_centered_gated", "dwc_dynamic_period=3"]
    if variant == "long_range_late":
        depth = _recipe_kwargs(task)["model_kwargs"]["depth"]
        return ["--long-range", "--model-kwargs", "linear_predictor=double_centered_gated", "dwc_dynamic_period=3",
                f"dynamic_linear_start={depth // 2}"]
    if variant in ("long_range_static_led", "long_range_led", "long_range_led_background"):
        predictor = "double_centered_gated" if variant == "long_range_static_led" else "double_centered_gated_led"
        padding = ["dwc_padding=background"] if variant == "long_range_led_background" else []
        return ["--long-range", "--model-kwargs", f"linear_predictor={predictor}", "dwc_predictor=offset_corr",
                "dwc_static_led=True", *padding]
    if variant == "released_placement":
        from weightformer.models.weightformer_long_range import LONG_RANGE_ARGS
        return ["--model-kwargs", f"linear_predictor={LONG_RANGE_ARGS['linear_predictor']}"]
    recipe = _recipe_kwargs(task)
    kwargs = recipe["model_kwargs"]
    if task == "gen":
        heads = kwargs["hidden_size"] // HEAD_CHANNELS
        # timm's ViT init of the blocks: DiT's Xavier draw sets its score at this length (gen_candidates.md)
        return ["--model", recipe["model"].replace("wf_dit", "dit"),
                *_kwargs_flags({**kwargs, "num_heads": heads, "block_init": "vit"})]
    heads = kwargs["embed_dim"] // HEAD_CHANNELS
    return ["--model", "deit_tiny_patch16_224",
            *_kwargs_flags({**kwargs, "num_heads": heads, "img_size": recipe["img_size"]})]


def train_command(task: str, variant: str, seed: int, output: Path) -> list[str]:
    budget = [] if FULL_LENGTH else ["--epochs", str(EPOCHS[task])]
    return ["weightformer", task, "train", *budget, "--seed", str(seed),
            "--output", str(output), *variant_flags(task, variant), *SMOKE_FLAGS, *EXTRA_FLAGS]


SMOKE_FLAGS: list[str] = []  # --smoke: a few steps of each run, to check the commands
EXTRA_FLAGS: list[str] = []  # --train-flags: added to every training command (a recipe candidate)
SAMPLES_PER_CLASS = 20  # --samples-per-class: generation's samples scored per class
FULL_LENGTH = False  # --full: the recipe's own schedule instead of EPOCHS' half length


def sample_commands(run: Path) -> list[list[str]]:
    samples = run / "samples"
    return [["weightformer", "gen", "sample", "--checkpoint", str(run / "last.pt"), "--out", str(samples),
             "--num-per-class", str(SAMPLES_PER_CLASS), "--sampler", "ddim", "--steps", "50", "--cfg-scale", "4.0", "--seed", "0",
             "--overwrite"],
            ["weightformer", "gen", "eval", str(samples), "--checkpoint", str(run / "last.pt"),
             "--json", str(run / "eval.json"), "--overwrite"]]


def _run(command: list[str], log: Path) -> None:
    """``command`` (a ``weightformer`` command line) on one thread, with this checkout's package first on
    the path: a copy of the repository (``git worktree add``) benchmarks its own code."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    print("$", shlex.join(command), flush=True)
    with log.open("a") as out:
        out.write("$ " + shlex.join(command) + "\n")
        out.flush()
        done = subprocess.run([sys.executable, "-m", *command], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    if done.returncode:
        raise RuntimeError(f"{shlex.join(command)} failed ({done.returncode}); see {log}")


def _finished(task: str, run: Path) -> bool:
    if not (run / "metrics.jsonl").is_file():
        return False
    lines = (run / "metrics.jsonl").read_text().splitlines()
    done = bool(lines) and json.loads(lines[-1]).get("epoch") == EPOCHS[task]
    return done and (task != "gen" or (run / "eval.json").is_file())


def run_commands(task: str, variant: str, seed: int, runs: Path) -> list[list[str]]:
    """The run's command lines: training, then (gen) sampling and scoring."""
    run = runs / task / variant / f"seed{seed}"
    return [train_command(task, variant, seed, run)] + (sample_commands(run) if task == "gen" else [])


def run_one(task: str, variant: str, seed: int, runs: Path) -> dict[str, Any]:
    run = runs / task / variant / f"seed{seed}"
    commands = run_commands(task, variant, seed, runs)
    if not _finished(task, run):
        run.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        log = run.parent / f"seed{seed}.log"
        _run([*commands[0], "--overwrite"] if (run / "metrics.jsonl").exists() else commands[0], log)
        for command in commands[1:]:
            _run(command, log)
        (run / "wall_s.txt").write_text(f"{time.perf_counter() - start:.0f}\n")
    return {"task": task, "variant": variant, "seed": seed, "commands": [shlex.join(c) for c in commands],
            **scores(task, run)}


def scores(task: str, run: Path) -> dict[str, Any]:
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    wall = (run / "wall_s.txt").read_text().strip() if (run / "wall_s.txt").is_file() else None
    out: dict[str, Any] = {"wall_s": float(wall) if wall else None, "train_img_per_s": last.get("img_per_s")}
    if task == "det":
        out.update(bbox_mAP=last["val_bbox_mAP"], segm_mAP=last["val_segm_mAP"])
    elif task == "seg":
        out.update(mIoU=last["val_mIoU"], mAcc=last["val_mAcc"])
    else:
        judged = json.loads((run / "eval.json").read_text())
        judged = judged.get("metrics", judged)
        out.update(class_accuracy=judged["class_accuracy"] * 100, judge_fd=judged["judge_fd"],
                   val_mse=last.get("val_mse_ema", last.get("val_mse")))
    return out


def cost(task: str, run: Path) -> dict[str, Any]:
    """Parameters, GMACs per image (attention counted) and inference images/s (batches of BATCH, median of
    7 timed calls after 2 warm-ups, attention as it runs) of the run's model (speed does not depend on its weights)."""
    import torch

    from weightformer.bench.flops import count_flops
    from weightformer.bench.timing import median, side_by_side
    from weightformer.engine.weights import load_model

    torch.set_num_threads(1)
    loaded = load_model(run / "last.pt")
    model, meta = loaded.model, loaded.meta
    size = int(meta.get("img_size") or _recipe_kwargs(task)["img_size"])
    if task == "gen":
        x, t, y = torch.randn(BATCH, model.in_channels, size, size), torch.full((BATCH,), 500), torch.zeros(BATCH, dtype=torch.long)
        call, counted = (lambda: model(x, t, y)), count_flops(model, x[:1], t[:1], y[:1])
    else:
        images = torch.randn(BATCH, 3, size, size)
        trunk = model.backbone.backbone if task == "det" else model.pyramid.backbone  # the timm model
        call = (lambda: model(list(images))) if task == "det" else (lambda: model(images))
        counted = count_flops(trunk.forward_features, images[:1], modules=model)
    with torch.inference_mode():
        for _ in range(2):
            call()
        seconds = median(side_by_side({"model": call}, 7)["model"])
    return {"params_M": sum(p.numel() for p in model.parameters()) / 1e6, "gmacs": counted.macs / 1e9,
            "img_per_s": BATCH / seconds, "model": meta["model"], "model_kwargs": meta.get("model_kwargs", {})}


def _mean_std(values: list[float], digits: int = 2) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


COLUMNS = {"det": [("bbox_mAP", "bbox mAP"), ("segm_mAP", "segm mAP")], "seg": [("mIoU", "mIoU"), ("mAcc", "mAcc")],
           "gen": [("class_accuracy", "class-correct %"), ("judge_fd", "judge_fd (not FID)"), ("val_mse", "val ε-MSE")]}


def legend() -> str:
    return ("`released` the recipe's model; `long_range` the same command with `--long-range` (the long-range "
            "predictor in every block); `released_placement` `--model-kwargs linear_predictor=...` (that "
            "predictor at the released placement, one dynamic block in three); `long_range_centered` `--long-range` "
            "with the `centered` predictor; `long_range_local_dwc` `--long-range --model-kwargs dwc_dynamic_period=3` "
            "(the dynamic depthwise conv only in the released blocks); `long_range_gated` that with "
            "`linear_predictor=double_centered_gated`; `long_range_late` that with ΔW only in the later half of the "
            "blocks (`dynamic_linear_start` = depth // 2); `long_range_static_led` `--long-range` with "
            "`linear_predictor=double_centered_gated dwc_predictor=offset_corr dwc_static_led=True`; `long_range_led` "
            "that with `linear_predictor=double_centered_gated_led`; `long_range_led_background` that with "
            "`dwc_padding=background`; `attention` DeiT "
            "or DiT of the "
            f"same width and depth, {HEAD_CHANNELS} channels per head, blocks drawn with timm's ViT init "
            "(`block_init=vit` for DiT). Scores are the last epoch's; seeds column: the "
            "first score per seed. Costs of the first seed's model, one thread, after the runs.")


COST_NAME = {"det": "backbone GMACs", "seg": "backbone GMACs", "gen": "GMACs"}


def markdown(task: str, rows: list[dict[str, Any]], costs: dict[str, dict[str, Any]]) -> str:
    head = [c[1] for c in COLUMNS[task]]
    lines = [f"| variant | model | {' | '.join(head)} | seeds | params | {COST_NAME[task]} | img/s (infer) |",
             "|---" * (len(head) + 6) + "|"]
    for variant in VARIANTS:
        mine = [r for r in rows if r["variant"] == variant]
        if not mine:
            continue
        c = costs[variant]
        cells = [_mean_std([r[key] for r in mine], 4 if key == "val_mse" else 2) for key, _ in COLUMNS[task]]
        per_seed = "/".join(f"{r[COLUMNS[task][0][0]]:.1f}" for r in mine)
        predictor = c.get("model_kwargs", {}).get("linear_predictor")
        model = f"`{c['model']}`" + (f" (`{predictor}`)" if predictor else "")
        lines.append(f"| {variant} | {model} | {' | '.join(cells)} | {len(mine)} ({per_seed}) | "
                     f"{c['params_M']:.2f}M | {c['gmacs']:.3f} | {c['img_per_s']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    global FULL_LENGTH, SAMPLES_PER_CLASS, HEAD_CHANNELS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=list(EPOCHS), choices=list(EPOCHS))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (each on one thread)")
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "long_range")
    parser.add_argument("--table-only", action="store_true", help="no runs: the tables from what is on disk")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--smoke", action="store_true", help="one epoch of 2 steps per run (checks the commands)")
    parser.add_argument("--full", action="store_true", help="the recipes' own length (the offline jobs as shipped)")
    parser.add_argument("--epochs", type=int, help="this many epochs for every task given (instead of the budget)")
    parser.add_argument("--samples-per-class", type=int, default=20, help="generation: samples scored per class")
    parser.add_argument("--train-flags", default="", help="flags added to every training command, e.g. '--lr 0.08'")
    parser.add_argument("--head-channels", type=int, default=HEAD_CHANNELS,
                        help="the attention variant's channels per head (DiT's and DeiT's own: 64)")
    args = parser.parse_args(argv)
    HEAD_CHANNELS = args.head_channels
    SAMPLES_PER_CLASS = args.samples_per_class
    EXTRA_FLAGS[:] = shlex.split(args.train_flags)
    if args.full:
        FULL_LENGTH = True
        EPOCHS.update({t: _recipe_kwargs(t)["epochs"] for t in args.tasks})
    elif args.epochs:
        EPOCHS.update(dict.fromkeys(args.tasks, args.epochs))
    if args.smoke:
        EPOCHS.update(dict.fromkeys(EPOCHS, 1))
        SMOKE_FLAGS[:] = ["--max-steps", "2"]
    todo = [(t, v, s) for t in args.tasks for v in args.variants for s in args.seeds]
    if args.table_only:
        todo = [(t, v, s) for t, v, s in todo if _finished(t, args.runs / t / v / f"seed{s}")]
        rows = [{"task": t, "variant": v, "seed": s, "commands": [shlex.join(c) for c in run_commands(t, v, s, args.runs)],
                 **scores(t, args.runs / t / v / f"seed{s}")} for t, v, s in todo]
    else:
        with ThreadPoolExecutor(args.jobs) as pool:
            rows = list(pool.map(lambda job: run_one(*job, args.runs), todo))
    args.out.mkdir(parents=True, exist_ok=True)
    for task in args.tasks:
        mine = [r for r in rows if r["task"] == task]
        if not mine:
            continue
        costs = {v: cost(task, args.runs / task / v / f"seed{min(r['seed'] for r in mine if r['variant'] == v)}")
                 for v in {r["variant"] for r in mine}}
        from weightformer.bench.results import machine_info

        command = "python benchmarks/examples/long_range_tasks.py " + shlex.join(argv if argv is not None else sys.argv[1:])
        record = {"task": task, "epochs": EPOCHS[task], "machine": {**machine_info(command=command), "threads_per_run": 1},
                  "command": command, "runs": mine, "costs": costs}
        (args.out / f"{task}.json").write_text(json.dumps(record, indent=1) + "\n")
        table = markdown(task, mine, costs)
        (args.out / f"{task}.md").write_text(
            f"# {task}: the offline job at {EPOCHS[task]} epochs{' (its full length)' if FULL_LENGTH else ''}, per variant (mean ± sd over seeds)\n\n{table}\n\n"
            f"Variants: {legend()}\n\n"
            f"Machine: {record['machine']['cpu']}, {record['machine']['cpu_count']} cores, torch "
            f"{record['machine']['torch']}, one thread per run. Command: `{record['command']}`; each run's "
            f"command line is in {task}.json.\n")
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
