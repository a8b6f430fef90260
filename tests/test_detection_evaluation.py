"""COCO AP through pycocotools: perfect, shifted and missing detections; merging ranks."""

from __future__ import annotations

import math

import pytest
import torch

from weightformer.detection import METRIC_NAMES, CocoDetection, CocoEvaluator

from test_detection_data import write_coco


@pytest.fixture()
def dataset(tmp_path):
    write_coco(tmp_path)
    return CocoDetection(tmp_path, "val")


def ground_truth_as_predictions(dataset, shift: float = 0.0):
    """Each image's id and its annotations as detections of score 1, boxes and masks moved right by ``shift``."""
    ids, predictions = [], []
    for index in range(len(dataset)):
        _, target = dataset[index]
        masks = torch.roll(target["masks"], int(shift), dims=-1)[:, None].float()  # (N, 1, H, W) probabilities
        predictions.append({"boxes": target["boxes"] + torch.tensor([shift, 0, shift, 0]), "labels": target["labels"],
                            "scores": torch.ones(len(target["labels"])), "masks": masks})
        ids.append(target["image_id"])
    return ids, predictions


def test_perfect_predictions_score_100(dataset):
    evaluator = CocoEvaluator(dataset.coco, dataset.category_ids)
    evaluator.update(*ground_truth_as_predictions(dataset))
    metrics = evaluator.compute()
    assert set(METRIC_NAMES) <= set(metrics) and metrics["num_images"] == 3
    for name in METRIC_NAMES:
        assert metrics[name] == pytest.approx(100.0), name


def test_shifted_predictions_score_lower(dataset):
    evaluator = CocoEvaluator(dataset.coco, dataset.category_ids)
    evaluator.update(*ground_truth_as_predictions(dataset, shift=5.0))
    metrics = evaluator.compute()
    # the 12x10 square shifted by 5 px has IoU 7/17 < 0.5: missed at every threshold; the others survive at 0.5
    assert 0 < metrics["bbox_mAP"] < metrics["bbox_mAP_50"] < 100
    assert 0 < metrics["segm_mAP"] < 100 and metrics["bbox_mAP_75"] < metrics["bbox_mAP_50"]


def test_no_detections_score_zero_and_no_ground_truth_is_nan(dataset):
    empty = {"boxes": torch.zeros((0, 4)), "labels": torch.zeros(0, dtype=torch.int64), "scores": torch.zeros(0),
             "masks": torch.zeros((0, 1, 48, 64))}
    evaluator = CocoEvaluator(dataset.coco, dataset.category_ids)
    evaluator.update([1], [empty])
    assert evaluator.compute()["bbox_mAP"] == 0.0
    negative_only = CocoEvaluator(dataset.coco, dataset.category_ids)
    negative_only.update([2], [dict(empty, masks=torch.zeros((0, 1, 56, 40)))])
    assert math.isnan(negative_only.compute()["segm_mAP"])


def test_each_category_ap_is_cocoevals_summary_of_that_category_alone(dataset):
    """Per-category AP (what det eval prints under the means) against pycocotools run on one category at a time;
    their mean is the mAP, and a category missed entirely scores 0, not the mean of the others."""
    import contextlib
    import io

    from pycocotools.cocoeval import COCOeval

    ids, predictions = ground_truth_as_predictions(dataset, shift=3.0)
    evaluator = CocoEvaluator(dataset.coco, dataset.category_ids)
    evaluator.update(ids, predictions)
    metrics = evaluator.compute()
    records = [r for image in evaluator.detections.values() for r in image]
    for iou_type in ("bbox", "segm"):
        dropped = "segmentation" if iou_type == "bbox" else "bbox"
        for category in dataset.coco.loadCats(dataset.coco.getCatIds()):
            with contextlib.redirect_stdout(io.StringIO()):
                alone = COCOeval(dataset.coco, dataset.coco.loadRes([{k: v for k, v in r.items() if k != dropped}
                                                                     for r in records]), iou_type)
                alone.params.catIds, alone.params.imgIds = [category["id"]], sorted(evaluator.detections)
                alone.evaluate(), alone.accumulate(), alone.summarize()
            assert evaluator.per_category[iou_type][category["name"]] == pytest.approx(100 * alone.stats[0], abs=1e-3)
        per_category = evaluator.per_category[iou_type].values()
        assert sum(per_category) / len(per_category) == pytest.approx(metrics[f"{iou_type}_mAP"], abs=1e-3)
    squares_only = [{k: v[p["labels"] == 1] for k, v in p.items()} for p in predictions]  # label 1 is category 3
    evaluator = CocoEvaluator(dataset.coco, dataset.category_ids)
    evaluator.update(ids, squares_only)
    evaluator.compute()
    assert evaluator.per_category["bbox"]["block"] == 0.0 and evaluator.per_category["bbox"]["square"] > 0


def test_merging_rank_shards_equals_one_process(dataset):
    ids, predictions = ground_truth_as_predictions(dataset, shift=3.0)
    whole = CocoEvaluator(dataset.coco, dataset.category_ids)
    whole.update(ids, predictions)
    ranks = [CocoEvaluator(dataset.coco, dataset.category_ids) for _ in range(2)]
    ranks[0].update(ids[:2], predictions[:2])
    ranks[1].update(ids[1:], predictions[1:])  # image 2 on both ranks, as a padded DistributedSampler repeats one
    merged = CocoEvaluator(dataset.coco, dataset.category_ids)
    merged.merge([r.detections for r in ranks])
    assert merged.compute() == whole.compute()


def test_update_leaves_the_predictions_as_they_were(dataset):
    ids, predictions = ground_truth_as_predictions(dataset)
    before = [p["boxes"].clone() for p in predictions]
    CocoEvaluator(dataset.coco, dataset.category_ids).update(ids, predictions)
    assert all(torch.equal(b, p["boxes"]) for b, p in zip(before, predictions))
