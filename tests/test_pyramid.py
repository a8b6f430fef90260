"""The simple feature pyramid: strides at any input size, WeightFormer and DeiT, torchvision Mask R-CNN."""

import math

import pytest
import torch
import torch.nn.functional as F
from timm.layers import LayerNorm2d
from torch import nn
from torchvision.models.detection import MaskRCNN

from weightformer.models import WeightFormer
from weightformer.models.pyramid import SimpleFeaturePyramid, build_backbone

STRIDES = {"0": 4, "1": 8, "2": 16, "3": 32, "pool": 64}


def tiny_pyramid(name: str = "weightformer_tiny", out_channels: int = 16) -> SimpleFeaturePyramid:
    torch.manual_seed(0)
    dims = dict(embed_dim=32, depth=3) if name.startswith("weightformer") else dict(depth=2)
    return SimpleFeaturePyramid(build_backbone(name, **dims), out_channels=out_channels).eval()


def expected_shape(H: int, W: int, stride: int, channels: int, batch: int = 1) -> tuple:
    """Sides padded to multiples of 32; "pool" subsamples the stride-32 map with stride 2 (ceil)."""
    Hp, Wp = math.ceil(H / 32) * 32, math.ceil(W / 32) * 32
    return (batch, channels, math.ceil(Hp / stride), math.ceil(Wp / stride))


@pytest.mark.parametrize("name", ["weightformer_tiny", "deit_tiny_patch16_224"])
@pytest.mark.parametrize("size", [(64, 64), (100, 150), (224, 96)])
def test_levels_have_strides_4_to_64_at_any_input_size(name, size):
    pyramid = tiny_pyramid(name)
    with torch.no_grad():
        feats = pyramid(torch.randn(1, 3, *size))
    assert list(feats) == ["0", "1", "2", "3", "pool"] and pyramid.strides == STRIDES
    shapes = {k: tuple(f.shape) for k, f in feats.items()}
    assert shapes == {k: expected_shape(*size, s, 16) for k, s in STRIDES.items()}


def test_detection_size_800x1333():
    with torch.no_grad():
        feats = tiny_pyramid()(torch.randn(2, 3, 800, 1333))
    assert {k: tuple(f.shape) for k, f in feats.items()} == {
        "0": (2, 16, 200, 336), "1": (2, 16, 100, 168), "2": (2, 16, 50, 84), "3": (2, 16, 25, 42),
        "pool": (2, 16, 13, 21),
    }


def test_odd_sizes_are_zero_padded_at_the_bottom_right():
    pyramid = tiny_pyramid()
    x = torch.randn(1, 3, 100, 150)
    with torch.no_grad():
        feats, padded = pyramid(x), pyramid(F.pad(x, (0, 10, 0, 28)))  # to 128×160 by hand
    for k in feats:
        torch.testing.assert_close(feats[k], padded[k])


def test_deit_needs_dynamic_img_size_and_build_backbone_sets_it():
    backbone = build_backbone("deit_tiny_patch16_224", depth=2)
    assert backbone.dynamic_img_size and backbone.num_classes == 0
    assert not hasattr(build_backbone("weightformer_tiny", embed_dim=32, depth=1), "dynamic_img_size")


def test_every_backbone_and_pyramid_parameter_gets_a_gradient():
    for name in ("weightformer_tiny", "deit_tiny_patch16_224"):
        pyramid = tiny_pyramid(name).train()
        sum(f.square().mean() for f in pyramid(torch.randn(1, 3, 64, 96)).values()).backward()
        missing = [n for n, p in pyramid.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
        assert not missing, f"{name}: no gradient for {missing}"


def test_levels_follow_vitdet():
    levels = tiny_pyramid().levels
    kinds = [[type(m) for m in level[0]] for level in levels]
    assert kinds == [
        [nn.ConvTranspose2d, LayerNorm2d, nn.GELU, nn.ConvTranspose2d], [nn.ConvTranspose2d], [], [nn.MaxPool2d],
    ]
    for level, chs in zip(levels, (8, 16, 32, 32)):  # embed_dim 32: C/4, C/2, C, C
        (conv1, norm1), (conv3, norm3) = level[1], level[2]
        assert (conv1.in_channels, conv1.kernel_size, conv1.bias) == (chs, (1, 1), None)
        assert (conv3.in_channels, conv3.kernel_size, conv3.padding, conv3.bias) == (16, (3, 3), (1, 1), None)
        assert isinstance(norm1, LayerNorm2d) and isinstance(norm3, LayerNorm2d)


def test_maskrcnn_trains_and_detects_with_torchvision_defaults():
    # Default anchors (one size per level, 32..512, ratios 0.5/1/2) and RoIAlign over "0".."3"; only the
    # numbers of proposals and detections are cut, for speed.
    detector = MaskRCNN(
        tiny_pyramid(), num_classes=3, min_size=96, max_size=160, rpn_pre_nms_top_n_train=100,
        rpn_post_nms_top_n_train=50, rpn_pre_nms_top_n_test=100, rpn_post_nms_top_n_test=50,
        box_batch_size_per_image=32, box_detections_per_img=5,
    )
    images = [torch.rand(3, 90, 130), torch.rand(3, 100, 120)]
    masks = torch.zeros(1, 90, 130, dtype=torch.uint8)
    masks[:, 20:60, 30:90] = 1
    targets = [
        {"boxes": torch.tensor([[30.0, 20.0, 90.0, 60.0]]), "labels": torch.tensor([1]), "masks": masks},
        {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.int64),
         "masks": torch.zeros(0, 100, 120, dtype=torch.uint8)},
    ]
    losses = detector.train()(images, targets)
    assert {"loss_classifier", "loss_box_reg", "loss_mask", "loss_objectness", "loss_rpn_box_reg"} == set(losses)
    total = sum(losses.values())
    assert torch.isfinite(total)
    total.backward()
    assert detector.backbone.backbone.patch_embed.proj.weight.grad is not None
    with torch.no_grad():
        detections = detector.eval()(images)
    assert len(detections) == 2 and {"boxes", "labels", "scores", "masks"} <= set(detections[0])


def test_rejects_what_it_cannot_use():
    with pytest.raises(ValueError, match="forward_intermediates"):
        SimpleFeaturePyramid(nn.Conv2d(3, 8, 16, stride=16))
    with pytest.raises(ValueError, match="stride-16"):
        SimpleFeaturePyramid(WeightFormer(embed_dim=16, depth=1, patch_size=8, num_classes=0))
    backbone = WeightFormer(embed_dim=16, depth=1, num_classes=0)
    with pytest.raises(ValueError, match="decreasing"):
        SimpleFeaturePyramid(backbone, scales=(0.5, 1.0))
    with pytest.raises(ValueError, match="ViTDet"):
        SimpleFeaturePyramid(backbone, scales=(3.0,))
    with pytest.raises(ValueError, match="unknown timm model"):
        build_backbone("no_such_model")
