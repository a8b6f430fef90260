"""Detections drawn on images."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image
from torch import nn
from torchvision.transforms.functional import to_pil_image

from weightformer.detection import CocoDetection, draw_detections, save_visualizations

from test_detection_data import write_coco


def prediction(score: float = 0.9):
    masks = torch.zeros((1, 1, 48, 64))
    masks[0, 0, 20:40, 30:50] = 1.0
    return {"boxes": torch.tensor([[4.0, 6.0, 40.0, 30.0]]), "labels": torch.tensor([1]),
            "scores": torch.tensor([score]), "masks": masks}


def test_draw_detections_marks_boxes_and_masks(tmp_path):
    image = torch.full((3, 48, 64), 0.5)
    drawn = draw_detections(image, prediction(), ["__background__", "square"], score_threshold=0.5)
    path = tmp_path / "drawn.png"
    drawn.save(path)
    pixels = np.asarray(Image.open(path).convert("RGB")).astype(int)
    assert pixels.shape == (48, 64, 3)
    plain = round(0.5 * 255)
    assert (pixels[6, 20] != plain).any()  # on the box's top edge
    assert (pixels[30, 45] != plain).any()  # inside the mask, outside the box
    assert (pixels[45, 2] == plain).all()  # far from both


def test_low_scores_are_not_drawn():
    image = torch.full((3, 48, 64), 0.5)
    drawn = np.asarray(draw_detections(image, prediction(score=0.2), ["__background__", "square"], score_threshold=0.5))
    assert (drawn == round(0.5 * 255)).all()


class FixedDetector(nn.Module):
    """Image 1 (48 x 64) gets the square; any other image a detection below the threshold."""

    def forward(self, images):
        return [prediction() if image.shape[-2:] == (48, 64)
                else dict(prediction(0.0), masks=torch.zeros((1, 1, *image.shape[-2:]))) for image in images]


def test_save_visualizations_writes_one_png_per_image(tmp_path):
    write_coco(tmp_path / "coco")
    dataset = CocoDetection(tmp_path / "coco", "val")
    model = FixedDetector().train()
    paths = save_visualizations(model, dataset, tmp_path / "vis", 2, dataset.class_names, torch.device("cpu"))
    assert model.training  # the mode is put back
    assert [p.name for p in paths] == ["1.png", "2.png"]
    assert Image.open(paths[0]).size == (64, 48) and Image.open(paths[1]).size == (40, 56)
    assert not (np.asarray(Image.open(paths[0])) == np.asarray(to_pil_image(dataset[0][0]))).all()
