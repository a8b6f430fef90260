"""Evaluation: top-1, top-5, loss and throughput of a model on a data set."""

from __future__ import annotations

import json
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Optional

import torch
from timm.data import resolve_data_config
from timm.utils import accuracy
from torch import nn
from torch.utils.data import DataLoader

from ..checkpoint import CheckpointError
from ..data import DataError, ResumableSampler, SeededTransformDataset, build_transforms, open_dataset
from .distributed import DistInfo, all_reduce_sum, init_distributed, shutdown_distributed
from .state import build_model, load_model_state, model_state_from, read_checkpoint

__all__ = ["autocast", "evaluate", "evaluate_checkpoint", "format_eval"]


def autocast(device: torch.device, amp: str):
    """The autocast context for ``amp`` (none, bf16, fp16) on ``device``."""
    if amp == "none":
        return nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if amp == "bf16" else torch.float16)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: DataLoader,
    device: torch.device,
    amp: str = "none",
    dist_info: Optional[DistInfo] = None,
) -> dict[str, float]:
    """Top-1 and top-5 accuracy (%), mean cross-entropy and images per second over ``loader``.

    Under torch.distributed each rank evaluates its shard and the sums are reduced, so every
    rank returns the numbers of the whole data set.
    """
    was_training = model.training
    model.eval()
    criterion = nn.CrossEntropyLoss(reduction="sum")
    totals = torch.zeros(4, dtype=torch.float64, device=device)  # loss, top-1 hits, top-5 hits, samples
    start = time.perf_counter()
    for images, targets in loader:
        images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        with autocast(device, amp):
            logits = model(images)  # (B, num_classes)
        logits = logits.float()
        top1, top5 = accuracy(logits, targets, topk=(1, min(5, logits.shape[1])))
        n = targets.shape[0]
        totals += torch.stack([criterion(logits, targets).double(), top1.double() * n / 100, top5.double() * n / 100,
                               torch.tensor(float(n), dtype=torch.float64, device=device)])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    if dist_info is not None:
        totals = all_reduce_sum(totals, dist_info)
    loss_sum, hits1, hits5, count = totals.tolist()
    model.train(was_training)
    if count == 0:
        raise DataError("the evaluation split is empty; put images in val/")
    return {
        "top1": 100.0 * hits1 / count,
        "top5": 100.0 * hits5 / count,
        "loss": loss_sum / count,
        "img_per_s": count / max(seconds, 1e-9),
        "num_samples": int(count),
    }


def format_eval(result: dict[str, Any]) -> str:
    """The text report of :func:`evaluate_checkpoint`."""
    return (
        f"top-1 {result['top1']:.2f}%  top-5 {result['top5']:.2f}%  loss {result['loss']:.4f}  "
        f"{result['img_per_s']:.0f} img/s  ({result['num_samples']} images of {result['data']}, model {result['model']})"
    )


def evaluate_checkpoint(
    checkpoint: Optional[str] = None,
    model: Optional[str] = None,
    pretrained: bool = False,
    data: Optional[str] = None,
    model_kwargs: Optional[dict[str, Any]] = None,
    img_size: Optional[int] = None,
    batch_size: int = 256,
    workers: int = 4,
    amp: str = "none",
    device: str = "auto",
    use_ema: bool = False,
    json_path: Optional[str] = None,
) -> dict[str, Any]:
    """Evaluate a checkpoint written by ``train`` (it names its own model and data), or a timm model.

    ``checkpoint``: our ``last.pt``/``best.pt`` (rebuilt from their metadata), or any state dict
    with ``model`` naming its architecture. ``model`` with ``pretrained``: timm's own weights.
    ``data`` defaults to the data set the checkpoint was trained on. Returns top-1/top-5 (%),
    loss, img/s, sample count, model and data names; writes them as JSON to ``json_path`` if given.
    """
    if checkpoint is None and not (model and pretrained):
        raise CheckpointError("nothing to evaluate; pass --checkpoint PATH, or --model NAME --pretrained")
    dist_info = init_distributed(device)
    try:
        ckpt = read_checkpoint(checkpoint) if checkpoint else {}
        meta = dict(ckpt.get("meta") or {})
        if model is not None and meta.get("model") not in (None, model):
            meta = {}  # another architecture was asked for: keep only the weights, which must then fit it
        data = data or meta.get("data")
        if data is None:
            raise DataError("no data to evaluate on; pass --data PATH (an ImageFolder with val/) or mnist")
        info, splits = open_dataset(data, splits=("val",), warn=dist_info.is_main)
        if meta and meta["num_classes"] != info.num_classes:
            raise CheckpointError(
                f"{checkpoint} has {meta['num_classes']} classes, the data {info.name} has {info.num_classes}; "
                f"evaluate on the data set it was trained on ({meta.get('data')})"
            )
        if meta.get("classes") and list(meta["classes"]) != list(info.classes):
            raise DataError(
                f"the class folders of {info.name} differ from those {checkpoint} was trained on "
                f"({meta.get('data')}); evaluate on data with the same class names"
            )
        if not meta:
            if model is None:
                raise CheckpointError(f"{checkpoint} does not say which model it holds; pass --model NAME")
            meta = {"model": model, "model_kwargs": dict(model_kwargs or {}), "num_classes": info.num_classes,
                    "in_chans": info.in_chans, "mean": list(info.mean), "std": list(info.std)}
        elif model_kwargs:
            meta["model_kwargs"] = {**meta["model_kwargs"], **model_kwargs}
        net = build_model(meta, pretrained=pretrained and checkpoint is None)
        if checkpoint:
            load_model_state(net, model_state_from(ckpt, use_ema, source=checkpoint), source=checkpoint)
        elif net.num_classes != info.num_classes:
            raise CheckpointError(
                f"pretrained {model} has {net.num_classes} classes, {data} has {info.num_classes}; "
                f"evaluate on data with the model's classes"
            )
        if "img_size" in meta:
            transform_args = dict(img_size=img_size or meta["img_size"], mean=tuple(meta["mean"]), std=tuple(meta["std"]),
                                  interpolation=meta["interpolation"], crop_pct=meta["crop_pct"])
        else:  # timm's pretrained config knows the model's preprocessing
            cfg = resolve_data_config({}, model=net)
            transform_args = dict(img_size=img_size or cfg["input_size"][-1], mean=cfg["mean"], std=cfg["std"],
                                  interpolation=cfg["interpolation"], crop_pct=cfg["crop_pct"])
        _, val_tf = build_transforms(**transform_args)
        val_set = SeededTransformDataset(splits["val"], val_tf)
        sampler = ResumableSampler(len(val_set), dist_info.world_size, dist_info.rank, shuffle=False, pad=False)
        loader = DataLoader(val_set, batch_size=batch_size, sampler=sampler, num_workers=workers,
                            pin_memory=dist_info.device.type == "cuda")
        net.to(dist_info.device)
        result: dict[str, Any] = evaluate(net, loader, dist_info.device, amp, dist_info)
        result.update(model=meta["model"], data=info.name, checkpoint=checkpoint, ema=use_ema,
                      img_size=transform_args["img_size"], world_size=dist_info.world_size)
        if json_path and dist_info.is_main:
            Path(json_path).parent.mkdir(parents=True, exist_ok=True)
            Path(json_path).write_text(json.dumps(result, indent=2) + "\n")
        return result
    finally:
        shutdown_distributed(dist_info)
