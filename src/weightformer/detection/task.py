"""What a training engine calls for detection: the loss of a batch, and COCO metrics over a loader."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.data import DataLoader

from .data import CocoDetection, Target, drop_crowd
from .evaluation import CocoEvaluator

__all__ = ["evaluate", "training_loss"]


def _gather(obj: Any) -> list[Any]:
    """Every rank's ``obj`` under torch.distributed, else ``[obj]``."""
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def training_loss(model: nn.Module, batch: tuple[list[Tensor], list[Target]],
                  device: torch.device) -> tuple[Tensor, dict[str, Tensor]]:
    """The summed loss of a collated batch, and each detached term (RPN, box stages, mask) to log.
    Crowd regions are left out of the targets."""
    images, targets = batch
    images = [image.to(device, non_blocking=True) for image in images]
    targets = [{k: v.to(device, non_blocking=True) for k, v in drop_crowd(t).items()} for t in targets]
    losses = model(images, targets)
    return sum(losses.values()), {k: v.detach() for k, v in losses.items()}


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, dataset: CocoDetection, device: torch.device) -> dict[str, float]:
    """COCO box and mask AP (percent) of ``model`` over ``loader``, a loader of ``dataset`` (or of a
    shard of it on each rank: the ranks' detections are gathered, so every rank returns the same)."""
    was_training = model.training
    model.eval()
    evaluator = CocoEvaluator(dataset.coco, dataset.category_ids)
    for images, targets in loader:
        predictions = model([image.to(device, non_blocking=True) for image in images])
        evaluator.update([t["image_id"] for t in targets], predictions)
    model.train(was_training)
    gathered = _gather(evaluator.detections)
    evaluator.detections = {}
    evaluator.merge(gathered)
    return evaluator.compute()
