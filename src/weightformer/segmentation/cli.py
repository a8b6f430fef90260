"""``weightformer seg train|eval|predict``: semantic segmentation from the command line.

``train`` runs :class:`SegmentationTask` in the shared loop (every run flag of ``weightformer train``
plus the segmentation ones); with no ``--data`` it trains on the built-in ``shapes`` set with its
small-CPU defaults. ``eval`` scores a checkpoint on a validation split; ``predict`` writes class
maps and overlays for image files. Exit codes are those of :mod:`weightformer.cli`.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

__all__ = ["build_parser", "main"]


def _device(name: str) -> Any:
    """The torch.device for --device (torch is imported with the work, not for --help)."""
    import torch

    from ..engine.errors import ConfigError

    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA GPU is available here; pass --device cpu or auto")
    return torch.device("cuda" if name != "cpu" and torch.cuda.is_available() else "cpu")


def _add_inference_arguments(p: argparse.ArgumentParser, train: bool) -> None:
    """--inference/--crop/--stride: settings of the run for train, else overrides of the checkpoint's."""
    default = argparse.SUPPRESS if train else None  # train: only flags given override the config layers
    shown = ("(default: whole)", "(default: 64 on shapes, else 512)", "(default: 43 on shapes, else 341)") if train \
        else ("(default: as the checkpoint was trained)",) * 3
    p.add_argument("--inference", dest="seg_inference", choices=["whole", "slide"], default=default,
                   help=f"evaluate whole images, or overlapping crops {shown[0]}")
    p.add_argument("--crop", dest="seg_crop", type=int, metavar="PX", default=default,
                   help=f"sliding-window crop in pixels {shown[1]}")
    p.add_argument("--stride", dest="seg_stride", type=int, metavar="PX", default=default,
                   help=f"sliding-window stride in pixels {shown[2]}")


def _add_checkpoint_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="a last.pt or best.pt of weightformer seg train")
    p.add_argument("--ema", action="store_true", help="use the checkpoint's EMA weights")
    _add_inference_arguments(p, train=False)
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                   help="auto: cuda if available (default: auto)")


def build_parser() -> argparse.ArgumentParser:
    from ..cli import add_train_arguments

    parser = argparse.ArgumentParser(prog="weightformer seg", description="Semantic segmentation: UperNet on a "
                                     "WeightFormer (or any timm) backbone, ADE20K-layout data.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{train,eval,predict}")
    S = argparse.SUPPRESS
    train = sub.add_parser(
        "train", help="train a segmenter (default: the built-in shapes set, a few minutes on a CPU)",
        description="Train an UperNet on ADE20K-layout data (--data PATH with images/{training,validation} and "
                    "annotations/{training,validation}) or on the built-in shapes set (the default, drawn into "
                    "~/.cache/weightformer on first use, with its own small-CPU defaults, printed at the start). "
                    "--img-size is the training crop (default 512 for a folder). Model kwargs go to build_upernet: "
                    "head widths (channels, pyramid_channels, aux_channels) and the backbone's timm arguments.")
    add_train_arguments(train, data_help="ADE20K-layout folder (images/{training,validation}/, "
                                         "annotations/{training,validation}/), or shapes, the offline set (default: shapes)")
    train.add_argument("--num-classes", type=int, default=S,
                       help="classes of the data (default: 4 for shapes, 150 (ADE20K) for a folder)")
    train.add_argument("--no-reduce-zero-label", dest="reduce_zero_label", action="store_false", default=S,
                       help="label 0 is a class (default: 0 is unlabelled and ignored, value v is class v-1)")
    train.add_argument("--layer-decay", type=float, default=S,
                       help="layer-wise learning-rate decay of the backbone, e.g. 0.75 (default: none)")
    _add_inference_arguments(train, train=True)

    evaluate = sub.add_parser("eval", help="mIoU, mAcc, aAcc of a checkpoint on a validation split",
                              description="Score a checkpoint on the validation split of its data (or --data).")
    _add_checkpoint_arguments(evaluate)
    evaluate.add_argument("--data", help="ADE20K-layout folder or shapes (default: the data it was trained on)")
    evaluate.add_argument("--batch-size", type=int, default=8,
                          help="images loaded at a time; each is predicted at its own size (default: 8)")
    evaluate.add_argument("--workers", type=int, default=0, help="data-loading processes (default: 0)")
    evaluate.add_argument("--amp", choices=["none", "bf16", "fp16"], default="none",
                          help="mixed precision (default: none)")
    evaluate.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH (checked first)")

    predict = sub.add_parser("predict", help="class maps and overlays for image files",
                             description="Predict image files (or folders of them): writes <out>/<name>.png, a "
                                         "palette PNG in the data set's annotation encoding, and "
                                         "<out>/<name>_overlay.png.")
    _add_checkpoint_arguments(predict)
    predict.add_argument("images", nargs="+", help="image files or folders of .jpg/.jpeg/.png images")
    predict.add_argument("--out", required=True, help="folder for the predictions (made if needed)")
    predict.add_argument("--alpha", type=float, default=0.5, help="opacity of the class colours in the overlays "
                                                                   "(default: 0.5)")
    return parser


