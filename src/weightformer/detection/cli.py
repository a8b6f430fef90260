"""``weightformer det``: ``train``, ``eval`` and ``predict`` for detection and instance segmentation.

``train`` runs :class:`~weightformer.detection.task.DetectionTask` in the shared loop with every run
flag of ``weightformer train``; without ``--data`` it trains on the offline ``shapes`` set with
small-CPU defaults (:data:`weightformer.detection.synthetic.DEFAULTS`). ``eval`` rebuilds the model
from a checkpoint and prints COCO box and mask AP; ``predict`` draws detections on images and writes
them as JSON. Errors and exit codes are those of :mod:`weightformer.cli`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchvision.transforms.functional import pil_to_tensor

from ..checkpoint import CheckpointError
from ..cli import add_train_arguments, exit_code, print_and_write_results, run_reporting_errors, train_overrides
from ..data.errors import DataError
from ..engine import ConfigError, load_config_file, train
from ..engine.distributed import init_distributed
from ..engine.run_dir import check_writable_file, check_writable_folder
from ..engine.state import load_weights, read_checkpoint
from . import synthetic
from .data import CocoDetection, collate
from .task import DetectionTask, build_detector, data_root, evaluate
from .visualize import draw_detections, save_visualizations

__all__ = ["build_parser", "main"]

METRICS_SHOWN = ("bbox_mAP", "bbox_mAP_50", "bbox_mAP_75", "segm_mAP", "segm_mAP_50")

# ViTDet's COCO recipe (Li et al., 2022), as configs/coco_cascade_maskrcnn_weightformer_t_lsj_100ep.yaml has it
# (see there): lr 1e-4 at batch 64 (per 512: 8e-4), weight decay 0.1, layer decay 0.7 over 12 blocks
# (0.777 over WeightFormer's 17), drop path 0.1, LSJ to 1024², 100 epochs, x0.1 at 88.9% and 96.3%.
COCO_DEFAULTS: dict[str, Any] = dict(
    model="weightformer_tiny", model_kwargs=dict(drop_path_rate=0.1), img_size=1024, epochs=100, batch_size=2,
    lr=8e-4, min_lr=0.0, warmup_lr=8e-7, warmup_epochs=0.136, weight_decay=0.1, layer_decay=0.777, hflip=0.5,
    workers=4, sched="multistep", decay_milestones=[88.9, 96.3], decay_rate=0.1, clip_grad=None,
)


def _add_train_arguments(p: argparse.ArgumentParser) -> None:
    add_train_arguments(p, data_help="COCO-layout folder (images/<split>/, annotations/instances_<split>.json), "
                                     "or shapes, the offline set (default: shapes)")
    S = argparse.SUPPRESS
    p.add_argument("--num-classes", type=int, default=S,
                   help="number of categories (default: those the COCO annotation file declares)")
    p.add_argument("--cascade", action="store_true", default=S,
                   help="Cascade Mask R-CNN (three box stages) instead of Mask R-CNN (default: off)")
    p.add_argument("--layer-decay", type=float, default=S,
                   help="layer-wise learning-rate decay of the backbone (default: 0.777 on COCO data, off on shapes)")
    p.add_argument("--det-resize", choices=["lsj", "shortest_edge"], default=S,
                   help="lsj: large-scale jitter to --img-size² crops (ViTDet, the default); shortest_edge: short side "
                        "--img-size, long side at most --det-max-size, flips only (the 1x schedule)")
    p.add_argument("--det-max-size", type=int, default=S,
                   help="shortest_edge: the long side's limit in pixels (default: 1333)")
    p.add_argument("--visualize", type=int, default=0, metavar="N",
                   help="after training, draw the detections on N validation images into OUTPUT/visualize/ "
                        "(default: 0)")


def _add_model_source(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="a last.pt or best.pt written by weightformer det train")
    p.add_argument("--ema", action="store_true", help="use the checkpoint's EMA weights (default: off)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                   help="auto: cuda if available (default: auto)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="weightformer det", description="Detection and instance segmentation: "
                                     "Mask R-CNN and Cascade Mask R-CNN on a timm backbone, COCO-layout data.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{train,eval,predict}")
    _add_train_arguments(sub.add_parser(
        "train", help="train a detector (default: a tiny WeightFormer on the offline shapes set)",
        description="Train a detector on COCO-layout data (--data PATH with images/{train,val}/ and "
                    "annotations/instances_{train,val}.json). Without --data: the offline 'shapes' set (drawn "
                    "into ~/.cache/weightformer on first use) with small-CPU defaults, printed at the start."))
    ev = sub.add_parser("eval", help="COCO box and mask AP of a checkpoint",
                        description="Evaluate a detection checkpoint on a val split: bbox and segm AP.")
    _add_model_source(ev)
    ev.add_argument("--data", help="COCO-layout folder or shapes (default: the data the checkpoint was trained on)")
    ev.add_argument("--batch-size", type=int, default=4, help="images per forward pass (default: 4)")
    ev.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1),
                    help="data-loading processes (default: 4, at most the CPU count)")
    ev.add_argument("--visualize", type=int, default=0, metavar="N",
                    help="also draw the detections on the first N val images (default: 0)")
    ev.add_argument("--out", help="folder for --visualize images (default: visualize/ beside the checkpoint)")
    ev.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH (checked before the work)")
    pr = sub.add_parser("predict", help="detect objects in images, draw them and write them as JSON",
                        description="Run a detection checkpoint on image files: OUT/<name>.png with boxes and "
                                    "masks drawn, and OUT/detections.json.")
    _add_model_source(pr)
    pr.add_argument("images", nargs="+", metavar="IMAGE", help="image files")
    pr.add_argument("--out", required=True, help="output folder")
    pr.add_argument("--score-threshold", type=float, default=0.5,
                    help="keep detections scoring at least this (default: 0.5)")
    return parser


def _train_defaults(overrides: dict[str, Any], config_file: Optional[str]) -> dict[str, Any]:
    """The layer under --config and flags: the shapes set's small-CPU recipe, or ViTDet's for other data."""
    data = overrides.get("data") or (load_config_file(config_file).get("data") if config_file else None)
    if data in (None, synthetic.NAME):
        return dict(synthetic.DEFAULTS)
    return dict(COCO_DEFAULTS)


def _run_train(args: argparse.Namespace) -> int:
    visualize = args.visualize
    del args.visualize
    if visualize < 0:
        raise ConfigError(f"--visualize must be 0 or more images, got {visualize}")
    overrides = train_overrides(args)
    config_file = getattr(args, "config_file", None)
    result = train(overrides, config_file=config_file, task=DetectionTask,
                   defaults=_train_defaults(overrides, config_file))
    if visualize and result.stopped_by is None:
        _visualize_after_training(result, visualize)
    return exit_code(result)


def _visualize_after_training(result: Any, count: int) -> None:
    meta = torch.load(Path(result.last_checkpoint), map_location="cpu", weights_only=True)["meta"]
    model = result.model
    device = next(model.parameters()).device
    out = Path(result.output) / "visualize"
    paths = save_visualizations(model, CocoDetection(data_root(meta["data"]), "val"), out, count,
                                ["__background__", *meta["classes"]], device)
    print(f"drew the detections on {len(paths)} val image(s) in {out}")


def _load(checkpoint: str, use_ema: bool, device_name: str) -> tuple[Any, dict[str, Any], Any]:
    """(the model in eval mode with the checkpoint's weights, its meta, the device)."""
    ckpt = read_checkpoint(checkpoint)
    meta = ckpt.get("meta") or {}
    if meta.get("task") != "detection":
        raise CheckpointError(f"{checkpoint} is not a detection checkpoint (task {meta.get('task', 'classification')}); "
                              "pass a last.pt or best.pt written by weightformer det train")
    device = init_distributed(device_name).device
    model = build_detector(meta)
    load_weights(model, ckpt, use_ema=use_ema, source=checkpoint)
    return model.to(device).eval(), meta, device


def _run_eval(args: argparse.Namespace) -> int:
    json_path = Path(args.json) if args.json else None
    if json_path is not None:
        check_writable_file(json_path, "--json")  # before the work, not after it
    model, meta, device = _load(args.checkpoint, args.ema, args.device)
    data = args.data or meta["data"]
    dataset = CocoDetection(data_root(data), "val")
    if len(dataset.category_ids) > meta["num_classes"]:
        raise CheckpointError(f"{args.checkpoint} knows {meta['num_classes']} categories and {dataset.annotation_file} "
                              f"declares {len(dataset.category_ids)}; evaluate on the data it was trained on")
    loader = DataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers, collate_fn=collate)
    metrics = evaluate(model, loader, dataset, device)
    result: dict[str, Any] = {"checkpoint": args.checkpoint, "data": data, "images": int(metrics["num_images"])}
    result.update({name: None if metrics[name] != metrics[name] else round(metrics[name], 4) for name in METRICS_SHOWN})
    print(", ".join(f"{name} {'n/a' if result[name] is None else format(result[name], '.2f')}" for name in METRICS_SHOWN)
          + f" ({result['images']} images)")
    if args.visualize:
        out = Path(args.out) if args.out else Path(args.checkpoint).resolve().parent / "visualize"
        paths = save_visualizations(model, dataset, out, args.visualize, ["__background__", *meta["classes"]], device)
        print(f"drew the detections on {len(paths)} val image(s) in {out}")
    return print_and_write_results(result, json_path)


