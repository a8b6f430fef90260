"""The detector's ``vitdet`` protocol, point by point against detectron2 as ViTDet's configs run it
(``projects/ViTDet/configs/COCO/cascade_mask_rcnn_vitdet_b_100ep.py`` on ``configs/common/models/
mask_rcnn_fpn.py``). Each test states the reference's behaviour it checks. The ``torchvision`` protocol
(the legacy checkpoints' detector) is checked where it differs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import MultiScaleRoIAlign, box_iou, roi_align

from detection_stand_ins import FakePyramid
from weightformer.detection import cascade as cascade_module
from weightformer.detection.cascade import STAGE_IOU_THRESHOLDS, MaskRCNNRoIHeads, box_loss
from weightformer.detection import recipes
from weightformer.detection.config import DEFAULT_PROTOCOL, LEGACY_FALLBACK_PROTOCOL, PROTOCOLS, DetectionConfig
from weightformer.detection.model import (
    AlignedMultiScaleRoIAlign, L1RegionProposalNetwork, build_maskrcnn, detection_pyramid,
)
from weightformer.detection.task import DetectionTask, build_detector
from weightformer.engine.cli import build_parser
from weightformer.engine.config import load_config_file, validate_config
from weightformer.models.layer_decay import layer_decay_param_groups
from weightformer.models.pyramid import build_backbone

SIZE = 96
CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "detection"

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(cascade: bool, protocol: str = "vitdet", **kwargs) -> nn.Module:
    torch.manual_seed(0)
    return build_maskrcnn(FakePyramid(), 3, cascade=cascade, protocol=protocol, min_size=SIZE, max_size=SIZE,
                          conv_dim=16, fc_dim=32, **kwargs)


def features(requires_grad: bool = False) -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    return {k: torch.randn(1, 16, SIZE // s, SIZE // s, requires_grad=requires_grad)
            for k, s in zip(["0", "1", "2", "3"], [4, 8, 16, 32])}


def square_target() -> dict[str, torch.Tensor]:
    masks = torch.zeros((1, SIZE, SIZE), dtype=torch.uint8)
    masks[0, 30:70, 20:60] = 1
    return {"boxes": torch.tensor([[20.0, 30, 60, 70]]), "labels": torch.tensor([1]), "masks": masks}


PROPOSALS = [torch.tensor([[10.0, 10, 60, 60], [22, 28, 58, 72], [0, 0, 30, 30], [18, 32, 64, 66]])]


def test_protocol_names_and_defaults():
    """build_maskrcnn's default and a new run's is the reference; the legacy fallback is the detector runs
    were saved with before the setting existed. The COCO-size recipes set vitdet, the from-scratch shapes
    recipes torchvision (measured better there: docs/dense.md)."""
    assert PROTOCOLS == ("vitdet", "torchvision") and DEFAULT_PROTOCOL == "vitdet"
    assert DetectionConfig().det_protocol == DEFAULT_PROTOCOL and LEGACY_FALLBACK_PROTOCOL == "torchvision"
    protocol = {file: recipes.recipe(file).values["det_protocol"]
                for file in (recipes.COCO, "fine-tune.yaml", "shapes.yaml", "small-data.yaml")}
    assert protocol == {recipes.COCO: "vitdet", "fine-tune.yaml": "vitdet", "shapes.yaml": "torchvision",
                        "small-data.yaml": "torchvision"}
    with pytest.raises(ValueError, match="unknown detection protocol 'mmdet'; choose one of vitdet, torchvision"):
        build_maskrcnn(FakePyramid(), 3, protocol="mmdet")


def test_protocol_flag_and_bad_value():
    args = build_parser(DetectionTask).parse_args(["train", "--protocol", "torchvision"])
    assert args.det_protocol == "torchvision"
    with pytest.raises(SystemExit):
        build_parser(DetectionTask).parse_args(["train", "--protocol", "mmdet"])


# 1. -------------------------------------------------------------------------------------------------
def test_1_stage_losses_unweighted_and_a_third_of_the_gradient_back_from_each_box_head():
    """detectron2 CascadeROIHeads: the stage losses are summed as they are, and _run_stage scales the
    gradient of the pooled box features by 1 / num_cascade_stages (_ScaleGradient) before the stage's box
    head; the heads' own parameters get the full gradient, the mask loss is not scaled."""
    heads = tiny(cascade=True).train().roi_heads
    assert heads.loss_weights == (1.0, 1.0, 1.0) and heads.head_gradient_scale == pytest.approx(1 / 3)
    assert tiny(cascade=True, protocol="torchvision").roi_heads.loss_weights == (1.0, 0.5, 0.25)
    targets = [square_target()]

    def grads(scale: float, stage: int) -> tuple[dict, list, list]:
        heads.head_gradient_scale = scale
        feats = features(requires_grad=True)
        torch.manual_seed(2)  # the same stage-1 sample both times
        losses = heads(feats, [p.clone() for p in PROPOSALS], [(SIZE, SIZE)], targets)[1]
        loss = losses[f"loss_classifier_stage{stage}"] + losses[f"loss_box_reg_stage{stage}"]
        head = list(heads.stages[stage].box_head.parameters())
        g = torch.autograd.grad(loss, list(feats.values()) + head, retain_graph=True, allow_unused=True)
        mask = torch.autograd.grad(losses["loss_mask"], list(feats.values()))
        return {k: v.detach() for k, v in losses.items()}, list(g), list(mask)

    for stage in range(len(STAGE_IOU_THRESHOLDS)):
        losses_third, g_third, mask_third = grads(1 / 3, stage)
        losses_full, g_full, mask_full = grads(1.0, stage)
        assert losses_third.keys() == losses_full.keys()
        for key in losses_full:  # the forward is unchanged
            assert torch.equal(losses_third[key], losses_full[key])
        n = 4  # feature levels
        got = [g for g in g_full[:n] if g is not None]
        assert got and any(g.abs().sum() > 0 for g in got)
        for third, full in zip(g_third[:n], g_full[:n]):
            if full is not None:
                torch.testing.assert_close(third, full / 3)
        for third, full in zip(g_third[n:], g_full[n:]):  # the box head's parameters: full gradient
            torch.testing.assert_close(third, full)
        for third, full in zip(mask_third, mask_full):
            torch.testing.assert_close(third, full)


