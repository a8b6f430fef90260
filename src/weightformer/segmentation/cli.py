"""``weightformer seg eval|predict``: thin layers over :func:`.evaluation.evaluate_checkpoint` and ``predict``."""

from __future__ import annotations

import argparse

from ..engine.cli import (Command, TaskCLI, add_checkpoint_arguments, add_json_argument, finite_float,
                          json_path_argument, print_and_write_results)
from ..engine.device import AMP_MODES
from .config import INFERENCE_MODES

__all__ = ["CLI"]

AS_TRAINED = "(default: as the checkpoint was trained)"


def _add_model_arguments(p: argparse.ArgumentParser) -> None:
    """--checkpoint/--ema/--device, and --inference/--crop/--stride over the checkpoint's own."""
    add_checkpoint_arguments(p, "weightformer seg")
    p.add_argument("--inference", choices=INFERENCE_MODES,
                   help=f"evaluate whole images, or overlapping crops {AS_TRAINED}")
    p.add_argument("--crop", type=int, metavar="PX", help=f"sliding-window crop in pixels {AS_TRAINED}")
    p.add_argument("--stride", type=int, metavar="PX", help=f"sliding-window stride in pixels {AS_TRAINED}")


def _add_eval_arguments(p: argparse.ArgumentParser) -> None:
    _add_model_arguments(p)
    p.add_argument("--data", help="ADE20K-layout folder (or the one holding ADEChallengeData2016), or shapes "
                                  "(default: the data it was trained on)")
    p.add_argument("--batch-size", type=int, default=8,
                   help="images loaded at a time; each is predicted at its own size (default: 8)")
    p.add_argument("--workers", type=int, default=0, help="data-loading processes (default: 0)")
    p.add_argument("--amp", choices=AMP_MODES, default="none", help="mixed precision (default: none)")
    add_json_argument(p)


def _run_eval(args: argparse.Namespace) -> int:
    from .evaluation import evaluate_checkpoint, format_eval

    json_path = json_path_argument(args)
    result = evaluate_checkpoint(args.checkpoint, args.data, args.ema, args.inference, args.crop, args.stride,
                                 args.batch_size, args.workers, args.amp, args.device)
    print(format_eval(result))
    return print_and_write_results(result, json_path)


def _add_predict_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("images", nargs="+", metavar="IMAGES", help="image files or folders of them")
    _add_model_arguments(p)
    p.add_argument("--out", required=True, help="folder for the predictions (made if needed)")
    p.add_argument("--alpha", type=finite_float, default=0.5,
                   help="opacity of the class colours in the overlays (default: 0.5)")
    p.add_argument("--overwrite", action="store_true", help="move the files of an earlier predict in --out aside "
                                                            "(<name>.previous-<time>) and write anew")


def _run_predict(args: argparse.Namespace) -> int:
    from .predict import predict

    written = predict(args.checkpoint, args.images, args.out, args.ema, args.inference, args.crop, args.stride,
                      args.alpha, args.device, args.overwrite)
    for image, label_path, overlay_path in written:
        print(f"{image} -> {label_path}, {overlay_path}")
    print(f"wrote {len(written)} prediction(s) to {args.out}", flush=True)
    return 0


COMMANDS = (
    Command("eval", "mIoU, mAcc, aAcc of a checkpoint on a validation split",
            "Score a checkpoint on the validation split of its data (or --data), as the run evaluated it.",
            _add_eval_arguments, _run_eval),
    Command("predict", "class maps and overlays for image files",
            "Predict image files (or folders of them): writes <out>/<name>.png, a palette PNG in the data set's "
            "annotation encoding, and <out>/<name>_overlay.png.",
            _add_predict_arguments, _run_predict),
)

CLI = TaskCLI(
    program="weightformer seg",
    description="Semantic segmentation: UperNet on a WeightFormer (or any timm) backbone, ADE20K-layout data.",
    commands=COMMANDS,
    summary=lambda m: f"mIoU {m['mIoU']:.2f}%, mAcc {m['mAcc']:.2f}%, aAcc {m['aAcc']:.2f}% ({m['images']} images)",
    score="mIoU {:.2f}%",
)
