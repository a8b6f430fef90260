"""Layer-wise lr decay on a whole detector: groups, and the rates the training optimizer really uses."""

import pytest
import torch
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from torch import nn
from torchvision.models.detection import MaskRCNN

from weightformer.models.layer_decay import layer_decay_param_groups
from weightformer.models.pyramid import SimpleFeaturePyramid, build_backbone

DEPTH, DECAY, LR = 3, 0.5, 1e-3


def detector(name: str = "weightformer_tiny") -> MaskRCNN:
    torch.manual_seed(0)
    dims = dict(embed_dim=32, depth=DEPTH) if name.startswith("weightformer") else dict(depth=DEPTH)
    return MaskRCNN(SimpleFeaturePyramid(build_backbone(name, **dims), out_channels=16), num_classes=3)


def lr_of(optimizer: torch.optim.Optimizer, param: nn.Parameter) -> float:
    (lr,) = [g["lr"] for g in optimizer.param_groups if any(p is param for p in g["params"])]
    return lr


def expected_scales(model: MaskRCNN) -> dict:
    """BEiT/ViTDet: stem (patch embedding, its norm, position embedding, class token) decay^(L+1),
    block i decay^(L-i), the final norm, neck and heads 1 (detectron2's get_vit_lr_decay_rate)."""
    backbone = model.backbone.backbone
    scales = {p: 1.0 for p in model.parameters()}
    stem = [p for n, p in backbone.named_parameters() if not n.startswith(("blocks.", "norm."))]
    assert len(stem) >= 3  # patch_embed.proj weight and bias, norm_pre or pos_embed and cls_token
    scales.update({p: DECAY ** (DEPTH + 1) for p in stem})
    for i, block in enumerate(backbone.blocks):
        scales.update({p: DECAY ** (DEPTH - i) for p in block.parameters()})
    scales.update({p: 1.0 for p in backbone.norm.parameters()})  # get_vit_lr_decay_rate: layer L + 1
    return scales


def test_every_trainable_parameter_in_exactly_one_group():
    model = detector()
    frozen = model.backbone.backbone.patch_embed.proj.bias
    frozen.requires_grad_(False)
    by_path = layer_decay_param_groups(model, "backbone.backbone", weight_decay=0.05, layer_decay=DECAY)
    by_module = layer_decay_param_groups(model, model.backbone.backbone, weight_decay=0.05, layer_decay=DECAY)
    for groups in (by_path, by_module):
        ids = [id(p) for g in groups for p in g["params"]]
        assert len(ids) == len(set(ids))
        assert set(ids) == {id(p) for p in model.parameters() if p.requires_grad} and id(frozen) not in ids
    assert [(g["lr_scale"], g["weight_decay"], len(g["params"])) for g in by_path] == [
        (g["lr_scale"], g["weight_decay"], len(g["params"])) for g in by_module
    ]


@pytest.mark.parametrize("name", ["weightformer_tiny", "weightformer_long_range_tiny", "deit_tiny_patch16_224"])
def test_timm_scheduler_gives_each_block_its_decayed_rate_in_the_optimizer(name):
    model = detector(name)
    groups = layer_decay_param_groups(model, "backbone.backbone", weight_decay=0.0, layer_decay=DECAY)
    optimizer = create_optimizer_v2(groups, opt="adamw", lr=LR, weight_decay=0.0)
    scheduler, _ = create_scheduler_v2(  # as the training engine builds it
        optimizer, sched="cosine", num_epochs=4, warmup_epochs=1, min_lr=1e-5, warmup_lr=1e-6,
        step_on_epochs=False, updates_per_epoch=10,
    )
    scheduler.step_update(num_updates=15)
    base = lr_of(optimizer, model.roi_heads.box_predictor.cls_score.weight)
    assert 1e-5 < base < LR  # past warm-up, on the cosine
    scales = expected_scales(model)
    for p, scale in scales.items():
        assert lr_of(optimizer, p) == pytest.approx(base * scale, rel=1e-12)
    backbone = model.backbone.backbone
    chain = [backbone.patch_embed.proj.weight] + [b.mlp.fc1.weight for b in backbone.blocks]
    chain += [model.backbone.levels[0][1][0].weight, model.rpn.head.conv[0][0].weight]
    rates = [lr_of(optimizer, p) for p in chain]  # patch_embed < block 0 < ... < last block < neck == RPN
    assert rates[:-1] == sorted(set(rates[:-1])) and rates[-2] == rates[-1] == base

    # the step itself: AdamW's first update is -lr · g / (|g| + eps), i.e. -lr per element for g = 1
    with torch.no_grad():
        for p in scales:
            p.zero_()  # from 0 the float32 update is exact to rounding
            p.grad = torch.ones_like(p)
    optimizer.step()
    for p, scale in scales.items():
        torch.testing.assert_close(-p.detach(), torch.full_like(p, base * scale), rtol=1e-5, atol=0)


def test_a_torch_scheduler_ignores_lr_scale():
    model = detector()
    groups = layer_decay_param_groups(model, "backbone.backbone", weight_decay=0.05, layer_decay=DECAY)
    optimizer = create_optimizer_v2(groups, opt="adamw", lr=LR, weight_decay=0.05)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=10)
    optimizer.step()
    scheduler.step()
    assert len({g["lr"] for g in optimizer.param_groups}) == 1  # every layer at one rate: the trap


def test_weight_decay_split():
    model = detector("deit_tiny_patch16_224")
    groups = layer_decay_param_groups(
        model, "backbone.backbone", weight_decay=0.05, layer_decay=DECAY,
        no_weight_decay_list=["backbone.backbone.blocks.0.mlp.fc1.weight", "rpn.head.conv.*.weight"],
    )
    wd = {p: g["weight_decay"] for g in groups for p in g["params"]}
    backbone = model.backbone.backbone
    no_decay = [
        backbone.pos_embed, backbone.cls_token, backbone.norm.weight, backbone.blocks[1].attn.qkv.bias,
        backbone.blocks[0].mlp.fc1.weight, model.backbone.levels[0][1][1].weight, model.rpn.head.conv[0][0].weight,
    ]
    decay = [backbone.patch_embed.proj.weight, backbone.blocks[1].mlp.fc1.weight, model.backbone.levels[0][1][0].weight,
             model.roi_heads.box_head.fc6.weight]
    assert [wd[p] for p in no_decay] == [0.0] * len(no_decay)
    assert [wd[p] for p in decay] == [0.05] * len(decay)


def test_a_wrapped_backbone_is_an_error_not_one_silent_group():
    model = detector()
    timm_groups = create_optimizer_v2(model, opt="adamw", lr=LR, layer_decay=DECAY).param_groups
    assert {g["lr_scale"] for g in timm_groups} == {1.0}  # timm on the whole detector: no decay at all
    with pytest.raises(ValueError, match="no group_matcher"):
        layer_decay_param_groups(model, "backbone", weight_decay=0.05, layer_decay=DECAY)
    with pytest.raises(ValueError, match="not a submodule"):
        layer_decay_param_groups(model, nn.Linear(2, 2), weight_decay=0.05, layer_decay=DECAY)
    with pytest.raises(ValueError, match="layer_decay"):
        layer_decay_param_groups(model, "backbone.backbone", weight_decay=0.05, layer_decay=0.0)