# 2. -------------------------------------------------------------------------------------------------
def test_2_boxes_and_masks_are_pooled_aligned_with_adaptive_sampling():
    """detectron2 ROIPooler(pooler_type="ROIAlignV2", sampling_ratio=0), 7x7 for boxes and 14x14 for
    masks: torchvision's roi_align(aligned=True, sampling_ratio=0) on the box's level."""
    for cascade in (False, True):
        heads = tiny(cascade=cascade).roi_heads
        box_pools = [s.box_roi_pool for s in heads.stages] if cascade else [heads.box_roi_pool]
        for pool, size in [*((p, 7) for p in box_pools), (heads.mask_roi_pool, 14)]:
            assert isinstance(pool, AlignedMultiScaleRoIAlign)
            assert pool.sampling_ratio == 0 and pool.output_size == (size, size)
    plain = tiny(cascade=False, protocol="torchvision").roi_heads
    assert type(plain.box_roi_pool) is MultiScaleRoIAlign and plain.box_roi_pool.sampling_ratio == 2


def test_2_aligned_pooler_samples_each_box_on_detectron2s_level():
    """detectron2 assign_boxes_to_levels: level floor(4 + log2(sqrt(area) / 224 + 1e-8)), clamped to
    2..5 (strides 4..32), then ROIAlignV2 with spatial scale 1 / stride."""
    torch.manual_seed(0)
    side = 512
    feats = {str(i): torch.randn(2, 3, side // 2 ** (i + 2), side // 2 ** (i + 2)) for i in range(4)}
    boxes = [torch.tensor([[0.0, 0, 40, 40],  # side 40: level 2 (clamped from 1)
                           [10, 10, 121, 121],  # side 111: level 2
                           [5, 5, 117, 117],  # side 112 = 224 / 2: level 3, on the boundary
                           [0, 100, 64, 356]]),  # 64 x 256, sqrt 128: level 3
             torch.tensor([[3.5, 7.25, 227.5, 231.25],  # side 224: level 4
                           [20, 30, 468, 478],  # side 448: level 5
                           [0, 0, 512, 512]])]  # side 512: level 5
    levels = [2, 2, 3, 3, 4, 5, 5]
    pool = AlignedMultiScaleRoIAlign(["0", "1", "2", "3"], output_size=7, sampling_ratio=0)
    out = pool(feats, boxes, [(side, side), (side, side)])
    assert out.shape == (7, 3, 7, 7)
    rois = [(0, b) for b in boxes[0]] + [(1, b) for b in boxes[1]]
    for row, ((image, box), level) in enumerate(zip(rois, levels)):
        roi = torch.cat([torch.tensor([float(image)]), box])[None]  # (1, 5)
        expected = roi_align(feats[str(level - 2)], roi, (7, 7), spatial_scale=1 / 2 ** level, sampling_ratio=0,
                             aligned=True)
        torch.testing.assert_close(out[row:row + 1], expected, rtol=0, atol=0)
    unaligned = MultiScaleRoIAlign(["0", "1", "2", "3"], 7, sampling_ratio=2)(feats, boxes, [(side, side)] * 2)
    assert not torch.allclose(out, unaligned, atol=1e-3)  # torchvision's pooler samples elsewhere


# 3. -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cascade", [False, True])
def test_3_rpn_keeps_1000_proposals_after_nms_in_training(cascade):
    """detectron2 mask_rcnn_fpn.py: RPN pre_nms_topk=(2000, 1000), post_nms_topk=(1000, 1000)."""
    rpn = tiny(cascade).rpn
    assert rpn._pre_nms_top_n == {"training": 2000, "testing": 1000}
    assert rpn._post_nms_top_n == {"training": 1000, "testing": 1000}
    assert tiny(cascade, protocol="torchvision").rpn._post_nms_top_n["training"] == 2000
    assert tiny(cascade, rpn_post_nms_top_n_train=64).rpn._post_nms_top_n["training"] == 64  # a kwarg wins


# 4. -------------------------------------------------------------------------------------------------
def test_4_box_loss_is_plain_l1_over_positives_divided_by_all_rois():
    """detectron2 FastRCNNOutputLayers (smooth_l1_beta 0.0, i.e. L1): the box loss is the L1 distance
    summed over the positive RoIs' deltas and divided by the number of sampled RoIs."""
    logits = torch.tensor([[2.0, 0.5, -1.0], [0.0, 1.0, 0.0], [0.3, 0.2, 0.1]])
    agnostic = torch.tensor([[9.0, 9, 9, 9], [0.5, -0.25, 0.0, 1.0], [0.1, 0.2, 0.3, 0.4]])
    targets = torch.tensor([[0.0, 0, 0, 0], [0.0, 0.0, 0.5, 0.5], [0.0, 0.0, 0.0, 0.0]])
    labels = torch.tensor([0, 2, 1])  # the first RoI is background: its deltas do not count
    hand = ((0.5 + 0.25 + 0.5 + 0.5) + (0.1 + 0.2 + 0.3 + 0.4)) / 3
    cls, box = box_loss(logits, agnostic, [labels], [targets], beta=0.0)
    assert box.item() == pytest.approx(hand)
    assert cls.item() == pytest.approx(F.cross_entropy(logits, labels).item())
    per_class = torch.zeros(3, 12)  # (R, 4 * classes): each positive is regressed with its own class's deltas
    per_class[1, 8:12], per_class[2, 4:8] = agnostic[1], agnostic[2]
    per_class[1, 4:8] = 100.0  # another class's deltas of a positive: not counted
    assert box_loss(logits, per_class, [labels], [targets], beta=0.0)[1].item() == pytest.approx(hand)
    smooth = box_loss(logits, agnostic, [labels], [targets], beta=1 / 9)[1].item()  # torchvision's
    assert smooth < hand


def test_4_built_rpn_and_heads_regress_with_l1():
    """detectron2's RPN (smooth_l1_beta 0.0) and box heads: L1. A hand computation of the RPN's losses on
    5 anchors, all of which its 256-anchor sampler takes."""
    assert isinstance(tiny(False).rpn, L1RegionProposalNetwork) and tiny(False).rpn.box_loss_beta == 0.0
    assert isinstance(tiny(False).roi_heads, MaskRCNNRoIHeads) and tiny(False).roi_heads.box_loss_beta == 0.0
    assert tiny(True).roi_heads.box_loss_beta == 0.0
    assert tiny(True, protocol="torchvision").roi_heads.box_loss_beta == pytest.approx(1 / 9)
    rpn = tiny(False).rpn
    objectness = torch.tensor([[1.0], [-2.0], [0.5], [0.0], [3.0]])
    deltas = torch.tensor([[0.2, -0.1, 0.0, 0.3], [5, 5, 5, 5], [0.0, 0.4, -0.2, 0.0], [5, 5, 5, 5], [5, 5, 5, 5]])
    labels = [torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0])]
    targets = [torch.zeros(5, 4)]
    objectness_loss, box = rpn.compute_loss(objectness, deltas, labels, targets)
    assert box.item() == pytest.approx((0.2 + 0.1 + 0.3 + 0.4 + 0.2) / 5)
    def sigmoid(x: float) -> float:
        return 1 / (1 + math.exp(-x))
    hand_bce = -(math.log(sigmoid(1.0)) + math.log(1 - sigmoid(-2.0)) + math.log(sigmoid(0.5))
                 + math.log(1 - sigmoid(0.0)) + math.log(1 - sigmoid(3.0))) / 5
    assert objectness_loss.item() == pytest.approx(hand_bce, rel=1e-5)


