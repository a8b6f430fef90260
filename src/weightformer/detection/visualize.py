"""Predicted boxes and masks drawn on images, for ``--visualize N``."""

from __future__ import annotations

import colorsys
from pathlib import Path
from typing import Mapping, Sequence

import torch
from PIL import Image
from torch import Tensor, nn
from torch.utils.data import Dataset
from torchvision.transforms.functional import to_pil_image
from torchvision.utils import draw_bounding_boxes, draw_segmentation_masks

from ..atomic import write_atomic

__all__ = ["draw_detections", "save_visualizations", "visualization_paths"]


def _color(label: int) -> tuple[int, int, int]:
    """A fixed, saturated colour per class: hues spaced by the golden ratio."""
    r, g, b = colorsys.hsv_to_rgb((label * 0.618033988749895) % 1.0, 0.85, 1.0)
    return int(255 * r), int(255 * g), int(255 * b)


def draw_detections(image: Tensor, prediction: Mapping[str, Tensor], class_names: Sequence[str],
                    score_threshold: float = 0.5, mask_threshold: float = 0.5) -> Image.Image:
    """``image`` (3, H, W; float in [0, 1] or uint8) with the detections scoring at least ``score_threshold``:
    masks (above ``mask_threshold``) shaded, boxes outlined and labelled "name score" (``class_names[label]``)."""
    canvas = (image if image.dtype == torch.uint8 else (image.clamp(0, 1) * 255).round().to(torch.uint8)).cpu()
    prediction = {k: v.detach().cpu() for k, v in prediction.items()}
    keep = prediction["scores"] >= score_threshold
    labels = prediction["labels"][keep].tolist()
    colors = [_color(label) for label in labels]
    if not labels:
        return to_pil_image(canvas)
    if "masks" in prediction:
        canvas = draw_segmentation_masks(canvas, prediction["masks"][keep][:, 0] > mask_threshold, alpha=0.45,
                                         colors=colors)
    captions = [f"{class_names[label]} {score:.2f}"
                for label, score in zip(labels, prediction["scores"][keep].tolist())]
    return to_pil_image(draw_bounding_boxes(canvas, prediction["boxes"][keep], labels=captions, colors=colors, width=2))


@torch.no_grad()
def save_visualizations(model: nn.Module, dataset: Dataset, out_dir: str | Path, count: int,
                        class_names: Sequence[str], device: torch.device, score_threshold: float = 0.5) -> list[Path]:
    """``model``'s detections on the first ``count`` images of ``dataset``, drawn into
    ``<out_dir>/<image_id>.png``; returns the paths written."""
    was_training = model.training
    model.eval()
    paths = visualization_paths(dataset, Path(out_dir), count)
    for index, path in enumerate(paths):
        image, _ = dataset[index]
        prediction = model([image.to(device)])[0]
        picture = draw_detections(image, prediction, class_names, score_threshold)
        write_atomic(path, lambda f: picture.save(f, format="PNG"))
    model.train(was_training)
    return paths


def visualization_paths(dataset: Dataset, out_dir: Path, count: int) -> list[Path]:
    """Where :func:`save_visualizations` draws the first ``count`` images of ``dataset``: ``<image_id>.png``."""
    return [out_dir / f"{image_id}.png" for image_id in dataset.image_ids[:count]]
