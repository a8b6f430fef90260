"""Evaluating a segmenter: mIoU, mAcc and aAcc over a loader (:func:`evaluate`, the training loop's) or of a
checkpoint (:func:`evaluate_checkpoint`, ``seg eval``). Each image is predicted on its own at its own size
(:func:`.inference.infer_each`, so no score depends on the batch size), its logits resized to the annotation's
size, and scored over the whole split and all ranks."""

from __future__ import annotations

import math
import os
from typing import Any, Mapping, Optional

import torch
import torch.nn.functional as F
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch.utils.data import DataLoader

from ..engine.config import config_fields
from ..engine.device import autocast, pick_device
from ..engine.errors import ConfigError
from ..engine.metrics import FiniteOutputs
from ..engine.weights import LoadedModel, load_model
from .config import INFERENCE_MODES, SegmentationConfig, check_windows
from .data import IGNORE_INDEX, EvalTransform, SegmentationFolder, collate_segmentation, find_root
from .inference import infer_each
from .metrics import SegmentationMetric

__all__ = ["eval_transform", "evaluate", "evaluate_checkpoint", "format_eval", "inference_settings", "load_segmenter"]

INFERENCE_FIELDS = ("seg_inference", "seg_crop", "seg_stride")  # --inference, --crop, --stride


def eval_transform(img_size: int) -> EvalTransform:
    """Test-time resize for a model trained on ``img_size`` crops: short side to img_size, long side at most 4x."""
    return EvalTransform(scale=(4 * img_size, img_size), mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD)


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader: DataLoader, num_classes: int, device: torch.device,
             mode: str = "whole", crop: int = 512, stride: int = 341, amp: str = "none") -> dict[str, object]:
    """``mIoU``, ``mAcc``, ``aAcc`` and ``per_class_iou`` (percent) of ``model`` on the whole split, on every rank."""
    was_training = model.training
    model.eval()
    metric = SegmentationMetric(num_classes, IGNORE_INDEX, device=device)
    finite = FiniteOutputs("logits", device)
    for images, labels, image_sizes, label_sizes in loader:
        each = infer_each(model, images.to(device, non_blocking=True), image_sizes.tolist(), mode, crop, stride, amp)
        for logits, label, (label_h, label_w) in zip(each, labels, label_sizes.tolist()):  # (1, K, h, w) each
            logits = F.interpolate(logits, size=(label_h, label_w), mode="bilinear", align_corners=False)
            finite.update(logits)
            metric.update(logits.argmax(1), label[None, :label_h, :label_w].to(device))
    metric.all_reduce()
    model.train(was_training)
    finite.check()
    return metric.compute()


def inference_settings(loaded: LoadedModel, inference: Optional[str] = None, crop: Optional[int] = None,
                       stride: Optional[int] = None) -> dict[str, Any]:
    """``seg_inference``, ``seg_crop`` and ``seg_stride``: those given, else the checkpoint's, else the defaults."""
    saved = (loaded.checkpoint or {}).get("config") or {}
    defaults = config_fields(SegmentationConfig)
    given = dict(zip(INFERENCE_FIELDS, (inference, crop, stride)))
    chosen = {name: given[name] if given[name] is not None else saved.get(name, defaults[name].default)
              for name in INFERENCE_FIELDS}
    if chosen["seg_inference"] not in INFERENCE_MODES:
        raise ConfigError(f"--inference must be {' or '.join(INFERENCE_MODES)}, got {chosen['seg_inference']!r}")
    if chosen["seg_crop"] < 1 or chosen["seg_stride"] < 1:
        raise ConfigError(f"--crop and --stride must be positive pixels, got {chosen['seg_crop']} and "
                          f"{chosen['seg_stride']}")
    check_windows(chosen["seg_inference"], chosen["seg_crop"], chosen["seg_stride"])
    return chosen


def load_segmenter(checkpoint: str | os.PathLike, use_ema: bool = False, device: str = "auto",
                   inference: Optional[str] = None, crop: Optional[int] = None,
                   stride: Optional[int] = None) -> tuple[LoadedModel, dict[str, Any]]:
    """The segmenter of ``checkpoint`` (in eval mode on ``device``) and its :func:`inference_settings`."""
    loaded = load_model(checkpoint, task="segmentation", use_ema=use_ema, device=pick_device(device))
    return loaded, inference_settings(loaded, inference, crop, stride)


def evaluate_checkpoint(checkpoint: str | os.PathLike, data: Optional[str] = None, use_ema: bool = False,
                        inference: Optional[str] = None, crop: Optional[int] = None, stride: Optional[int] = None,
                        batch_size: int = 8, workers: int = 0, amp: str = "none", device: str = "auto"
                        ) -> dict[str, Any]:
    """``seg eval``: mIoU, mAcc, aAcc and each class's IoU (percent) of a ``seg train`` checkpoint on the
    validation split of ``data`` (default: its own), with the run's inference settings unless given."""
    if batch_size < 1 or workers < 0:
        raise ConfigError(f"--batch-size must be at least 1 and --workers 0 or more, got {batch_size} and {workers}")
    loaded, settings = load_segmenter(checkpoint, use_ema, device, inference, crop, stride)
    meta, target = loaded.meta, next(loaded.model.parameters()).device
    autocast(target, amp)  # --amp checked against the device before the data is read
    data = data or meta["data"]
    val_set = SegmentationFolder(find_root(data, ("validation",)), "validation",
                                 reduce_zero_label=meta["reduce_zero_label"], num_classes=meta["num_classes"],
                                 transform=eval_transform(meta["img_size"]))
    loader = DataLoader(val_set, batch_size=batch_size, num_workers=min(workers, os.cpu_count() or 1),
                        collate_fn=collate_segmentation)
    metrics = evaluate(loaded.model, loader, meta["num_classes"], target, settings["seg_inference"],
                       settings["seg_crop"], settings["seg_stride"], amp)
    return {
        "checkpoint": str(checkpoint), "data": str(data), "images": len(val_set), **settings,
        "mIoU": metrics["mIoU"], "mAcc": metrics["mAcc"], "aAcc": metrics["aAcc"],
        "per_class_iou": [None if math.isnan(v) else v for v in metrics["per_class_iou"]],  # NaN: a class never seen
        "classes": meta.get("classes"),
    }


def format_eval(result: Mapping[str, Any]) -> str:
    """``seg eval``'s lines: the scores, and each class's IoU for up to 20 classes."""
    lines = [f"{result['checkpoint']} on {result['data']} ({result['images']} images, {result['seg_inference']} "
             f"inference): mIoU {result['mIoU']:.2f}%, mAcc {result['mAcc']:.2f}%, aAcc {result['aAcc']:.2f}%"]
    names = result.get("classes") or [str(c) for c in range(len(result["per_class_iou"]))]
    if len(names) <= 20:
        lines.append("  IoU per class: " + ", ".join(f"{n} {'-' if v is None else f'{v:.1f}'}"
                                                     for n, v in zip(names, result["per_class_iou"])))
    return "\n".join(lines)
