"""Mask R-CNN and Cascade Mask R-CNN on a small stand-in pyramid."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from detection_stand_ins import FakePyramid
from weightformer.detection import CascadeRoIHeads, build_maskrcnn
from weightformer.detection.cascade import STAGE_IOU_THRESHOLDS, STAGE_REG_WEIGHTS

SIZE = 96


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_model(cascade: bool, num_classes: int = 3, protocol: str = "vitdet") -> nn.Module:
    torch.manual_seed(0)
    return build_maskrcnn(FakePyramid(), num_classes, cascade=cascade, protocol=protocol, min_size=SIZE, max_size=SIZE,
                          conv_dim=16,
                          fc_dim=32, rpn_pre_nms_top_n_train=200, rpn_post_nms_top_n_train=64,
                          rpn_pre_nms_top_n_test=100, rpn_post_nms_top_n_test=32, box_batch_size_per_image=32)


def square_sample(x0: int, y0: int, side: int, label: int = 1, width: int = SIZE, height: int = SIZE):
    """A dark image with one bright square, and its target."""
    image = torch.full((3, height, width), 0.1)
    image[:, y0:y0 + side, x0:x0 + side] = 0.9
    masks = torch.zeros((1, height, width), dtype=torch.uint8)
    masks[0, y0:y0 + side, x0:x0 + side] = 1
    target = {"boxes": torch.tensor([[x0, y0, x0 + side, y0 + side]], dtype=torch.float32),
              "labels": torch.tensor([label]), "masks": masks}
    return image, target


@pytest.mark.parametrize("cascade", [False, True])
def test_train_mode_returns_finite_losses_that_reach_the_backbone(cascade):
    model = tiny_model(cascade).train()
    batch = [square_sample(20, 30, 40), square_sample(8, 8, 24, label=2, height=64)]
    negative = (torch.full((3, SIZE, SIZE), 0.1), {"boxes": torch.zeros((0, 4)), "labels": torch.zeros(0, dtype=torch.int64),
                                                  "masks": torch.zeros((0, SIZE, SIZE), dtype=torch.uint8)})
    images, targets = zip(*batch, negative)
    losses = model(list(images), list(targets))
    stages = [f"loss_{kind}_stage{t}" for t in range(3) for kind in ("classifier", "box_reg")]
    box_losses = set(stages) if cascade else {"loss_classifier", "loss_box_reg"}
    expected = {"loss_mask", "loss_objectness", "loss_rpn_box_reg"} | box_losses
    assert set(losses) == expected
    assert all(torch.isfinite(v) for v in losses.values())
    sum(losses.values()).backward()
    assert model.backbone.stem.weight.grad is not None and model.backbone.stem.weight.grad.abs().sum() > 0


def test_cascade_without_any_roi_gives_zero_losses_and_no_detections():
    heads = tiny_model(cascade=True).roi_heads
    features = {k: torch.randn(1, 16, SIZE // s, SIZE // s) for k, s in zip(["0", "1", "2", "3"], [4, 8, 16, 32])}
    empty = {"boxes": torch.zeros((0, 4)), "labels": torch.zeros(0, dtype=torch.int64),
             "masks": torch.zeros((0, SIZE, SIZE), dtype=torch.uint8)}
    _, losses = heads.train()(features, [torch.zeros((0, 4))], [(SIZE, SIZE)], [empty])
    assert all(v.item() == 0 for v in losses.values())
    with torch.no_grad():
        (detections,), _ = heads.eval()(features, [torch.zeros((0, 4))], [(SIZE, SIZE)])
    assert detections["boxes"].shape == (0, 4) and detections["masks"].shape[0] == 0


@pytest.mark.parametrize("cascade", [False, True])
def test_eval_returns_detections_in_each_input_size(cascade):
    model = tiny_model(cascade).eval()
    images = [torch.rand(3, SIZE, SIZE), torch.rand(3, 64, 112)]
    with torch.no_grad():
        detections = model(images)
    for image, det in zip(images, detections):
        n = det["boxes"].shape[0]
        assert n > 0 and det["boxes"].shape == (n, 4) and det["labels"].shape == det["scores"].shape == (n,)
        assert det["masks"].shape == (n, 1, *image.shape[-2:])
        assert det["labels"].min() >= 1 and det["labels"].max() <= 2
        assert (det["boxes"][:, 2] <= image.shape[-1]).all() and (det["boxes"][:, 3] <= image.shape[-2]).all()


def test_cascade_stages_use_their_own_thresholds_weights_and_heads():
    heads = tiny_model(cascade=True).roi_heads
    assert isinstance(heads, CascadeRoIHeads) and len(heads.stages) == 3
    for stage, iou, weights in zip(heads.stages, STAGE_IOU_THRESHOLDS, STAGE_REG_WEIGHTS):
        assert stage.proposal_matcher.high_threshold == stage.proposal_matcher.low_threshold == iou
        assert stage.box_coder.weights == weights
        assert stage.box_predictor.bbox_pred.out_features == 4  # class-agnostic regression
    assert heads.loss_weights == (1.0, 1.0, 1.0)  # ViTDet's (detectron2's CascadeROIHeads): unweighted
    assert (0.5, 0.6, 0.7) == STAGE_IOU_THRESHOLDS
    assert len({id(s.box_head) for s in heads.stages}) == len({id(s.box_predictor) for s in heads.stages}) == 3


def test_torchvision_protocol_cascade_refines_proposals_stage_by_stage_and_resamples(monkeypatch):
    """Under the torchvision protocol stage t+1 gets stage t's decoded boxes plus the ground truth (and
    resamples them), not the RPN's proposals again. (The vitdet protocol's stages: test_detection_protocol.)"""
    heads = tiny_model(cascade=True, protocol="torchvision").train().roi_heads
    seen = []
    for stage in heads.stages:
        original = stage.select_training_samples

        def record(proposals, targets, original=original):
            seen.append([p.clone() for p in proposals])
            return original(proposals, targets)
        monkeypatch.setattr(stage, "select_training_samples", record)
    _, target = square_sample(20, 30, 40)
    features = {k: torch.randn(1, 16, SIZE // s, SIZE // s) for k, s in zip(["0", "1", "2", "3"], [4, 8, 16, 32])}
    proposals = [torch.tensor([[10.0, 10, 60, 60], [22, 28, 58, 72], [0, 0, 30, 30]])]
    heads(features, proposals, [(SIZE, SIZE)], [target])
    assert torch.equal(seen[0][0], proposals[0])
    # stage 1 sees the 3 proposals + the ground truth that stage 0 sampled, each moved by stage 0's deltas
    sampled = torch.cat([proposals[0], target["boxes"]])
    assert seen[1][0].shape == (4, 4) and not torch.equal(seen[1][0], sampled)
    assert torch.allclose(seen[1][0], sampled, atol=2.0)  # the predictors start near zero deltas
    assert seen[2][0].shape == (5, 4)  # and stage 2 those 4 again, plus the ground truth appended once more


def test_cascade_rejects_single_stage_iou_options():
    with pytest.raises(ValueError, match="box_fg_iou_thresh"):
        build_maskrcnn(FakePyramid(), 3, cascade=True, box_fg_iou_thresh=0.6)
    with pytest.raises(ValueError, match="out_channels"):
        build_maskrcnn(nn.Identity(), 3)


@pytest.mark.parametrize("cascade", [False, True])
def test_overfits_a_bright_square(cascade):
    model = tiny_model(cascade, num_classes=2).train()
    images, targets = zip(square_sample(20, 30, 40), square_sample(50, 10, 32))
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    history = []
    for _ in range(20):
        loss = sum(model(list(images), list(targets)).values())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.append(loss.item())
    assert sum(history[-3:]) / 3 < 0.6 * sum(history[:3]) / 3, history


def test_a_timm_name_builds_weightformer_behind_the_simple_feature_pyramid():
    model = build_maskrcnn("weightformer_tiny", 3, cascade=True, min_size=64, max_size=64, conv_dim=16, fc_dim=32,
                           rpn_pre_nms_top_n_test=50, rpn_post_nms_top_n_test=16).eval()
    assert type(model.backbone).__name__ == "SimpleFeaturePyramid" and model.backbone.out_channels == 16
    with torch.no_grad():
        (detections,) = model([torch.rand(3, 64, 80)])
    assert detections["masks"].shape[1:] == (1, 64, 80)


def test_cascade_inference_averages_stage_scores_and_keeps_the_last_stage_boxes():
    heads = tiny_model(cascade=True).eval().roi_heads
    foreground = (0.3, 0.6, 0.9)  # each stage's probability of class 1; class 2 gets none
    with torch.no_grad():
        for stage, p in zip(heads.stages, foreground):
            predictor = stage.box_predictor
            predictor.cls_score.weight.zero_()
            predictor.cls_score.bias.copy_(torch.tensor([1 - p, p, 1e-9]).log())
            predictor.bbox_pred.weight.zero_()
            predictor.bbox_pred.bias.zero_()
        heads.stages[0].box_predictor.bbox_pred.bias[1] = 1.0  # dy = 1 / 10 of the height: +4 px on a 40 px box
        heads.stages[2].box_predictor.bbox_pred.bias[0] = 3.0  # dx = 3 / 30 of the width: +4 px, on stage 0's box
    features = {k: torch.randn(1, 16, SIZE // s, SIZE // s) for k, s in zip(["0", "1", "2", "3"], [4, 8, 16, 32])}
    with torch.no_grad():
        (detections,), _ = heads(features, [torch.tensor([[20.0, 20.0, 60.0, 60.0]])], [(SIZE, SIZE)])
    assert detections["labels"].tolist() == [1]
    assert detections["scores"].item() == pytest.approx(sum(foreground) / 3, abs=1e-5)
    assert torch.allclose(detections["boxes"], torch.tensor([[24.0, 24.0, 64.0, 64.0]]), atol=1e-4)