# --------------------------------------------------------------------------------------------------
# train
# --------------------------------------------------------------------------------------------------


def _data_name(overrides: Mapping[str, Any], config_file: Optional[str]) -> str:
    """The run's data: --data, else the --config file's, else (resuming) the run folder's config.yaml, else shapes."""
    import yaml

    from ..engine import load_config_file
    from .synthetic import SHAPES_NAME

    if "data" in overrides:
        return str(overrides["data"])
    from_file = load_config_file(config_file) if config_file else {}
    if "data" in from_file:
        return str(from_file["data"])
    resume = overrides.get("resume")
    folder = Path(str(resume)).parent if resume not in (None, "auto") else None
    if resume == "auto" and "output" in overrides:
        folder = Path(str(overrides["output"]))
    saved = folder / "config.yaml" if folder is not None else None
    if saved is not None and saved.is_file():
        try:
            return str((yaml.safe_load(saved.read_text()) or {}).get("data", SHAPES_NAME))
        except (yaml.YAMLError, AttributeError):  # not a mapping of settings: the checkpoint's own config decides
            return SHAPES_NAME
    return SHAPES_NAME


def _run_train(args: argparse.Namespace) -> int:
    from ..cli import exit_code, train_overrides
    from ..engine import train
    from .synthetic import SHAPES_DEFAULTS, SHAPES_NAME
    from .task import SegmentationTask

    overrides = train_overrides(args)
    config_file = getattr(args, "config_file", None)
    # A folder gets the dataclass's defaults (the paper's recipe), never a classification data set's.
    defaults = SHAPES_DEFAULTS if _data_name(overrides, config_file) == SHAPES_NAME else {}
    result = train(overrides, config_file=config_file, task=SegmentationTask, defaults=defaults)
    return exit_code(result)


# --------------------------------------------------------------------------------------------------
# eval and predict
# --------------------------------------------------------------------------------------------------


def _load(args: argparse.Namespace) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The checkpoint's model (eval mode, on the device), its meta, and the inference settings to use."""
    from ..checkpoint import CheckpointError
    from ..engine.state import load_weights, read_checkpoint
    from ..engine.errors import ConfigError
    from .task import build_segmenter

    ckpt = read_checkpoint(args.checkpoint)
    meta = dict(ckpt.get("meta") or {})
    if meta.get("task") != "segmentation":
        kind = f"a {meta['task']} checkpoint" if meta.get("task") else "not a checkpoint of weightformer seg train"
        raise CheckpointError(f"{args.checkpoint} is {kind}; pass a last.pt or best.pt of weightformer seg train")
    saved = dict(ckpt.get("config") or {})
    inference = {name: getattr(args, name) if getattr(args, name) is not None else saved.get(name, default)
                 for name, default in (("seg_inference", "whole"), ("seg_crop", 512), ("seg_stride", 341))}
    if inference["seg_crop"] < 1 or inference["seg_stride"] < 1:
        raise ConfigError(f"--crop and --stride must be positive pixels, got {inference['seg_crop']} and "
                          f"{inference['seg_stride']}")
    if inference["seg_inference"] == "slide" and inference["seg_stride"] > inference["seg_crop"]:
        raise ConfigError(f"sliding-window stride {inference['seg_stride']} is larger than the crop "
                          f"{inference['seg_crop']}; pass a --stride of at most --crop")
    device = _device(args.device)
    model = build_segmenter(meta)
    load_weights(model, ckpt, use_ema=args.ema, source=args.checkpoint)
    return model.to(device).eval(), meta, inference


