"""Evaluating a classifier: top-1, top-5, loss and throughput over a loader (:func:`evaluate`, what the
training loop calls), or of a checkpoint on a data set (:func:`evaluate_checkpoint`, ``weightformer eval``)."""

from __future__ import annotations

import time
from typing import Any, Mapping, Optional

import torch
from timm.data import create_transform
from timm.utils import accuracy
from torch import nn
from torch.utils.data import DataLoader

from ..checkpoint import CheckpointError
from ..data import DataError, DataInfo, open_dataset
from ..data.sampler import split_loader, split_sampler
from ..data.transforms import eval_data_config, seeded_transform
from ..engine.device import autocast
from ..engine.distributed import DistInfo, all_reduce_sum, init_distributed, shutdown_distributed
from ..engine.errors import ConfigError
from ..engine.metrics import FiniteOutputs
from ..progress import progress
from ..engine.weights import load_model
from .model import check_input_size

__all__ = ["eval_transform_config", "evaluate", "evaluate_checkpoint", "format_eval"]


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, device: torch.device, amp: str = "none",
             dist_info: Optional[DistInfo] = None, show_progress: bool = False) -> dict[str, float]:
    """Top-1 and top-5 accuracy (%), mean cross-entropy, images per second and the image count over ``loader``,
    reduced over the ranks under torch.distributed."""
    was_training = model.training
    model.eval()
    criterion = nn.CrossEntropyLoss(reduction="sum")
    totals = torch.zeros(4, dtype=torch.float64, device=device)  # loss, top-1 hits, top-5 hits, samples
    start = time.perf_counter()
    main = dist_info is None or dist_info.is_main
    finite = FiniteOutputs("logits", device)
    with progress(loader, desc="evaluating", unit="batch", enabled=show_progress and main) as bar:
        for images, targets in bar:
            images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
            with autocast(device, amp):
                logits = model(images)  # (B, num_classes)
            logits = logits.float()
            finite.update(logits)
            top1, top5 = accuracy(logits, targets, topk=(1, min(5, logits.shape[1])))
            n = targets.shape[0]
            totals += torch.stack([criterion(logits, targets).double(), top1.double() * n / 100,
                                   top5.double() * n / 100, torch.tensor(float(n), dtype=torch.float64, device=device)])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    if dist_info is not None:
        totals = all_reduce_sum(totals, dist_info)
    loss_sum, hits1, hits5, count = totals.tolist()
    model.train(was_training)
    finite.check()
    if count == 0:
        raise DataError("the evaluation split is empty; put images in val/")
    return {"top1": 100.0 * hits1 / count, "top5": 100.0 * hits5 / count, "loss": loss_sum / count,
            "img_per_s": count / max(seconds, 1e-9), "num_samples": int(count)}


def format_eval(result: dict[str, Any]) -> str:
    """The text report of :func:`evaluate_checkpoint`."""
    skipped = result.get("skipped_files") or []
    left_out = f"; {len(skipped)} unreadable file(s) left out" if skipped else ""
    return (f"top-1 {result['top1']:.2f}%  top-5 {result['top5']:.2f}%  loss {result['loss']:.4f}  "
            f"{result['img_per_s']:.0f} img/s  ({result['num_samples']} images of {result['data']}{left_out}, "
            f"model {result['model']})")


def _check_eval_settings(batch_size: int, workers: int, img_size: Optional[int], amp: str, device: str) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"--batch-size must be a whole number of at least 1, got {batch_size!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ConfigError(f"--workers must be 0 (load in this process) or more, got {workers!r}")
    if img_size is not None and (isinstance(img_size, bool) or not isinstance(img_size, int) or img_size < 1):
        raise ConfigError(f"--img-size must be a positive number of pixels, got {img_size!r}")
    if amp not in ("none", "bf16", "fp16"):
        raise ConfigError(f"--amp must be none, bf16 or fp16, got {amp!r}")
    if device not in ("auto", "cuda", "cpu"):
        raise ConfigError(f"--device must be auto, cuda or cpu, got {device!r}")


