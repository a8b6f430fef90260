"""UperNet on a feature pyramid, build_upernet, and the segmentation task's loss and evaluation."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader

from weightformer.models.upernet import FCNHead, UperNet, UperNetHead
from weightformer.segmentation import (
    SegmentationBatch,
    SegmentationFolder,
    build_upernet,
    collate_segmentation,
    evaluate,
    training_loss,
)


class FakePyramid(nn.Module):
    """A few strided convs: {"0": stride 4, ..., "3": stride 32, "pool": stride 64}, like a torchvision backbone."""

    def __init__(self, out_channels: int = 8, level_channels=None):
        super().__init__()
        chans = level_channels or [out_channels] * 4
        self.stem = nn.Conv2d(3, chans[0], 3, stride=4, padding=1)
        self.downs = nn.ModuleList(nn.Conv2d(chans[i], chans[i + 1], 3, stride=2, padding=1) for i in range(3))
        self.out_channels = out_channels

    def forward(self, images: torch.Tensor) -> "OrderedDict[str, torch.Tensor]":
        x = self.stem(images)
        feats = OrderedDict([("0", x)])
        for i, down in enumerate(self.downs):
            x = down(x)
            feats[str(i + 1)] = x
        feats["pool"] = F.max_pool2d(x, 1, stride=2)
        return feats


@pytest.mark.parametrize("size", [(64, 96), (50, 70)])
def test_upernet_logits_at_input_size(size):
    model = build_upernet(FakePyramid(8), num_classes=5, channels=16, aux_channels=8).eval()
    images = torch.randn(2, 3, *size)
    with torch.no_grad():
        logits = model(images)
        main, aux = model(images, with_aux=True)
    assert logits.shape == (2, 5, *size) and aux.shape == (2, 5, *size)
    torch.testing.assert_close(main, logits)


def test_head_takes_levels_of_different_widths():
    pyramid = FakePyramid(level_channels=[4, 6, 8, 10])
    head = UperNetHead([4, 6, 8, 10], num_classes=3, channels=12, pool_scales=(1, 2)).eval()
    feats = pyramid(torch.randn(1, 3, 64, 64))
    assert head([feats[k] for k in "0123"]).shape == (1, 3, 16, 16)  # stride 4
    with pytest.raises(ValueError, match="built for 4 levels, got 3"):
        head([feats[k] for k in "012"])


class RampPyramid(nn.Module):
    """Pads images to a multiple of 32 (as SimpleFeaturePyramid does) and average-pools them per level."""

    out_channels = 1
    strides = {"0": 4, "1": 8, "2": 16, "3": 32}

    def forward(self, images):
        h, w = images.shape[-2:]
        padded = F.pad(images[:, :1], (0, -w % 32, 0, -h % 32))
        return {key: F.avg_pool2d(padded, stride) for key, stride in self.strides.items()}


def test_padded_pyramid_maps_are_cut_not_stretched():
    class Finest(nn.Module):  # a "head" that returns the stride-4 map itself
        def forward(self, feats):
            return feats[0]

    x = torch.arange(50, dtype=torch.float32).expand(1, 3, 40, 50)  # each pixel's value is its column
    with torch.no_grad():
        out = UperNet(RampPyramid(), Finest())(x)  # the pyramid sees 64 columns, 14 of them zero padding
    assert out.shape == (1, 1, 40, 50)
    torch.testing.assert_close(out[0, 0, 5, 2:46], x[0, 0, 5, 2:46])  # a linear ramp survives pool + upsample


def test_build_upernet_options():
    model = build_upernet(FakePyramid(8), num_classes=4, channels=16, aux_channels=0).eval()
    assert model.aux_head is None and model(torch.randn(1, 3, 32, 32), with_aux=True)[1] is None
    with pytest.raises(TypeError, match="ready pyramid"):
        build_upernet(FakePyramid(8), num_classes=4, pretrained=True)


def test_build_upernet_on_a_weightformer():
    model = build_upernet("weightformer_tiny", num_classes=3, channels=16, pyramid_channels=16, aux_channels=8,
                          embed_dim=32, depth=3).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 48, 80)).shape == (1, 3, 48, 80)
    assert "pool" not in model.pyramid(torch.randn(1, 3, 32, 32))


def test_training_loss_is_mmseg_cross_entropy_and_reaches_the_pyramid():
    torch.manual_seed(0)
    model = UperNet(FakePyramid(8), UperNetHead(8, 3, channels=16), FCNHead(8, 3, channels=8)).train()
    images = torch.randn(2, 3, 32, 32)
    labels = torch.randint(0, 3, (2, 32, 32))
    labels[:, :8] = 255
    batch = SegmentationBatch(images, labels, torch.tensor([[32, 32]] * 2), torch.tensor([[32, 32]] * 2))
    torch.manual_seed(1)
    loss, terms = training_loss(model, batch, torch.device("cpu"), aux_weight=0.4)
    loss.backward()
    assert model.pyramid.stem.weight.grad.abs().sum() > 0
    torch.manual_seed(1)  # the same dropout masks
    with torch.no_grad():
        main, aux = model(images, with_aux=True)
    ce = [F.cross_entropy(x, labels, ignore_index=255, reduction="sum") / labels.numel() for x in (main, aux)]
    torch.testing.assert_close(loss.detach(), ce[0] + 0.4 * ce[1])
    torch.testing.assert_close(terms["aux"], 0.4 * ce[1])
    ignored = batch._replace(labels=torch.full_like(labels, 255))
    assert training_loss(model, ignored, torch.device("cpu"))[0].item() == 0.0  # an all-ignored crop gives no NaN


class Oracle(nn.Module):
    """Logits that put each pixel in the class written in its first channel: a perfect segmenter."""

    def forward(self, images):
        return F.one_hot(images[:, 0].round().long().clamp(0, 2), 3).permute(0, 3, 1, 2).float()


def test_evaluate_scores_each_image_at_its_own_size(tmp_path: Path):
    rng = np.random.default_rng(0)
    for name, (h, w) in (("a", (30, 40)), ("b", (17, 23)), ("c", (45, 20))):
        label = rng.integers(1, 4, size=(h, w)).astype(np.uint8)
        (tmp_path / "images/validation").mkdir(parents=True, exist_ok=True)
        (tmp_path / "annotations/validation").mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.stack([label - 1] * 3, axis=-1)).save(tmp_path / f"images/validation/{name}.png")
        Image.fromarray(label).save(tmp_path / f"annotations/validation/{name}.png")
    data = SegmentationFolder(tmp_path, "validation", num_classes=3, transform=lambda im, lb, g: (im.float(), lb))
    loader = DataLoader(data, batch_size=2, collate_fn=collate_segmentation)  # padded batches
    for mode in ("whole", "slide"):
        result = evaluate(Oracle(), loader, num_classes=3, device=torch.device("cpu"), mode=mode, crop=16, stride=10)
        assert (result["mIoU"], result["mAcc"], result["aAcc"]) == (100.0, 100.0, 100.0)
    with pytest.raises(ValueError, match="'tiles' is not one of whole, slide"):
        evaluate(Oracle(), loader, num_classes=3, device=torch.device("cpu"), mode="tiles")
