"""Cascade R-CNN box heads (Cai & Vasconcelos, 2018) on torchvision's RoI heads, with one mask head; and
the box losses and the mask-training step both detectors share.

Stage t is a box-only torchvision :class:`RoIHeads` with its own IoU threshold, coder weights, box head and
class-agnostic predictor, fed the refined, detached boxes of stage t-1. Inference averages the stages'
softmax scores on the last stage's boxes, then runs the mask head on them; the mask head trains on stage 1's
positives (detectron2's ``CascadeROIHeads``). Training is set by :mod:`.model` from the detector's protocol
(vitdet: detectron2's; torchvision: torchvision's parts with mmdet's stage weights):

- ``loss_weights``: each stage's loss factor (vitdet 1, 1, 1; torchvision 1, 0.5, 0.25);
- ``head_gradient_scale``: the factor on the gradient each box head sends back to the pooled features
  (vitdet 1/3, detectron2's ``_ScaleGradient``; the head's own parameters get the full gradient);
- ``box_loss_beta``: the smooth-L1 β of the box regression (vitdet 0, plain L1; torchvision 1/9);
- ``sample_later_stages``: whether stages 2 and 3 append the ground truth and resample
  ``batch_size_per_image`` boxes (torchvision) or label every refined box as it is (vitdet).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.models.detection.roi_heads import RoIHeads, maskrcnn_inference, maskrcnn_loss
from torchvision.ops import boxes as box_ops

__all__ = ["STAGE_IOU_THRESHOLDS", "STAGE_REG_WEIGHTS", "AgnosticBoxPredictor", "CascadeRoIHeads", "MaskRCNNRoIHeads",
           "box_loss"]

STAGE_IOU_THRESHOLDS = (0.5, 0.6, 0.7)
STAGE_REG_WEIGHTS = ((10.0, 10.0, 5.0, 5.0), (20.0, 20.0, 10.0, 10.0), (30.0, 30.0, 15.0, 15.0))


class _ScaleGradient(torch.autograd.Function):
    """Identity forward; the backward multiplies the incoming gradient by ``scale`` (detectron2's)."""

    @staticmethod
    def forward(ctx, x: Tensor, scale: float) -> Tensor:  # type: ignore[override]
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        return grad * ctx.scale, None


class AgnosticBoxPredictor(nn.Module):
    """Class scores (background at 0) and one class-agnostic box delta per RoI."""

    def __init__(self, in_features: int, num_classes: int):
        super().__init__()
        self.cls_score = nn.Linear(in_features, num_classes)
        self.bbox_pred = nn.Linear(in_features, 4)
        # detectron2's init: small logits and near-zero deltas, so every stage starts from its input boxes
        nn.init.normal_(self.cls_score.weight, std=0.01)
        nn.init.normal_(self.bbox_pred.weight, std=0.001)
        nn.init.zeros_(self.cls_score.bias)
        nn.init.zeros_(self.bbox_pred.bias)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        x = x.flatten(1)  # (R, D)
        return self.cls_score(x), self.bbox_pred(x)  # (R, num_classes), (R, 4)


def box_loss(class_logits: Tensor, box_deltas: Tensor, labels: list[Tensor], regression_targets: list[Tensor],
             beta: float) -> tuple[Tensor, Tensor]:
    """The Fast R-CNN loss of sampled RoIs: cross-entropy over all, and smooth-L1 (β = ``beta``; 0 is L1) over
    the positives divided by the number of RoIs (torchvision's and detectron2's normalisation).
    ``box_deltas``: (R, 4) class-agnostic, or (R, 4 * num_classes), of which each positive's class is used."""
    labels_all = torch.cat(labels)  # (R,)
    targets = torch.cat(regression_targets)  # (R, 4)
    if labels_all.numel() == 0:  # no RoI left in the batch: zero losses that keep the graph, not NaN means
        return class_logits.sum() * 0, box_deltas.sum() * 0
    classification = F.cross_entropy(class_logits, labels_all)
    positive = torch.where(labels_all > 0)[0]
    deltas = box_deltas.reshape(len(box_deltas), -1, 4)  # (R, 1 or num_classes, 4)
    deltas = deltas[positive, labels_all[positive] if deltas.shape[1] > 1 else 0]  # (P, 4)
    box_reg = F.smooth_l1_loss(deltas, targets[positive], beta=beta, reduction="sum")
    return classification, box_reg / labels_all.numel()


def _mask_loss(heads: nn.Module, features: dict[str, Tensor], proposals: list[Tensor], matched_idxs: list[Tensor],
               labels: list[Tensor], image_shapes: list[tuple[int, int]], targets: list[dict[str, Tensor]]) -> Tensor:
    """torchvision's Mask R-CNN mask loss on the positives among the sampled ``proposals``."""
    positive = [torch.where(lab > 0)[0] for lab in labels]
    mask_proposals = [p[i] for p, i in zip(proposals, positive)]
    mask_logits = heads.mask_predictor(heads.mask_head(heads.mask_roi_pool(features, mask_proposals, image_shapes)))
    return maskrcnn_loss(mask_logits, mask_proposals, [t["masks"] for t in targets], [t["labels"] for t in targets],
                         [m[i] for m, i in zip(matched_idxs, positive)])


class MaskRCNNRoIHeads(RoIHeads):
    """torchvision's Mask R-CNN RoI heads with the box loss's smooth-L1 β an argument (torchvision fixes 1/9;
    detectron2's and ViTDet's Mask R-CNN use 0, plain L1)."""

    def __init__(self, *args, box_loss_beta: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.box_loss_beta = box_loss_beta

    def forward(self, features: dict[str, Tensor], proposals: list[Tensor], image_shapes: list[tuple[int, int]],
                targets: Optional[list[dict[str, Tensor]]] = None) -> tuple[list[dict[str, Tensor]], dict[str, Tensor]]:
        if not self.training:
            return super().forward(features, proposals, image_shapes, targets)
        if targets is None:
            raise ValueError("MaskRCNNRoIHeads needs targets in training mode")
        proposals, matched_idxs, labels, regression_targets = self.select_training_samples(proposals, targets)
        x = self.box_head(self.box_roi_pool(features, proposals, image_shapes))
        class_logits, deltas = self.box_predictor(x)  # (R, num_classes), (R, 4 * num_classes)
        loss_cls, loss_box = box_loss(class_logits, deltas, labels, regression_targets, self.box_loss_beta)
        loss_mask = _mask_loss(self, features, proposals, matched_idxs, labels, image_shapes, targets)
        return [], {"loss_classifier": loss_cls, "loss_box_reg": loss_box, "loss_mask": loss_mask}


class CascadeRoIHeads(nn.Module):
    """Three box stages at rising IoU thresholds, then a mask head; a drop-in for ``RoIHeads``, whose losses
    are ``loss_classifier_stage{t}``, ``loss_box_reg_stage{t}`` (scaled by the stage's loss weight) and
    ``loss_mask``. The training arguments are those of the module docstring."""

    def __init__(self, box_roi_pool: nn.Module, box_heads: Sequence[nn.Module],
                 box_predictors: Sequence[AgnosticBoxPredictor], mask_roi_pool: nn.Module, mask_head: nn.Module,
                 mask_predictor: nn.Module, *, loss_weights: Sequence[float], head_gradient_scale: float,
                 box_loss_beta: float, sample_later_stages: bool,
                 iou_thresholds: Sequence[float] = STAGE_IOU_THRESHOLDS,
                 reg_weights: Sequence[Sequence[float]] = STAGE_REG_WEIGHTS, batch_size_per_image: int = 512,
                 positive_fraction: float = 0.25, score_thresh: float = 0.05, nms_thresh: float = 0.5,
                 detections_per_img: int = 100):
        super().__init__()
        per_stage = {len(box_heads), len(box_predictors), len(iou_thresholds), len(reg_weights), len(loss_weights)}
        if len(per_stage) != 1:
            raise ValueError(f"every cascade stage needs a box head, predictor, IoU threshold, coder weights "
                             f"and loss weight; got stage counts {sorted(per_stage)}")
        # each stage brings its matcher (fg = bg threshold, no low-quality matches), sampler and box coder
        self.stages = nn.ModuleList(
            RoIHeads(box_roi_pool, head, predictor, iou, iou, batch_size_per_image, positive_fraction,
                     tuple(weights), score_thresh, nms_thresh, detections_per_img)
            for head, predictor, iou, weights in zip(box_heads, box_predictors, iou_thresholds, reg_weights)
        )
        self.loss_weights = tuple(float(w) for w in loss_weights)
        self.head_gradient_scale, self.box_loss_beta = float(head_gradient_scale), float(box_loss_beta)
        self.sample_later_stages = sample_later_stages
        self.score_thresh, self.nms_thresh, self.detections_per_img = score_thresh, nms_thresh, detections_per_img
        self.mask_roi_pool, self.mask_head, self.mask_predictor = mask_roi_pool, mask_head, mask_predictor

    def _run_stage(self, t: int, features: dict[str, Tensor], proposals: list[Tensor],
                   image_shapes: list[tuple[int, int]]) -> tuple[Tensor, Tensor, list[Tensor]]:
        """Class logits (R, C), deltas (R, 4) and refined boxes (one (R_i, 4) per image) of stage t."""
        stage = self.stages[t]
        pooled = stage.box_roi_pool(features, proposals, image_shapes)  # (R, channels, 7, 7)
        if self.training and self.head_gradient_scale != 1.0:
            pooled = _ScaleGradient.apply(pooled, self.head_gradient_scale)
        class_logits, deltas = stage.box_predictor(stage.box_head(pooled))
        boxes = stage.box_coder.decode(deltas.detach(), proposals).reshape(-1, 4)  # (R, 4)
        refined = [box_ops.clip_boxes_to_image(b, shape)
                   for b, shape in zip(boxes.split([len(p) for p in proposals]), image_shapes)]
        return class_logits, deltas, refined

    @staticmethod
    def _label_boxes(stage: RoIHeads, proposals: list[Tensor],
                     targets: list[dict[str, Tensor]]) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
        """Matched ground-truth indices, labels (0: background) and regression targets of every box in
        ``proposals``, unsampled (detectron2's ``CascadeROIHeads._match_and_label_boxes``)."""
        gt_boxes = [t["boxes"].to(p.dtype) for t, p in zip(targets, proposals)]
        matched_idxs, labels = stage.assign_targets_to_proposals(proposals, gt_boxes, [t["labels"] for t in targets])
        # an image without objects matches everything to one zero box, as select_training_samples does
        matched_gt = [(g if len(g) else g.new_zeros(1, 4))[m] for g, m in zip(gt_boxes, matched_idxs)]
        return matched_idxs, labels, list(stage.box_coder.encode(matched_gt, proposals))

    def forward(self, features: dict[str, Tensor], proposals: list[Tensor], image_shapes: list[tuple[int, int]],
                targets: Optional[list[dict[str, Tensor]]] = None) -> tuple[list[dict[str, Tensor]], dict[str, Tensor]]:
        if not self.training:
            return self._detect(features, proposals, image_shapes), {}
        if targets is None:
            raise ValueError("CascadeRoIHeads needs targets in training mode")
        losses: dict[str, Tensor] = {}
        for t, stage in enumerate(self.stages):
            if t > 0:  # the previous stage's boxes, without the empty ones degenerate deltas can make
                proposals = [p[box_ops.remove_small_boxes(p, 1e-3)] for p in refined]
            if t == 0 or self.sample_later_stages:
                proposals, matched_idxs, labels, regression_targets = stage.select_training_samples(proposals, targets)
            else:
                matched_idxs, labels, regression_targets = self._label_boxes(stage, proposals, targets)
            if t == 0:
                mask_samples = (proposals, matched_idxs, labels)
            class_logits, deltas, refined = self._run_stage(t, features, proposals, image_shapes)
            loss_cls, loss_box = box_loss(class_logits, deltas, labels, regression_targets, self.box_loss_beta)
            losses[f"loss_classifier_stage{t}"] = self.loss_weights[t] * loss_cls
            losses[f"loss_box_reg_stage{t}"] = self.loss_weights[t] * loss_box
        losses["loss_mask"] = _mask_loss(self, features, *mask_samples, image_shapes, targets)
        return [], losses

    def _detect(self, features: dict[str, Tensor], proposals: list[Tensor],
                image_shapes: list[tuple[int, int]]) -> list[dict[str, Tensor]]:
        stage_scores = []
        for t in range(len(self.stages)):
            class_logits, _, refined = self._run_stage(t, features, proposals, image_shapes)
            stage_scores.append(F.softmax(class_logits, -1))
            if t < len(self.stages) - 1:
                proposals = refined
        scores = torch.stack(stage_scores).mean(0)  # (R, C): the ensemble of all stages
        detections = [self._postprocess(b, s) for b, s in zip(refined, scores.split([len(b) for b in refined]))]
        boxes = [d["boxes"] for d in detections]
        mask_logits = self.mask_predictor(self.mask_head(self.mask_roi_pool(features, boxes, image_shapes)))
        for d, mask_prob in zip(detections, maskrcnn_inference(mask_logits, [d["labels"] for d in detections])):
            d["masks"] = mask_prob  # (N, 1, 28, 28); GeneralizedRCNNTransform pastes them into the image
        return detections

    def _postprocess(self, boxes: Tensor, scores: Tensor) -> dict[str, Tensor]:
        """Per-class score threshold and NMS of one image's (R, 4) boxes and (R, C) scores."""
        num_fg = scores.shape[1] - 1
        labels = torch.arange(1, num_fg + 1, device=scores.device).expand(len(boxes), num_fg).reshape(-1)
        boxes = boxes[:, None].expand(-1, num_fg, 4).reshape(-1, 4)  # every foreground class of every RoI
        scores = scores[:, 1:].reshape(-1)
        keep = torch.where(scores > self.score_thresh)[0]
        boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
        keep = box_ops.remove_small_boxes(boxes, min_size=1e-2)
        boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
        keep = box_ops.batched_nms(boxes, scores, labels, self.nms_thresh)[: self.detections_per_img]
        return {"boxes": boxes[keep], "labels": labels[keep], "scores": scores[keep]}
