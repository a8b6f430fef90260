"""An experiment (no option of the package): the ``weightformer`` command with every dynamic depthwise conv started
differently, to tell which part of its start costs the dense tasks (benchmarks/results/long_range/local_cost/).

    WF_CONV_SCALE=0.1 python benchmarks/examples/conv_start.py det train --seed 0 --long-range \\
        --model-kwargs linear_predictor=double_centered_gated dwc_predictor=offset_corr

- ``WF_CONV_SCALE=s``: the predicted kernel ΔK times s before the layer's normalisation;
- ``WF_CONV_LOGGAIN=g0``: ΔK times g0·exp(30·t), t a learned scalar from 0 (on each predictor);
- ``WF_CONV_INIT=conv``: the static kernel and bias drawn again, after the release's draws, as ``nn.Conv2d``'s.

``dwc_static_led=True`` is the package's option for WF_CONV_SCALE=0.1 with WF_CONV_INIT=conv (its draws differ: it
does not draw the release's values first). The patches apply to ``AdaptiveKernelPredictor``, which ``offset_corr``
inherits, and to ``DynamicDWConv``, in this process only.
"""

import os
import sys

import torch
from torch import nn

import weightformer.layers.dynamic_dwconv as dwconv

SCALE, LOG_GAIN, INIT = (os.environ.get(k) for k in ("WF_CONV_SCALE", "WF_CONV_LOGGAIN", "WF_CONV_INIT"))
_predictor_init, _predictor_forward = dwconv.AdaptiveKernelPredictor.__init__, dwconv.AdaptiveKernelPredictor.forward
_layer_reset = dwconv.DynamicDWConv.reset_parameters


def predictor_init(self, *args, **kwargs) -> None:
    _predictor_init(self, *args, **kwargs)
    if LOG_GAIN is not None:
        self.conv_gain = nn.Parameter(torch.zeros(()))


def predictor_forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, H, W) -> (B, C, K, K)
    out = _predictor_forward(self, x)
    if SCALE is not None:
        out = out * float(SCALE)
    if LOG_GAIN is not None:
        out = out * (float(LOG_GAIN) * torch.exp(30.0 * self.conv_gain))
    return out


def layer_reset(self) -> None:
    _layer_reset(self)
    if INIT == "conv":
        nn.Conv2d.reset_parameters(self)  # as DynamicDWConv(static_led=True) draws them


if __name__ == "__main__":
    dwconv.AdaptiveKernelPredictor.__init__ = predictor_init
    dwconv.AdaptiveKernelPredictor.forward = predictor_forward
    dwconv.DynamicDWConv.reset_parameters = layer_reset
    from weightformer.cli import main

    sys.exit(main())