# 5. -------------------------------------------------------------------------------------------------
def test_5_ground_truth_joins_the_proposals_at_stage_1_only(monkeypatch):
    """detectron2 CascadeROIHeads: label_and_sample_proposals (ground truth appended, 512 sampled) runs
    once, before stage 1; stages 2 and 3 take every box the previous stage predicted (empty ones dropped)
    and _match_and_label_boxes labels each at the stage's IoU threshold, without appending or sampling."""
    heads = tiny(cascade=True).train().roi_heads
    sampled_at = []
    for t, stage in enumerate(heads.stages):
        original = stage.select_training_samples

        def record(proposals, targets, original=original, t=t):
            sampled_at.append(t)
            return original(proposals, targets)
        monkeypatch.setattr(stage, "select_training_samples", record)
    seen, refined_by = [], []
    run_stage = heads._run_stage

    def record_stage(t, feats, proposals, image_shapes):
        seen.append([p.clone() for p in proposals])
        out = run_stage(t, feats, proposals, image_shapes)
        refined_by.append(out[2])
        return out
    monkeypatch.setattr(heads, "_run_stage", record_stage)
    labels_at = []
    loss = cascade_module.box_loss

    def record_loss(logits, deltas, labels, targets, beta):
        labels_at.append(torch.cat(labels))
        return loss(logits, deltas, labels, targets, beta)
    monkeypatch.setattr(cascade_module, "box_loss", record_loss)

    target = square_target()
    heads(features(), [p.clone() for p in PROPOSALS], [(SIZE, SIZE)], [target])
    assert sampled_at == [0]
    assert len(seen[0][0]) == len(PROPOSALS[0]) + 1  # stage 1: the proposals and the ground truth
    for t in (1, 2):  # exactly the previous stage's boxes: as many, none appended
        assert torch.equal(seen[t][0], refined_by[t - 1][0])
        iou = box_iou(seen[t][0], target["boxes"])[:, 0]
        expected = torch.where(iou >= STAGE_IOU_THRESHOLDS[t], target["labels"][0], 0)
        assert torch.equal(labels_at[t], expected)
    # the torchvision protocol appends the ground truth and resamples at every stage
    heads = tiny(cascade=True, protocol="torchvision").train().roi_heads
    seen.clear()
    run_stage = heads._run_stage
    monkeypatch.setattr(heads, "_run_stage", record_stage)
    heads(features(), [p.clone() for p in PROPOSALS], [(SIZE, SIZE)], [target])
    assert [len(s[0]) for s in seen] == [5, 6, 7]


