"""``weightformer det train|eval|predict``: ``eval`` and ``predict`` are thin layers over
:func:`.evaluation.evaluate_checkpoint` and :func:`.predict.predict`."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Mapping

from ..engine.cli import (Command, TaskCLI, add_checkpoint_arguments, add_json_argument, finite_float,
                          json_path_argument, print_and_write_results)
from ..engine.errors import ConfigError

__all__ = ["CLI"]


def _add_eval_arguments(p: argparse.ArgumentParser) -> None:
    add_checkpoint_arguments(p, "weightformer det")
    p.add_argument("--data", help="COCO-layout folder or shapes (default: the data the checkpoint was trained on)")
    p.add_argument("--split", metavar="NAME", help="the split to evaluate: images/NAME/ (or NAME/) and annotations/"
                   "instances_NAME.json (default: the checkpoint's validation split, else val2017 or val)")
    p.add_argument("--batch-size", type=int, default=4, help="images per forward pass (default: 4)")
    p.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1),
                   help="data-loading processes (default: 4, at most the CPU count)")
    p.add_argument("--visualize", type=int, default=0, metavar="N",
                   help="also draw the detections on the first N val images (default: 0)")
    p.add_argument("--out", help="folder for --visualize images (default: visualize/ beside the checkpoint)")
    add_json_argument(p)


def _run_eval(args: argparse.Namespace) -> int:
    from .evaluation import evaluate_checkpoint, format_eval

    json_path = json_path_argument(args)
    result = evaluate_checkpoint(args.checkpoint, data=args.data, split=args.split, batch_size=args.batch_size,
                                 workers=args.workers, device=args.device, use_ema=args.ema,
                                 visualize=args.visualize, out=args.out, overwrite=args.overwrite)
    print(format_eval(result))
    if "visualized" in result:
        print("drew the detections on {images} val image(s) in {folder}".format(**result["visualized"]))
    return print_and_write_results(result, json_path)


def _add_predict_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files, or folders of them (searched recursively)")
    add_checkpoint_arguments(p, "weightformer det")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--score-threshold", type=finite_float, default=0.5,
                   help="keep detections scoring at least this (default: 0.5)")
    p.add_argument("--overwrite", action="store_true",
                   help="move the files of an earlier predict in --out aside (<name>.previous-<time>) and write anew")


def _run_predict(args: argparse.Namespace) -> int:
    from .predict import DETECTIONS_FILE, predict

    records = predict(args.checkpoint, args.images, out=args.out, score_threshold=args.score_threshold,
                      use_ema=args.ema, device=args.device, overwrite=args.overwrite)
    count = sum(len(r["detections"]) for r in records)
    print(f"{count} detection(s) at score >= {args.score_threshold} in {len(records)} image(s); drawn into "
          f"{args.out}, listed in {Path(args.out) / DETECTIONS_FILE}")
    return 0


COMMANDS = (
    Command("eval", "COCO box and mask AP of a checkpoint",
            "Evaluate a detection checkpoint on a validation split: bbox and segm AP (percent).",
            _add_eval_arguments, _run_eval),
    Command("predict", "detect objects in images, draw them and write them as JSON",
            "Run a detection checkpoint on image files: OUT/<index>_<name>.png with boxes and masks drawn, and "
            "OUT/detections.json.", _add_predict_arguments, _run_predict),
)


def _add_train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--visualize", type=int, default=0, metavar="N", help="after training, draw the detections "
                        "on N validation images into OUTPUT/visualize/ (default: 0)")


def _check_train_arguments(args: argparse.Namespace) -> None:
    if args.visualize < 0:
        raise ConfigError(f"--visualize must be 0 or more images, got {args.visualize}")


def _after_training(result: Any, args: argparse.Namespace) -> None:
    """``--visualize N``: the trained model's detections on the first N validation images (by rank 0)."""
    if not args.visualize or int(os.environ.get("RANK", "0")) != 0:
        return
    from ..engine.weights import load_model
    from .evaluation import val_dataset
    from .visualize import save_visualizations

    device = next(result.model.parameters()).device
    loaded = load_model(result.last_checkpoint, task="detection", device=device)
    meta, out = loaded.meta, Path(result.output) / "visualize"
    val = val_dataset(meta["data"], run_split=loaded.checkpoint["config"].get("val_split"))
    paths = save_visualizations(loaded.model, val, out, args.visualize, ["__background__", *meta["classes"]], device)
    print(f"drew the detections on {len(paths)} val image(s) in {out}")


def _summary(metrics: Mapping[str, Any]) -> str:
    bbox, ap50, segm = ("n/a" if metrics[k] is None else f"{metrics[k]:.2f}"
                        for k in ("bbox_mAP", "bbox_mAP_50", "segm_mAP"))
    return f"bbox mAP {bbox} (AP50 {ap50}), mask mAP {segm} ({metrics['images']} images)"


CLI = TaskCLI(
    program="weightformer det",
    description=("Detection and instance segmentation: Mask R-CNN and Cascade Mask R-CNN on a timm backbone, on "
                 "COCO-layout data (COCO 2017 as downloaded) or the offline shapes set."),
    commands=COMMANDS, summary=_summary, score="bbox mAP {:.2f}", train_arguments=_add_train_arguments,
    check_train_arguments=_check_train_arguments, after_training=_after_training,
)
