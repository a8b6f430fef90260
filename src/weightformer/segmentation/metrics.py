"""mIoU, mAcc and aAcc over a whole split, as mmsegmentation's ``IoUMetric`` (areas summed before dividing):

    IoU_c = #{pred = c and label = c} / (#{pred = c} + #{label = c} - #{pred = c and label = c})
    Acc_c = #{pred = c and label = c} / #{label = c}       aAcc = sum_c #{pred = c and label = c} / #{labelled}
    mIoU, mAcc = means over the classes where they are defined (0 / 0 is NaN and left out)
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["SegmentationMetric"]


class SegmentationMetric:
    """Per-class pixel areas (intersection, prediction, label) summed over batches and ranks."""

    def __init__(self, num_classes: int, ignore_index: int = 255, device: Optional[torch.device] = None):
        if num_classes <= 0:
            raise ValueError(f"num_classes must be positive, got {num_classes}")
        self.num_classes, self.ignore_index = num_classes, ignore_index
        # rows: intersection, predicted area, label area; int64 counts stay exact past 2**53 pixels
        self.areas = torch.zeros(3, num_classes, dtype=torch.int64, device=device)

    def reset(self) -> None:
        self.areas.zero_()

    def update(self, pred: Tensor, target: Tensor) -> None:
        """Add a batch: ``pred`` and ``target`` are (B, H, W) class indices of the same shape."""
        if pred.shape != target.shape:
            raise ValueError(f"pred {tuple(pred.shape)} and target {tuple(target.shape)} must have the same shape")
        labelled = target != self.ignore_index
        pred, target = pred[labelled].long(), target[labelled].long()
        for name, values in (("pred", pred), ("target", target)):
            bad = values[(values < 0) | (values >= self.num_classes)]
            if bad.numel():
                raise ValueError(f"{name} holds values {bad.unique().tolist()[:10]} outside [0, {self.num_classes}) "
                                 f"that are not the ignore index {self.ignore_index}; check num_classes and the "
                                 f"label reduction")
        k = self.num_classes
        batch = torch.stack([torch.bincount(target[pred == target], minlength=k), torch.bincount(pred, minlength=k),
                             torch.bincount(target, minlength=k)])
        self.areas += batch.to(self.areas.device)

    def all_reduce(self, group: Optional[dist.ProcessGroup] = None) -> None:
        """Sum the areas over the ranks of ``group`` (with NCCL, build the metric on this rank's GPU)."""
        if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
            dist.all_reduce(self.areas, op=dist.ReduceOp.SUM, group=group)

    def compute(self) -> dict[str, object]:
        """``mIoU``, ``mAcc``, ``aAcc`` (percent) and ``per_class_iou`` (percent, NaN for a class never seen)."""
        intersection, predicted, labelled = self.areas.double().cpu()
        union = predicted + labelled - intersection
        iou = intersection / union  # 0 / 0 = NaN: a class neither predicted nor labelled
        acc = intersection / labelled
        return {"mIoU": 100 * iou.nanmean().item(), "mAcc": 100 * acc.nanmean().item(),
                "aAcc": 100 * (intersection.sum() / labelled.sum()).item(), "per_class_iou": (100 * iou).tolist()}
