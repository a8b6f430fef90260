"""Segmentation metrics: mmseg's mIoU/mAcc/aAcc, accumulated over a split and summed over ranks."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from weightformer.segmentation import SegmentationMetric


def confusion_metrics(preds: list[np.ndarray], targets: list[np.ndarray], k: int, ignore: int = 255) -> dict:
    """An independent computation: one k x k confusion matrix over every labelled pixel, read as mmseg does."""
    confusion = np.zeros((k, k), dtype=np.int64)  # rows: label, columns: prediction
    for pred, target in zip(preds, targets):
        keep = target != ignore
        np.add.at(confusion, (target[keep], pred[keep]), 1)
    hits = np.diag(confusion).astype(float)
    labelled, predicted = confusion.sum(1), confusion.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = hits / (labelled + predicted - hits)
        acc = hits / labelled
    return {"mIoU": 100 * np.nanmean(iou), "mAcc": 100 * np.nanmean(acc), "aAcc": 100 * hits.sum() / labelled.sum(),
            "iou": 100 * iou}


def test_metric_matches_a_confusion_matrix_over_the_split():
    k = 6
    rng = np.random.default_rng(0)
    preds, targets = [], []
    metric = SegmentationMetric(k)
    for shape in ((2, 9, 11), (3, 5, 7)):  # two batches of different sizes
        target = rng.integers(0, k - 1, size=shape)  # class 5 never labelled ...
        pred = np.where(rng.random(shape) < 0.6, target, rng.integers(0, k - 2, size=shape))  # ... nor predicted
        target[rng.random(shape) < 0.2] = 255
        pred[0, 0, 0], target[0, 0, 0] = 3, 4  # class 3 predicted where 4 is labelled: a miss for both
        metric.update(torch.from_numpy(pred), torch.from_numpy(target))
        preds.extend(pred), targets.extend(target)
    result, expected = metric.compute(), confusion_metrics(preds, targets, k)
    for key in ("mIoU", "mAcc", "aAcc"):
        assert result[key] == pytest.approx(expected[key], rel=1e-12)
    np.testing.assert_allclose(result["per_class_iou"], expected["iou"], rtol=1e-12)
    assert math.isnan(result["per_class_iou"][5])  # never labelled nor predicted: left out of the mean


def test_class_predicted_but_never_labelled_counts_as_zero_iou():
    metric = SegmentationMetric(3)
    metric.update(torch.tensor([[0, 0, 2, 2]]), torch.tensor([[0, 0, 1, 1]]))
    result = metric.compute()
    # IoU: class 0 = 1, class 1 = 0, class 2 = 0 (predicted, never labelled: union > 0); Acc: class 2 has no label
    assert result["mIoU"] == pytest.approx(100 / 3)
    assert result["mAcc"] == pytest.approx(50.0)
    assert result["aAcc"] == pytest.approx(50.0)


def test_accumulated_iou_differs_from_the_mean_of_per_image_ious():
    # A large image predicted well and a small one predicted badly.
    big_target = torch.zeros(1, 10, 10, dtype=torch.long)
    big_target[:, :, 5:] = 1
    big_pred = big_target.clone()
    big_pred[:, 0, 5] = 0  # one pixel wrong
    small_target = torch.tensor([[[0, 1], [1, 1]]])
    small_pred = torch.tensor([[[1, 0], [0, 1]]])
    per_image = []
    accumulated = SegmentationMetric(2)
    for pred, target in ((big_pred, big_target), (small_pred, small_target)):
        one = SegmentationMetric(2)
        one.update(pred, target)
        per_image.append(one.compute()["mIoU"])
        accumulated.update(pred, target)
    expected = confusion_metrics([big_pred.numpy(), small_pred.numpy()], [big_target.numpy(), small_target.numpy()], 2)
    assert accumulated.compute()["mIoU"] == pytest.approx(expected["mIoU"])
    assert abs(accumulated.compute()["mIoU"] - np.mean(per_image)) > 10  # 92.6 accumulated vs 55.3 per image


def test_ignored_pixels_do_not_count_and_bad_values_are_named():
    metric = SegmentationMetric(2)
    metric.update(torch.tensor([[1, 0, 1]]), torch.tensor([[1, 255, 255]]))
    assert metric.compute()["aAcc"] == 100.0 and metric.compute()["mIoU"] == 100.0
    with pytest.raises(ValueError, match=r"target holds values \[7\]"):
        metric.update(torch.tensor([[0]]), torch.tensor([[7]]))
    with pytest.raises(ValueError, match=r"pred holds values \[2\]"):
        metric.update(torch.tensor([[2]]), torch.tensor([[0]]))
    metric.reset()
    assert math.isnan(metric.compute()["mIoU"])


SCRIPT = """
import os, sys, torch, torch.distributed as dist
from weightformer.segmentation import SegmentationMetric
dist.init_process_group("gloo")
rank = dist.get_rank()
metric = SegmentationMetric(3)
if rank == 0:
    metric.update(torch.tensor([[0, 1, 1]]), torch.tensor([[0, 1, 2]]))
else:
    metric.update(torch.tensor([[2, 2]]), torch.tensor([[2, 255]]))
metric.all_reduce()
result = metric.compute()
with open(os.path.join(os.environ["RESULTS"], f"rank{rank}.txt"), "w") as f:  # not stdout: ranks' prints interleave
    f.write(f"rank{rank} {result['mIoU']:.6f} {result['aAcc']:.6f}")
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_all_reduce_sums_areas_over_ranks(tmp_path: Path):
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(SCRIPT))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    env = dict(os.environ, OMP_NUM_THREADS="1", RESULTS=str(tmp_path))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    whole = SegmentationMetric(3)
    whole.update(torch.tensor([[0, 1, 1, 2, 2]]), torch.tensor([[0, 1, 2, 2, 255]]))
    expected = whole.compute()
    lines = [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)]
    assert lines == [f"rank{r} {expected['mIoU']:.6f} {expected['aAcc']:.6f}" for r in (0, 1)]
