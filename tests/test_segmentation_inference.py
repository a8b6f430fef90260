"""Test-time inference: whole image and overlapping sliding windows."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from weightformer.segmentation import slide_inference, whole_inference
from weightformer.segmentation.inference import window_starts


class Constant(nn.Module):
    """Logits equal to ``value`` everywhere, whatever the input."""

    def __init__(self, value: torch.Tensor):
        super().__init__()
        self.value = value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.value[None, :, None, None].expand(x.shape[0], -1, *x.shape[-2:])


def test_window_starts_cover_every_pixel_with_the_last_window_flush():
    assert window_starts(512, 512, 341) == [0]
    assert window_starts(683, 512, 341) == [0, 171]  # mmseg: ceil((683 - 512) / 341) + 1 = 2 windows
    assert window_starts(100, 48, 32) == [0, 32, 52]
    for size, crop, stride in ((100, 48, 32), (2048, 512, 341), (513, 512, 1)):
        starts = window_starts(size, crop, stride)
        covered = torch.zeros(size)
        for start in starts:
            covered[start : start + crop] += 1
        assert covered.min() >= 1 and starts[-1] == size - crop


def test_slide_with_a_crop_at_least_the_image_equals_whole_inference():
    torch.manual_seed(0)
    pointwise = nn.Conv2d(3, 5, 1)  # each pixel's logits depend on that pixel only: padding cannot change them
    images = torch.randn(2, 3, 37, 50)
    with torch.no_grad():
        slid = slide_inference(pointwise, images, crop=64, stride=40)
        torch.testing.assert_close(slid, whole_inference(pointwise, images))
        conv = nn.Conv2d(3, 5, 3, padding=1)  # a crop of exactly the image's size: one window, no padding
        slid = slide_inference(conv, images, crop=(37, 50), stride=20)
        torch.testing.assert_close(slid, whole_inference(conv, images))


def test_overlapping_windows_are_averaged_by_their_count():
    value = torch.tensor([1.5, -2.0, 7.0])
    images = torch.randn(2, 3, 100, 130)
    out = slide_inference(Constant(value), images, crop=48, stride=32)  # windows overlap 1 to 4 times
    assert out.shape == (2, 3, 100, 130)
    torch.testing.assert_close(out, value[None, :, None, None].expand_as(out))


def test_windows_sit_where_they_were_cut():
    images = torch.randn(1, 3, 90, 70)
    identity = nn.Identity()  # logits = the window's pixels: misplaced windows would show
    torch.testing.assert_close(slide_inference(identity, images, crop=32, stride=20), images)


def test_whole_inference_resizes_coarse_logits_and_bad_windows_are_refused():
    coarse = nn.Conv2d(3, 4, 4, stride=4)
    out = whole_inference(coarse, torch.randn(1, 3, 32, 48))
    assert out.shape == (1, 4, 32, 48) and out.dtype == torch.float32
    with pytest.raises(ValueError, match="larger than crop"):
        slide_inference(coarse, torch.randn(1, 3, 32, 32), crop=16, stride=20)