def check_data_fits(meta: Mapping[str, Any], info: DataInfo, source: str) -> None:
    """An error naming what differs (channels, class count, class names) unless ``meta``'s classifier fits ``info``."""
    trained_on = f" ({meta['data']})" if meta.get("data") else ""
    if meta.get("in_chans", info.in_chans) != info.in_chans:
        raise CheckpointError(f"{source} was trained on {meta['in_chans']}-channel images and {info.name} has "
                              f"{info.in_chans}-channel images; evaluate on the data set it was trained on{trained_on}")
    if meta["num_classes"] != info.num_classes:
        raise CheckpointError(f"{source} has {meta['num_classes']} classes, the data {info.name} has "
                              f"{info.num_classes}; evaluate on the data set it was trained on{trained_on}, or data "
                              f"with the model's classes")
    if meta.get("classes") and list(meta["classes"]) != list(info.classes):
        raise DataError(f"the class folders of {info.name} differ from those {source} was trained on{trained_on}; "
                        f"evaluate on data with the same class names")


def eval_transform_config(net: nn.Module, meta: Mapping[str, Any], img_size: Optional[int]) -> dict[str, Any]:
    """The checkpoint's preprocessing, else the model's pretrained config's, as in timm/validate.py."""
    pretrained_cfg = getattr(net, "pretrained_cfg", None)
    if "img_size" in meta:
        return eval_data_config(pretrained_cfg, in_chans=meta["in_chans"], img_size=img_size or meta["img_size"],
                                interpolation=meta["interpolation"], crop_pct=meta["crop_pct"],
                                crop_mode=meta.get("crop_mode"), mean=tuple(meta["mean"]), std=tuple(meta["std"]))
    return eval_data_config(pretrained_cfg, in_chans=meta["in_chans"], img_size=img_size)


def evaluate_checkpoint(checkpoint: Optional[str] = None, model: Optional[str] = None, pretrained: bool = False,
                        data: Optional[str] = None, model_kwargs: Optional[dict[str, Any]] = None,
                        img_size: Optional[int] = None, batch_size: int = 256, workers: int = 4, amp: str = "none",
                        device: str = "auto", use_ema: bool = False) -> dict[str, Any]:
    """Evaluate a checkpoint (any format :func:`load_model` reads; ``data`` defaults to its own), or timm's
    pretrained ``model``: top-1/top-5 (%), loss, img/s, the images evaluated, the unreadable files left out, and
    the model, data and preprocessing used."""
    _check_eval_settings(batch_size, workers, img_size, amp, device)
    if checkpoint is None and not (model and pretrained):
        raise CheckpointError("nothing to evaluate; pass --checkpoint PATH, or --model NAME --pretrained")
    dist_info = init_distributed(device)
    try:
        autocast(dist_info.device, amp)  # an --amp the device cannot run is refused before the model and data
        loaded = load_model(checkpoint, task="classification", model=model, model_kwargs=model_kwargs,
                            use_ema=use_ema, pretrained=pretrained and checkpoint is None)
        net, meta = loaded.model, loaded.meta
        data = data or meta.get("data")
        if data is None:
            raise DataError("no data to evaluate on; pass --data PATH (an ImageFolder with val/) or mnist")
        info, splits = open_dataset(data, splits=("val",), warn=dist_info.is_main, in_chans=meta.get("in_chans", 3),
                                    split_names={"val": meta.get("val_split", "val")},
                                    columns=tuple(meta.get("columns", ("image", "label"))))
        check_data_fits(meta, info, loaded.source)
        data_config = eval_transform_config(net, meta, img_size)
        net.to(dist_info.device)
        check_input_size(net, {"model": meta["model"], "in_chans": info.in_chans,
                               "img_size": data_config["input_size"][-1]}, dist_info.device)
        transform = create_transform(**data_config, is_training=False)
        val_set = seeded_transform(splits["val"], transform)
        sampler = split_sampler(val_set, dist_info.rank, dist_info.world_size, train=False)
        loader = split_loader(val_set, sampler, batch_size, num_workers=workers,
                              pin_memory=dist_info.device.type == "cuda")
        result: dict[str, Any] = evaluate(net, loader, dist_info.device, amp, dist_info, show_progress=True)
        result.update(model=meta["model"], data=info.name, checkpoint=checkpoint, ema=use_ema,
                      img_size=data_config["input_size"][-1], crop_pct=data_config["crop_pct"],
                      crop_mode=data_config["crop_mode"], interpolation=data_config["interpolation"],
                      skipped_files=list(info.skipped), world_size=dist_info.world_size)
        return result
    finally:
        shutdown_distributed(dist_info)