def _read_image(path: Path) -> Any:
    try:
        with Image.open(path) as pil:
            return pil_to_tensor(pil.convert("RGB")).float() / 255  # (3, H, W) in [0, 1]
    except OSError as exc:  # missing or unreadable
        raise DataError(f"cannot read image {path} ({exc.strerror or exc})") from None


def _run_predict(args: argparse.Namespace) -> int:
    out = Path(args.out)
    check_writable_folder(out, "--out")
    images = [(Path(p), _read_image(Path(p))) for p in args.images]  # every file readable before the work
    model, meta, device = _load(args.checkpoint, args.ema, args.device)
    names = ["__background__", *meta["classes"]]
    records = []
    for index, (path, image) in enumerate(images):
        with torch.no_grad():
            prediction = {k: v.cpu() for k, v in model([image.to(device)])[0].items()}
        drawn = out / f"{index:04d}_{path.stem}.png"  # the index keeps same-named images from different folders apart
        draw_detections(image, prediction, names, args.score_threshold).save(drawn)
        keep = prediction["scores"] >= args.score_threshold
        records.append({
            "image": str(path), "drawn": str(drawn), "detections": [
                {"label": names[int(label)], "score": round(float(score), 4),
                 "box_xyxy": [round(float(v), 2) for v in box]}
                for box, label, score in zip(prediction["boxes"][keep], prediction["labels"][keep],
                                             prediction["scores"][keep])
            ],
        })
    (out / "detections.json").write_text(json.dumps(records, indent=2) + "\n")
    count = sum(len(r["detections"]) for r in records)
    print(f"{count} detection(s) at score >= {args.score_threshold} in {len(records)} image(s); drawn into {out}, "
          f"listed in {out / 'detections.json'}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``weightformer det``; returns the exit code."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    command = args.command
    del args.command
    run = {"train": _run_train, "eval": _run_eval, "predict": _run_predict}[command]
    return run_reporting_errors(lambda: run(args), hint_grad_checkpointing=command == "train")
