"""Why a probe classifier's accuracy falls on a larger canvas: the measurements of docs/analysis.md,
"Resolution transfer", for one or more ``weightformer train`` probe checkpoints.

For each checkpoint, on ``--num`` of its held-out images and the same images with background inserted
to ``--size`` px (weightformer.analysis.transfer.insert_background, layouts ``between`` and ``around``):

1. ``swap``: weightformer.analysis.transfer.swap_diagnosis, the accuracy with one component of the large
   image's forward (one dynamic layer's update, or a group) replaced by the small image's;
2. ``cores``: for every dynamic linear layer, its predictor's input tokens are recorded and its
   activated projections centred two ways, by the token mean (``centered``) and by row and column
   means (``double_centered``); for each, ``blank_ratio`` = the core's norm on a blank canvas over
   its median norm on the images (at the small and the large size), and ``unit_change`` = the median
   relative change of unit(core) from the small to the large canvas.

    python benchmarks/examples/probe_transfer_diagnosis.py CKPT [CKPT ...] --out benchmarks/results/probes/transfer_diagnosis.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from weightformer.analysis.transfer import (LAYOUTS, checkpoint_probe, insert_background, load_probe_classifier,
                                            probe_batch, swap_diagnosis)
from weightformer.data.builtin import probe_spec
from weightformer.layers.dynamic_linear import DynamicLinear
from weightformer.layers.long_range_predictors import double_center


def _fc1_inputs(model: torch.nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
    """The input (B, H, W, C) of every dynamic linear layer's predictor."""
    layers = {name: m.predictor for name, m in model.named_modules() if isinstance(m, DynamicLinear)}
    store: dict[str, torch.Tensor] = {}
    handles = [p.register_forward_pre_hook(lambda _, args, name=name: store.__setitem__(name, args[0]))
               for name, p in layers.items()]
    with torch.no_grad():
        model(images)
    for handle in handles:
        handle.remove()
    return store


def _core(predictor: torch.nn.Module, x: torch.Tensor, centring: str) -> torch.Tensor:
    """The predictor's Σ_t d_in,tᵀ d_out,t (B, C/r, O/r) with its projections centred as named."""
    with torch.no_grad():
        _, p_in, p_out = predictor.activated(x)  # (B, N', C/r), (B, N', O/r)
    if centring == "centered":
        p_in, p_out = p_in - p_in.mean(1, keepdim=True), p_out - p_out.mean(1, keepdim=True)
    else:
        rows, cols = x.shape[1] // 2, x.shape[2] // 2
        p_in, p_out = double_center(p_in, rows, cols), double_center(p_out, rows, cols)
    return p_in.transpose(1, 2) @ p_out


def _unit(core: torch.Tensor) -> torch.Tensor:
    return core / core.pow(2).mean(dim=(1, 2), keepdim=True).sqrt().clamp_min(1e-30)


def _median_relative(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.flatten(1), b.flatten(1)
    return float(((b - a).norm(dim=1) / a.norm(dim=1).clamp_min(1e-30)).median())


def diagnose(path: str, size: int, num: int) -> dict:
    model, meta = load_probe_classifier(path)
    data = checkpoint_probe(meta, path)
    spec = probe_spec(data)
    background = (0.0 - spec.mean[0]) / spec.std[0]
    images, labels = probe_batch(data)
    images, labels = images[:num], labels[:num]
    small_size = images.shape[-1]
    predictors = {name: m.predictor for name, m in model.named_modules() if isinstance(m, DynamicLinear)}
    blank = torch.full_like(images[:1], background)
    out = {"checkpoint": path, "data": data, "size": size, "images": num, "swap": [], "cores": []}
    small_inputs = _fc1_inputs(model, images)
    for layout in LAYOUTS:
        out["swap"].append(swap_diagnosis(model, images, labels, size, layout, background))
        large_inputs = _fc1_inputs(model, insert_background(images, size, layout, background))
        blank_inputs = {s: _fc1_inputs(model, insert_background(blank, s, layout, background)) for s in (small_size, size)}
        for name, predictor in predictors.items():
            for centring in ("centered", "double_centered"):
                small, large = _core(predictor, small_inputs[name], centring), _core(predictor, large_inputs[name], centring)
                ratio = {str(s): float(_core(predictor, blank_inputs[s][name], centring).norm()
                                       / core.flatten(1).norm(dim=1).median())
                         for s, core in ((small_size, small), (size, large))}
                out["cores"].append({"layout": layout, "layer": name, "centring": centring, "blank_ratio": ratio,
                                     "unit_change": _median_relative(_unit(small), _unit(large))})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="+")
    parser.add_argument("--size", type=int, default=128, help="the large canvas (default: 128)")
    parser.add_argument("--num", type=int, default=300, help="held-out images (default: 300)")
    parser.add_argument("--out", required=True, help="JSON to write")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = [diagnose(path, args.size, args.num) for path in args.checkpoints]
    Path(args.out).write_text(json.dumps({"command": "python benchmarks/examples/probe_transfer_diagnosis.py "
                                          + " ".join(args.checkpoints) + f" --size {args.size} --num {args.num}",
                                          "results": results}, indent=2) + "\n")
    for result in results:
        print(result["checkpoint"])
        for swap in result["swap"]:
            acc = swap["accuracy"]
            print(f"  {swap['layout']:8s} small {acc['small']:.1f}  large {acc['large']:.1f}  swapped in: "
                  + ", ".join(f"{k} {v:.1f}" for k, v in acc["large, swapped in"].items()))
        for row in result["cores"]:
            print(f"  {row['layout']:8s} {row['layer']:18s} {row['centring']:16s} blank/image "
                  + " ".join(f"{k}px {v:.2f}" for k, v in row["blank_ratio"].items()) + f"  unit change {row['unit_change']:.3f}")


if __name__ == "__main__":
    main()
