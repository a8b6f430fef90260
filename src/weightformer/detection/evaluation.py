"""COCO box and mask AP by pycocotools, over a loader (:func:`evaluate`) or for a checkpoint
(:func:`evaluate_checkpoint`, ``weightformer det eval``). Metrics are in percent: ``bbox_mAP`` is AP over IoU
0.50:0.95, ``bbox_mAP_50`` / ``bbox_mAP_75`` at IoU 0.50 / 0.75, ``segm_*`` the same for masks; NaN where
there is no ground truth to score."""

from __future__ import annotations

import contextlib
import io
import math
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np
import torch
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from torch import Tensor, nn
from torch.utils.data import DataLoader

from ..checkpoint import CheckpointError
from ..data import ResumableSampler
from ..engine.distributed import DistInfo, all_gather_objects, init_distributed, shutdown_distributed
from ..engine.errors import ConfigError
from ..engine.metrics import FiniteOutputs
from ..engine.outputs import claim_outputs
from ..engine.run_dir import check_writable_folder
from ..engine.weights import load_model
from .annotations import listed
from .data import CocoDetection, collate
from .layout import data_root, find_split, split_files
from .visualize import save_visualizations, visualization_paths

__all__ = ["METRIC_NAMES", "PER_CATEGORY", "CocoEvaluator", "evaluate", "evaluate_checkpoint", "format_eval", "val_dataset"]

STATS = {"mAP": 0, "mAP_50": 1, "mAP_75": 2}  # index in COCOeval's stats: AP@[.5:.95], AP@.5, AP@.75, ...
METRIC_NAMES = ("bbox_mAP", "bbox_mAP_50", "bbox_mAP_75", "segm_mAP", "segm_mAP_50")
PER_CATEGORY = ("bbox_AP_per_category", "segm_AP_per_category")  # category name -> AP@[.5:.95], percent