# 6. -------------------------------------------------------------------------------------------------
def tiny_backbone() -> nn.Module:
    torch.manual_seed(0)
    return build_backbone("weightformer_tiny", embed_dim=32, depth=3)


def test_6_vitdet_pyramid_reads_the_last_block_without_the_final_norm():
    """detectron2 ViT (backbone/vit.py) has no final norm: SimpleFeaturePyramid reads the last block's
    output. The unused norm is frozen, so every trainable parameter still gets a gradient (DDP)."""
    images = torch.randn(1, 3, 64, 64)
    vitdet = detection_pyramid(tiny_backbone(), 16, "vitdet")
    legacy = detection_pyramid(tiny_backbone(), 16, "torchvision")
    with torch.no_grad():
        before = vitdet(images)["2"], legacy(images)["2"]
        for pyramid in (vitdet, legacy):
            pyramid.backbone.norm.weight.fill_(5.0)
            pyramid.backbone.norm.bias.fill_(3.0)
        after = vitdet(images)["2"], legacy(images)["2"]
        last_block = vitdet.backbone.forward_intermediates(images, indices=1, norm=False, output_fmt="NCHW",
                                                           intermediates_only=True)[-1]
        assert torch.equal(before[0], after[0]) and not torch.allclose(before[1], after[1])
        torch.testing.assert_close(after[0], vitdet.levels[2](last_block))
    assert not any(p.requires_grad for p in vitdet.backbone.norm.parameters())
    sum(f.sum() for f in vitdet(images).values()).backward()
    assert all(p.grad is not None for p in vitdet.parameters() if p.requires_grad)


