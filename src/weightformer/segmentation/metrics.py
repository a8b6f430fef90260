"""mIoU, mAcc and aAcc over a whole split, as mmsegmentation's ``IoUMetric`` computes them.

Per class c, over every labelled pixel of the split (pixels labelled ``ignore_index`` do not count):

    intersection_c = #{pred = c and label = c}     union_c = #{pred = c} + #{label = c} - intersection_c
    IoU_c = intersection_c / union_c               Acc_c = intersection_c / #{label = c}
    mIoU = mean of IoU_c over classes with union_c > 0,   mAcc = mean of Acc_c over classes with #{label = c} > 0
    aAcc = sum_c intersection_c / #{labelled pixels}

The areas are summed over the split before dividing. A mean of per-image IoUs is a different number:
it weighs a small image as much as a large one and counts a class absent from an image as missing
there, not as a zero.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["SegmentationMetric"]


class SegmentationMetric:
    """Pixel areas per class (intersection, prediction, label) accumulated over batches and ranks."""

    def __init__(self, num_classes: int, ignore_index: int = 255, device: Optional[torch.device] = None):
        if num_classes <= 0:
            raise ValueError(f"num_classes must be positive, got {num_classes}")
        self.num_classes = num_classes
        self.ignore_index = ignore_index
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
        batch = torch.stack([
            torch.bincount(target[pred == target], minlength=k),
            torch.bincount(pred, minlength=k),
            torch.bincount(target, minlength=k),
        ])
        self.areas += batch.to(self.areas.device)

    def all_reduce(self, group: Optional[dist.ProcessGroup] = None) -> None:
        """Sum the areas over the ranks of ``group`` (None: the default group); a no-op without torch.distributed.
        With NCCL, build the metric with ``device`` set to this rank's GPU."""
        if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
            dist.all_reduce(self.areas, op=dist.ReduceOp.SUM, group=group)

    def compute(self) -> dict[str, object]:
        """``mIoU``, ``mAcc``, ``aAcc`` (percent) and ``per_class_iou`` (percent, NaN for a class never seen)."""
        intersection, predicted, labelled = self.areas.double().cpu()
        union = predicted + labelled - intersection
        iou = intersection / union  # 0 / 0 = NaN: a class neither predicted nor labelled
        acc = intersection / labelled
        return {
            "mIoU": 100 * iou.nanmean().item(),
            "mAcc": 100 * acc.nanmean().item(),
            "aAcc": 100 * (intersection.sum() / labelled.sum()).item(),
            "per_class_iou": (100 * iou).tolist(),
        }
