"""A small stand-in for the detector's feature pyramid, shared by the detection model and protocol tests."""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn


class FakePyramid(nn.Module):
    """Strided convs standing in for the simple feature pyramid: "0".."3" at strides 4..32, "pool" at 64."""

    def __init__(self, channels: int = 16):
        super().__init__()
        self.out_channels = channels
        self.stem = nn.Conv2d(3, channels, 4, stride=4)
        self.down = nn.ModuleList(nn.Conv2d(channels, channels, 3, stride=2, padding=1) for _ in range(3))

    def forward(self, x: torch.Tensor) -> "OrderedDict[str, torch.Tensor]":
        x = torch.relu(self.stem(x))  # (B, C, H/4, W/4)
        features = OrderedDict([("0", x)])
        for i, conv in enumerate(self.down):
            x = torch.relu(conv(x))
            features[str(i + 1)] = x
        features["pool"] = F.max_pool2d(x, 1, 2)
        return features