def test_6_vitdet_pyramid_convs_keep_pytorchs_default_init():
    """detectron2 SimpleFeaturePyramid builds its 1x1 and 3x3 convs as plain Conv2d (PyTorch's init,
    kaiming_uniform(a=sqrt(5)): |w| <= 1 / sqrt(fan_in)); its FPN's c2_xavier_fill (|w| up to
    sqrt(3 / fan_in)) is the torchvision protocol's."""
    def convs(protocol):
        pyramid = detection_pyramid(tiny_backbone(), 64, protocol)
        return [m for level in pyramid.levels for m in level.modules() if type(m) is nn.Conv2d]

    for vitdet, legacy in zip(convs("vitdet"), convs("torchvision")):
        fan_in = vitdet.weight[0].numel()
        assert vitdet.weight.abs().max() <= 1 / math.sqrt(fan_in)
        assert legacy.weight.abs().max() > 1 / math.sqrt(fan_in)


def test_6_layer_decay_gives_the_final_norm_the_necks_rate():
    """detectron2 get_vit_lr_decay_rate(name, rate, L): patch/position embedding layer 0, block i layer
    i + 1, every other parameter (the final norm too) layer L + 1; lr scale rate ** (L + 1 - layer).
    (The stem here also holds WeightFormer's norm_pre.)"""
    depth, decay = 3, 0.5
    torch.manual_seed(0)
    model = build_maskrcnn(detection_pyramid(build_backbone("weightformer_tiny", embed_dim=32, depth=depth), 16,
                                             "torchvision"), 3, protocol="torchvision", conv_dim=16, fc_dim=32)
    groups = layer_decay_param_groups(model, "backbone.backbone", weight_decay=0.1, layer_decay=decay)
    scale_of = {id(p): g["lr_scale"] for g in groups for p in g["params"]}

    def vit_rate(name: str) -> float:
        layer = depth + 1
        if name.startswith("backbone.backbone."):
            if ".patch_embed" in name or ".pos_embed" in name or ".norm_pre" in name:
                layer = 0
            elif ".blocks." in name:
                layer = int(name[name.find(".blocks."):].split(".")[2]) + 1
        return decay ** (depth + 1 - layer)

    for name, p in model.named_parameters():
        assert scale_of[id(p)] == pytest.approx(vit_rate(name)), name
    assert scale_of[id(model.backbone.backbone.norm.weight)] == 1.0


# the protocol through configs and checkpoints ---------------------------------------------------------
@pytest.mark.parametrize("name", ["coco_cascade_maskrcnn_weightformer_t_lsj_100ep.yaml",
                                  "coco_maskrcnn_weightformer_t_1x.yaml"])
def test_shipped_coco_configs_name_their_reference_and_protocol(name):
    path = CONFIGS / name
    cfg = validate_config(DetectionConfig(**load_config_file(path, DetectionConfig)))
    assert cfg.det_protocol == "vitdet"
    header = "".join(line for line in path.read_text().splitlines(keepends=True) if line.startswith("#"))
    reference = {"coco_cascade_maskrcnn_weightformer_t_lsj_100ep.yaml":
                 "projects/ViTDet/configs/COCO/cascade_mask_rcnn_vitdet_b_100ep.py",
                 "coco_maskrcnn_weightformer_t_1x.yaml": "configs/_base_/models/mask-rcnn_r50_fpn.py"}[name]
    assert reference in header


def test_a_checkpoints_meta_rebuilds_its_protocol():
    """build_detector follows meta["protocol"]; a checkpoint of format 0 names none, and the upgrade fills in
    the torchvision protocol it was trained with."""
    meta = {"model": "weightformer_tiny", "model_kwargs": {"embed_dim": 32, "depth": 2, "conv_dim": 16, "fc_dim": 32},
            "num_classes": 2, "cascade": True, "img_size": 64}
    old = build_detector(DetectionTask.upgrade_checkpoint({"meta": meta}, 0)["meta"])
    new = build_detector({**meta, "protocol": "vitdet"})
    assert old.roi_heads.loss_weights == (1.0, 0.5, 0.25) and old.backbone.final_norm
    assert new.roi_heads.loss_weights == (1.0, 1.0, 1.0) and not new.backbone.final_norm
    assert isinstance(new.roi_heads.mask_roi_pool, AlignedMultiScaleRoIAlign)
    assert new.state_dict().keys() == old.state_dict().keys()  # same parameters: either loads the other's