class CocoEvaluator:
    """Collects detections (in the stored image's pixels) image by image, then scores the images passed to
    :meth:`update` with COCOeval. ``category_ids[i]`` is the COCO category of model label ``i + 1``."""

    def __init__(self, coco_gt: COCO, category_ids: Sequence[Optional[int]], mask_threshold: float = 0.5):
        self.coco_gt, self.category_ids, self.mask_threshold = coco_gt, list(category_ids), mask_threshold
        self.detections: dict[int, list[dict[str, Any]]] = {}  # image id -> its COCO result records
        self.per_category: dict[str, dict[str, Optional[float]]] = {}  # iou type -> category name -> AP, by compute

    def update(self, image_ids: Iterable[int | Tensor], predictions: Iterable[Mapping[str, Tensor]]) -> None:
        """Add one batch: each image's id and its prediction (boxes xyxy, scores, labels, masks (N, 1, H, W))."""
        for image_id, pred in zip(image_ids, predictions):
            image_id = int(image_id)
            boxes = pred["boxes"].detach().float().cpu()
            boxes = torch.cat([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], dim=1)  # xyxy -> COCO's xywh
            masks = (pred["masks"][:, 0] > self.mask_threshold).cpu().numpy().astype(np.uint8)  # (N, H, W)
            rles = mask_utils.encode(np.asfortranarray(masks.transpose(1, 2, 0)))  # wants (H, W, N) in Fortran order
            rows = zip(boxes.tolist(), pred["scores"].tolist(), pred["labels"].tolist(), rles)
            self.detections[image_id] = [{"image_id": image_id, "category_id": self.category_ids[int(label) - 1],
                                          "bbox": box, "score": float(score), "segmentation": rle}
                                         for box, score, label, rle in rows]

    def merge(self, per_rank: Iterable[Mapping[int, list[dict[str, Any]]]]) -> None:
        """Take in every rank's :attr:`detections`; an image seen by several ranks counts once."""
        for detections in per_rank:
            self.detections.update(detections)

    def compute(self) -> dict[str, float]:
        """The metrics of :data:`METRIC_NAMES` (percent) over the images added so far, and their count; each
        category's AP@[.5:.95] goes to :attr:`per_category`."""
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
                scored = {a["category_id"] for a in self.coco_gt.loadAnns(self.coco_gt.getAnnIds(imgIds=image_ids,
                                                                                                 iscrowd=False))}
                self.per_category[iou_type] = {c["name"]: 0.0 if c["id"] in scored else None
                                               for c in self.coco_gt.loadCats(self.coco_gt.getCatIds())}
                return [0.0 if scored else math.nan] * 12
            evaluation = COCOeval(self.coco_gt, self.coco_gt.loadRes(results), iou_type)
            evaluation.params.imgIds = image_ids
            evaluation.evaluate()
            evaluation.accumulate()
            evaluation.summarize()
        self.per_category[iou_type] = self._category_ap(evaluation)
        return [100.0 * float(s) if s >= 0 else math.nan for s in evaluation.stats]

    def _category_ap(self, evaluation: COCOeval) -> dict[str, Optional[float]]:
        """Each category's AP@[.5:.95] in percent, as COCOeval's summary averages it (all areas, 100
        detections an image); None for a category with no ground truth among the images."""
        precision = evaluation.eval["precision"]  # (IoU thresholds, recall points, categories, areas, max dets)
        out: dict[str, Optional[float]] = {}
        for k, category in enumerate(evaluation.params.catIds):
            values = precision[:, :, k, 0, -1]
            values = values[values > -1]  # -1: no ground truth of this category
            out[self.coco_gt.cats[category]["name"]] = round(100.0 * float(values.mean()), 4) if values.size else None
        return out


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, dataset: CocoDetection, device: torch.device,
             dist_info: Optional[DistInfo] = None,
             category_ids: Optional[Sequence[Optional[int]]] = None) -> dict[str, float]:
    """COCO box and mask AP (percent) of ``model`` over ``loader`` of ``dataset`` (or of a shard of it on each
    rank of ``dist_info``: the detections are gathered, so every rank returns the same), and the image count.
    ``category_ids[i]``: the category of model label ``i + 1`` (default ``dataset.category_ids``; None where
    the data has none, :func:`matched_categories`)."""
    was_training = model.training
    model.eval()
    category_ids = list(dataset.category_ids if category_ids is None else category_ids)
    scored = {label for label, c in enumerate(category_ids, 1) if c is not None}
    evaluator = CocoEvaluator(dataset.coco, category_ids)
    finite = FiniteOutputs("detections (boxes, scores, masks)", device)
    for images, targets in loader:
        predictions = model([image.to(device, non_blocking=True) for image in images])
        finite.update([torch.cat([v.flatten() for v in p.values() if v.is_floating_point()]) for p in predictions])
        # labels with no category in the file (a model built with more classes) have nothing to be scored against
        keep = [torch.tensor([label in scored for label in p["labels"].tolist()], dtype=torch.bool,
                             device=p["labels"].device) for p in predictions]
        predictions = [{k: v[kept] for k, v in p.items()} for p, kept in zip(predictions, keep)]
        evaluator.update([t["image_id"] for t in targets], predictions)
    model.train(was_training)
    finite.check()
    if dist_info is not None:
        gathered = all_gather_objects(evaluator.detections, dist_info)
        evaluator.detections = {}
        evaluator.merge(gathered)
    metrics: dict[str, Any] = evaluator.compute()
    metrics.update({f"{iou_type}_AP_per_category": aps for iou_type, aps in evaluator.per_category.items()})
    return metrics


def val_dataset(data: str, split: Optional[str] = None, run_split: Optional[str] = None) -> CocoDetection:
    """The validation split of ``data``: ``split`` if given (``--split``), else ``run_split`` (a run's
    ``val_split``) if the folder has it, else the one :func:`~weightformer.detection.layout.find_split` finds."""
    root = data_root(data)
    if split is None and run_split and split_files(root, run_split) is not None:
        split = run_split
    return CocoDetection(root, find_split(root, "val", split, flag="--split").name)


def matched_categories(dataset: CocoDetection, classes: Sequence[str], checkpoint: str | os.PathLike
                       ) -> list[Optional[int]]:
    """The data's category id of each of a checkpoint's ``classes`` (its labels 1..N), matched by name (None
    where the data has no such category); a CheckpointError line if the data names a category the checkpoint
    does not know, or names one twice in another order."""
    names = dataset.class_names[1:]
    if names == list(classes[:len(names)]):
        return list(dataset.category_ids)
    unknown = [n for n in names if n not in classes]
    if unknown:
        raise CheckpointError(f"{dataset.annotation_file} names categories {listed(unknown, 3)} that {checkpoint} was "
                              f"not trained on (it knows {listed(list(classes), 3)}); evaluate on data with its "
                              "categories")
    if len(set(names)) < len(names):
        raise CheckpointError(f"{dataset.annotation_file} names a category twice and in another order than "
                              f"{checkpoint}, so they cannot be matched by name; list them in the checkpoint's order "
                              f"({listed(list(classes), 3)})")
    by_name = dict(zip(names, dataset.category_ids))
    return [by_name.get(name) for name in classes]


