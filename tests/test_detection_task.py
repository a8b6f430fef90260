"""The engine's entry points: a batch's training loss and COCO metrics over a loader."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import DataLoader

from weightformer.detection import METRIC_NAMES, CocoDetection, collate, evaluate, training_loss

from test_detection_data import write_coco
from test_detection_model import tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")


def test_training_loss_and_evaluate_on_a_coco_tree(tmp_path):
    write_coco(tmp_path)
    dataset = CocoDetection(tmp_path, "val")
    loader = DataLoader(dataset, batch_size=2, collate_fn=collate)
    model = tiny_model(cascade=True, num_classes=dataset.num_classes).train()
    images, targets = next(iter(loader))
    targets[0]["iscrowd"] = torch.tensor([0, 1])  # a crowd region is left out of the loss
    loss, parts = training_loss(model, (images, targets), torch.device("cpu"))
    assert loss.requires_grad and math.isfinite(loss.item()) and "loss_mask" in parts
    assert torch.isclose(loss.detach(), sum(parts.values()))
    metrics = evaluate(model, loader, dataset, torch.device("cpu"))
    assert model.training  # evaluate puts the mode back
    assert metrics["num_images"] == 3
    assert all(0.0 <= metrics[name] <= 100.0 for name in METRIC_NAMES)
