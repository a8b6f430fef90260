"""The per-sample depthwise convolution's two forms, run eagerly and timed side by side on one device.

    python benchmarks/examples/dwconv_paths.py --device cuda --dtype bfloat16 --batch 64 --resolution 1248

- ``fold``: the batch folded into the channels, one grouped convolution with B·C groups (what eager runs);
- ``taps``: K² shifted, per-sample-scaled copies of the input (what ``torch.compile`` runs, here eagerly).

First one ``DynamicDWConv`` of WeightFormer-T's width on the token grid of ``--resolution`` (and the largest
difference of the two outputs), then the whole WeightFormer-T forward with every layer in the form a compiled
graph takes (``torch.compiler.is_compiling`` reported as true while it runs eagerly: the taps, and the
averaging matrices of the kernel predictor's pool) against the plain eager forward. On the H200 the eager
forward ran 5× slower than the compiled one (benchmarks/results/gpu/README.md); this says whether these
forms are why.
"""

import argparse
import contextlib
from unittest import mock

import timm
import torch

import weightformer  # noqa: F401  (registers the models)
from weightformer.bench.results import describe, machine_info
from weightformer.bench.timing import iterations_for, median, side_by_side, time_call
from weightformer.layers import DynamicDWConv

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--device", default="cpu")
parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="autocast dtype")
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--resolution", type=int, default=224)
parser.add_argument("--rounds", type=int, default=5)
args = parser.parse_args()
device, dtype = torch.device(args.device), getattr(torch, args.dtype)
print(describe(machine_info(args.device)))


def autocast():
    if dtype is torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def timed(calls):
    """Median seconds per call of each callable over ``--rounds`` interleaved rounds of about a second each."""
    iterations = {key: iterations_for(time_call(fn, args.device), 1.0) for key, fn in calls.items()}
    samples = side_by_side(calls, args.rounds, args.device, iterations)
    return {key: median(values) for key, values in samples.items()}


torch.manual_seed(0)
side = args.resolution // 16
layer = DynamicDWConv(192, 3).to(device).eval()
x = torch.randn(args.batch, side, side, 192, device=device).permute(0, 3, 1, 2)  # (B, C, H, W), channels-last


def taps():
    """The layer's forward in the form a compiled graph takes: the taps (and the predictor's pooling matrices)."""
    with mock.patch("torch.compiler.is_compiling", return_value=True):
        return layer(x)


with torch.inference_mode(), autocast():
    def fold():
        return layer(x)

    difference = (fold().float() - taps().float()).abs().max().item()
    seconds = timed({"fold": fold, "taps": taps})
print(f"DynamicDWConv(192), batch {args.batch}, {side}×{side} tokens, {args.dtype}: fold {seconds['fold'] * 1e3:.2f} ms "
      f"taps {seconds['taps'] * 1e3:.2f} ms; largest difference {difference:.2e}")

model = timm.create_model("weightformer_tiny").to(device).eval()
images = torch.randn(args.batch, 3, args.resolution, args.resolution, device=device)


def eager():
    with torch.inference_mode(), autocast():
        return model(images)


def compiled_forms():
    with mock.patch("torch.compiler.is_compiling", return_value=True), torch.inference_mode(), autocast():
        return model(images)


difference = (eager().float() - compiled_forms().float()).abs().max().item()
seconds = timed({"eager": eager, "compiled_forms": compiled_forms})
print(f"WeightFormer-T, batch {args.batch}, {args.resolution}², {args.dtype}: eager {args.batch / seconds['eager']:.1f} "
      f"img/s, eager with the compiled forms {args.batch / seconds['compiled_forms']:.1f} img/s "
      f"({seconds['eager'] / seconds['compiled_forms']:.2f}×); largest logit difference {difference:.2e}")