def evaluate_checkpoint(checkpoint: str | os.PathLike, data: Optional[str] = None, split: Optional[str] = None,
                        batch_size: int = 4, workers: int = 4, device: str = "auto", use_ema: bool = False,
                        visualize: int = 0, out: Optional[str | os.PathLike] = None,
                        overwrite: bool = False) -> dict[str, Any]:
    """COCO box and mask AP of a detection checkpoint on a validation split (:func:`val_dataset`) of ``data``
    (default: the data it was trained on), as one process or under torchrun; with ``visualize`` N, the first
    N images' detections drawn into ``out`` (default: ``visualize/`` beside the checkpoint; pictures already
    there moved aside only with ``overwrite``, never onto an image of the data). Returns what was
    evaluated and the metrics of :data:`METRIC_NAMES` rounded to 4 places (None where nothing is scored)."""
    for flag, value, least in (("--batch-size", batch_size, 1), ("--workers", workers, 0),
                               ("--visualize", visualize, 0)):
        if value < least:
            raise ConfigError(f"{flag} must be at least {least}, got {value}")
    drawn = Path(out) if out else Path(checkpoint).resolve().parent / "visualize"
    if visualize:
        check_writable_folder(drawn, "--out")  # before the work, not after it
    dist_info = init_distributed(device)
    try:
        loaded = load_model(checkpoint, task="detection", use_ema=use_ema, device=dist_info.device)
        meta = loaded.meta
        dataset = val_dataset(data or meta["data"], split, (loaded.checkpoint.get("config") or {}).get("val_split"))
        if len(dataset.category_ids) > meta["num_classes"]:
            raise CheckpointError(f"{checkpoint} knows {meta['num_classes']} categories and {dataset.annotation_file} "
                                  f"declares {len(dataset.category_ids)}; evaluate on the data it was trained on")
        category_ids = matched_categories(dataset, meta["classes"], checkpoint) if "classes" in meta else None
        if visualize and dist_info.is_main:  # before the work
            claim_outputs(visualization_paths(dataset, drawn, visualize), overwrite, "weightformer det eval --visualize",
                          inputs=[dataset.image_dir / dataset.coco.imgs[i]["file_name"] for i in dataset.image_ids])
        sampler = ResumableSampler(len(dataset), dist_info.world_size, dist_info.rank, shuffle=False, pad=False)
        loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=workers, collate_fn=collate,
                            pin_memory=dist_info.device.type == "cuda")
        metrics = evaluate(loaded.model, loader, dataset, dist_info.device, dist_info, category_ids)
        result: dict[str, Any] = {"checkpoint": str(checkpoint), "data": data or meta["data"], "split": dataset.split,
                                  "ema": use_ema, "images": int(metrics["num_images"])}
        result.update({name: None if math.isnan(metrics[name]) else round(metrics[name], 4) for name in METRIC_NAMES})
        result.update({key: metrics[key] for key in PER_CATEGORY})
        if visualize and dist_info.is_main:
            paths = save_visualizations(loaded.model, dataset, drawn, visualize, ["__background__", *meta["classes"]],
                                        dist_info.device)
            result["visualized"] = {"images": len(paths), "folder": str(drawn)}
        return result
    finally:
        shutdown_distributed(dist_info)


def format_eval(result: Mapping[str, Any]) -> str:
    """The text report of :func:`evaluate_checkpoint`: the metrics on one line."""
    metrics = ", ".join(f"{name} {'n/a' if result[name] is None else format(result[name], '.2f')}"
                        for name in METRIC_NAMES)
    lines = [f"{metrics} ({result['images']} images of {result['split']})"]
    for key in PER_CATEGORY:
        if result.get(key):
            aps = ", ".join(f"{name} {'n/a' if ap is None else format(ap, '.2f')}" for name, ap in result[key].items())
            lines.append(f"{key.split('_')[0]} AP per category: {aps}")
    return "\n".join(lines)
