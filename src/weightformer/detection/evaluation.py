"""COCO box and mask AP of a detector's predictions, computed by pycocotools against the annotation file.

Metrics are in percent (0-100), as detection papers and mmdetection report them: ``bbox_mAP`` is
AP averaged over IoU 0.50:0.95, ``bbox_mAP_50`` / ``bbox_mAP_75`` at IoU 0.50 / 0.75, and
``segm_mAP`` / ``segm_mAP_50`` the same for masks. A metric with no ground truth to score is NaN.
"""

from __future__ import annotations

import contextlib
import io
import math
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import torch
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from torch import Tensor

__all__ = ["METRIC_NAMES", "CocoEvaluator"]

# (metric, COCOeval stats index): stats are AP@[.5:.95], AP@.5, AP@.75, then size buckets and recalls
STATS = {"mAP": 0, "mAP_50": 1, "mAP_75": 2}
METRIC_NAMES = ("bbox_mAP", "bbox_mAP_50", "bbox_mAP_75", "segm_mAP", "segm_mAP_50")


class CocoEvaluator:
    """Collects detections image by image, then scores them with COCOeval.

    ``coco_gt``: the ground truth (``CocoDetection.coco``); ``category_ids[i]`` is the COCO category of
    model label ``i + 1`` (``CocoDetection.category_ids``). Predictions must be in the pixels of the
    stored image, as a torchvision detector in eval mode returns them. Only the images passed to
    :meth:`update` are scored, so a shard or a subset of a split can be evaluated.
    """

    def __init__(self, coco_gt: COCO, category_ids: Sequence[int], mask_threshold: float = 0.5):
        self.coco_gt = coco_gt
        self.category_ids = list(category_ids)
        self.mask_threshold = mask_threshold
        self.detections: dict[int, list[dict[str, Any]]] = {}  # image id -> its COCO result records

    def update(self, image_ids: Iterable[int | Tensor], predictions: Iterable[Mapping[str, Tensor]]) -> None:
        """Add one batch: each image's id and its prediction (boxes xyxy, scores, labels, masks (N, 1, H, W))."""
        for image_id, pred in zip(image_ids, predictions):
            image_id = int(image_id)
            boxes = pred["boxes"].detach().float().cpu()
            boxes = torch.cat([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], dim=1)  # xyxy -> COCO's xywh
            masks = (pred["masks"][:, 0] > self.mask_threshold).cpu().numpy().astype(np.uint8)  # (N, H, W)
            rles = mask_utils.encode(np.asfortranarray(masks.transpose(1, 2, 0)))  # wants (H, W, N) in Fortran order
            self.detections[image_id] = [
                {"image_id": image_id, "category_id": self.category_ids[int(label) - 1], "bbox": box,
                 "score": float(score), "segmentation": rle}
                for box, score, label, rle in zip(boxes.tolist(), pred["scores"].tolist(), pred["labels"].tolist(), rles)
            ]

    def merge(self, per_rank: Iterable[Mapping[int, list[dict[str, Any]]]]) -> None:
        """Take in every rank's :attr:`detections` (e.g. from ``all_gather_object``). An image seen by
        several ranks, as a padded distributed sampler repeats some, counts once."""
        for detections in per_rank:
            self.detections.update(detections)

    def compute(self) -> dict[str, float]:
        """The metrics of :data:`METRIC_NAMES` (percent) over the images added so far, and their count."""
        records = [r for image in self.detections.values() for r in image]
        metrics: dict[str, float] = {}
        for iou_type, names in (("bbox", ("mAP", "mAP_50", "mAP_75")), ("segm", ("mAP", "mAP_50"))):
            stats = self._stats(iou_type, records)
            metrics.update({f"{iou_type}_{n}": stats[STATS[n]] for n in names})
        metrics["num_images"] = float(len(self.detections))
        return metrics

    def _stats(self, iou_type: str, records: list[dict[str, Any]]) -> list[float]:
        """COCOeval's summary numbers in percent (NaN where there is no ground truth to score)."""
        dropped = "segmentation" if iou_type == "bbox" else "bbox"  # a segm result's box is then taken from its mask
        results = [{k: v for k, v in r.items() if k != dropped} for r in records]
        image_ids = sorted(self.detections)
        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress and the summary table
            if not results:  # loadRes rejects an empty list: no detections score AP 0 wherever there is ground truth
                has_gt = any(self.coco_gt.getAnnIds(imgIds=image_ids, iscrowd=False))
                return [0.0 if has_gt else math.nan] * 12
            evaluation = COCOeval(self.coco_gt, self.coco_gt.loadRes(results), iou_type)
            evaluation.params.imgIds = image_ids
            evaluation.evaluate()
            evaluation.accumulate()
            evaluation.summarize()
        return [100.0 * float(s) if s >= 0 else math.nan for s in evaluation.stats]
