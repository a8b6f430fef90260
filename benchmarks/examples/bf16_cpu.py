"""bf16 autocast against float32 on the CPU: the logits of WeightFormer-T and DeiT-T (timm's random
initialisation, seed 0; no pretrained weights are read) for a batch of 2 N(0, 1) images at each ``--sizes``
side, their max abs and relative-norm difference. Speed is the sweep's: ``weightformer bench --dtype
float32,bfloat16`` (docs/bench.md, "Compiled and bf16").

    python benchmarks/examples/bf16_cpu.py --json benchmarks/results/cpu/bf16.json
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import timm
import torch

import weightformer  # noqa: F401  (registers the models)
from weightformer.atomic import write_atomic
from weightformer.bench.results import machine_info

MODELS = ("weightformer_tiny", "deit_tiny_patch16_224")


def create(name: str, size: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(name, **({"img_size": size} if name.startswith("deit") else {}))


def autocast(amp: str) -> torch.autocast:
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp == "bf16")


def logit_difference(name: str, size: int) -> dict[str, Any]:
    model = create(name, size).eval()
    x = torch.randn(2, 3, size, size)  # (B, C, H, W)

    def forward(amp: str) -> torch.Tensor:
        with torch.no_grad(), autocast(amp):
            return model(x).float()  # (B, 1000)

    ref, low = forward("fp32"), forward("bf16")
    return {"model": name, "size": size, "batch": 2, "max_abs_diff": (low - ref).abs().max().item(),
            "fp32_max_abs": ref.abs().max().item(), "rel_norm_diff": ((low - ref).norm() / ref.norm()).item()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[224, 624], help="inference sides (default: 224 624)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    parser.add_argument("--json", help="also write the rows and the machine to this file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    machine = machine_info()
    rows = []
    for name in MODELS:
        for size in args.sizes:
            row = logit_difference(name, size)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        write_atomic(args.json, json.dumps({"machine": machine, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