def _json_safe(values: Sequence[float]) -> list[Optional[float]]:
    """NaN (a class never labelled nor predicted) as null."""
    return [None if math.isnan(v) else v for v in values]


def _run_eval(args: argparse.Namespace) -> int:
    from torch.utils.data import DataLoader

    from ..cli import print_and_write_results
    from ..engine.errors import ConfigError
    from ..engine.run_dir import check_writable_file
    from .data import SegmentationFolder, collate_segmentation
    from .task import AMP_DTYPES, data_root, eval_transform, evaluate

    json_path = Path(args.json) if args.json else None
    if json_path is not None:
        check_writable_file(json_path, "--json")  # before the work, not after it
    if args.batch_size < 1 or args.workers < 0:
        raise ConfigError(f"--batch-size must be at least 1 and --workers 0 or more, got {args.batch_size} and "
                          f"{args.workers}")
    model, meta, inference = _load(args)
    device = next(model.parameters()).device
    if args.amp == "fp16" and device.type != "cuda":
        raise ConfigError("--amp fp16 needs a GPU; use --amp bf16 (or none) on CPU")
    data = args.data or meta["data"]
    val_set = SegmentationFolder(data_root(data), "validation", reduce_zero_label=meta["reduce_zero_label"],
                                 num_classes=meta["num_classes"], transform=eval_transform(meta["img_size"]))
    loader = DataLoader(val_set, batch_size=args.batch_size, num_workers=min(args.workers, os.cpu_count() or 1),
                        collate_fn=collate_segmentation)
    metrics = evaluate(model, loader, meta["num_classes"], device, inference["seg_inference"], inference["seg_crop"],
                       inference["seg_stride"], AMP_DTYPES[args.amp])
    result = {
        "checkpoint": args.checkpoint, "data": str(data), "images": len(val_set), **inference,
        "mIoU": metrics["mIoU"], "mAcc": metrics["mAcc"], "aAcc": metrics["aAcc"],
        "per_class_iou": _json_safe(metrics["per_class_iou"]), "classes": meta.get("classes"),
    }
    print(f"{args.checkpoint} on {data} ({len(val_set)} images, {inference['seg_inference']} inference): "
          f"mIoU {result['mIoU']:.2f}%, mAcc {result['mAcc']:.2f}%, aAcc {result['aAcc']:.2f}%")
    names = meta.get("classes") or [str(c) for c in range(meta["num_classes"])]
    if len(names) <= 20:
        print("  IoU per class: " + ", ".join(f"{n} {'-' if v is None else f'{v:.1f}'}"
                                              for n, v in zip(names, result["per_class_iou"])))
    return print_and_write_results(result, json_path)


def _run_predict(args: argparse.Namespace) -> int:
    from ..engine.errors import ConfigError
    from ..engine.run_dir import check_writable_folder
    from .predict import image_files, palette, predict_image, read_image, write_prediction
    from .task import eval_transform

    if not 0 <= args.alpha <= 1:
        raise ConfigError(f"--alpha must be in [0, 1], got {args.alpha}")
    out = Path(args.out)
    check_writable_folder(out, "--out")
    files = image_files(args.images)
    model, meta, inference = _load(args)
    device = next(model.parameters()).device
    transform = eval_transform(meta["img_size"])
    colours = palette(meta["num_classes"], meta.get("classes"))
    for path in files:
        image = read_image(path)
        classes = predict_image(model, image, transform, device, inference["seg_inference"], inference["seg_crop"],
                                inference["seg_stride"])
        label_path, overlay_path = write_prediction(path.stem, image, classes, colours, out, meta["reduce_zero_label"],
                                                    args.alpha)
        print(f"{path} -> {label_path}, {overlay_path}")
    print(f"wrote {len(files)} prediction(s) to {out}", flush=True)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``weightformer seg ...``; returns the exit code."""
    from ..cli import run_reporting_errors

    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    run = {"train": _run_train, "eval": _run_eval, "predict": _run_predict}[args.command]
    return run_reporting_errors(lambda: run(args), hint_grad_checkpointing=args.command == "train")
