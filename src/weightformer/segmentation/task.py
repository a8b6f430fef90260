"""The segmentation task for a training loop: the loss of a batch and the metrics of a split.

The loss is mmseg's: pixel-wise cross-entropy averaged over all pixels of the batch (ignored ones
add zero), plus ``aux_weight`` times the same loss on the auxiliary head's logits. Evaluation
predicts each image on its own, at its own size (so the batch size and padding do not change the
numbers), resizes the logits to the annotation's original size, and scores the argmax with
:class:`SegmentationMetric` over the whole split and all ranks.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader

from .data import IGNORE_INDEX, SegmentationBatch
from .inference import slide_inference, whole_inference
from .metrics import SegmentationMetric

__all__ = ["INFERENCE_MODES", "evaluate", "training_loss"]

INFERENCE_MODES = ("whole", "slide")


def _cross_entropy(logits: Tensor, labels: Tensor) -> Tensor:
    # mean over every pixel, ignored ones included (mmseg's avg_non_ignore=False): never NaN on an all-ignored crop
    return F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX, reduction="none").mean()


def training_loss(
    model: nn.Module, batch: SegmentationBatch, device: torch.device, aux_weight: float = 0.4
) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss of a batch (main cross-entropy plus ``aux_weight`` times the auxiliary one, if the model
    has that head) and each detached term to log: ``decode`` and ``aux``. ``model`` is an
    :class:`~weightformer.models.upernet.UperNet`, possibly wrapped in DistributedDataParallel."""
    images = batch.images.to(device, non_blocking=True)
    labels = batch.labels.to(device, non_blocking=True)
    logits, aux_logits = model(images, with_aux=True)  # (B, K, H, W) each; model may be DDP-wrapped
    terms = {"decode": _cross_entropy(logits, labels)}
    if aux_logits is not None:
        terms["aux"] = aux_weight * _cross_entropy(aux_logits, labels)
    return sum(terms.values()), {name: term.detach() for name, term in terms.items()}


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    loader: DataLoader,
    num_classes: int,
    device: torch.device,
    mode: str = "whole",
    crop: int = 512,
    stride: int = 341,
    amp_dtype: Optional[torch.dtype] = None,
) -> dict[str, object]:
    """``mIoU``, ``mAcc``, ``aAcc`` (percent) and ``per_class_iou`` of ``model`` on ``loader``'s batches.

    ``loader`` yields :class:`SegmentationBatch` (``collate_segmentation``) of eval-transformed
    samples. ``mode`` is "whole" or "slide" (``crop`` windows every ``stride`` pixels). Under
    torch.distributed each rank scores its shard and the areas are summed, so every rank returns
    the numbers of the whole split.
    """
    if mode not in INFERENCE_MODES:
        raise ValueError(f"inference mode {mode!r} is not one of {', '.join(INFERENCE_MODES)}")
    was_training = model.training
    model.eval()
    metric = SegmentationMetric(num_classes, IGNORE_INDEX, device=device)
    autocast = torch.autocast(device.type, dtype=amp_dtype) if amp_dtype is not None else nullcontext()
    for batch in loader:
        for image, label, (h, w), (label_h, label_w) in zip(*batch):
            image = image[None, :, :h, :w].to(device, non_blocking=True)  # (1, 3, h, w) without the padding
            with autocast:
                if mode == "whole":
                    logits = whole_inference(model, image)
                else:
                    logits = slide_inference(model, image, crop, stride)  # (1, K, h, w)
            logits = F.interpolate(logits, size=(int(label_h), int(label_w)), mode="bilinear", align_corners=False)
            metric.update(logits.argmax(1), label[None, :label_h, :label_w].to(device))
    metric.all_reduce()
    model.train(was_training)
    return metric.compute()
