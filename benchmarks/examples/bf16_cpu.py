"""bf16 autocast against float32 on the CPU, for WeightFormer-T and DeiT-T with timm's random initialisation (seed 0;
no pretrained weights are read):

- logits of a batch of 2 N(0, 1) images at each ``--sizes`` side: max abs and relative-norm difference, and the
  seconds of one forward pass;
- the seconds of one training step (forward, cross-entropy in float32, backward, AdamW) at 224 px, batch 16.

float32 and bf16 passes alternate, so both see the same load; each figure is the median of ``--repeats`` passes
after a warm-up, in wall-clock and in CPU seconds of the process (the figure that holds on a loaded machine,
with one thread).

    OMP_NUM_THREADS=1 python benchmarks/examples/bf16_cpu.py --json benchmarks/results/cpu/bf16.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Callable

import timm
import torch

import weightformer  # noqa: F401  (registers the models)
from weightformer.atomic import write_atomic
from weightformer.bench.results import machine_info

MODELS = ("weightformer_tiny", "deit_tiny_patch16_224")


def create(name: str, size: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(name, **({"img_size": size} if name.startswith("deit") else {}))


def timed(passes: dict[str, Callable[[], Any]], repeats: int) -> dict[str, dict[str, float]]:
    """Median wall and CPU seconds of each pass, the passes alternating; one warm-up round first."""
    spent: dict[str, list[tuple[float, float]]] = {name: [] for name in passes}
    for round_ in range(repeats + 1):
        for name, run in passes.items():
            wall, cpu = time.perf_counter(), time.process_time()
            run()
            if round_:
                spent[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    return {name: {"wall_s": statistics.median(w for w, _ in s), "cpu_s": statistics.median(c for _, c in s)}
            for name, s in spent.items()}


def autocast(amp: str) -> torch.autocast:
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp == "bf16")


def inference(name: str, size: int, repeats: int) -> dict[str, Any]:
    model = create(name, size).eval()
    x = torch.randn(2, 3, size, size)  # (B, C, H, W)

    def forward(amp: str) -> torch.Tensor:
        with torch.no_grad(), autocast(amp):
            return model(x).float()  # (B, 1000)

    ref, low = forward("fp32"), forward("bf16")
    times = timed({amp: lambda amp=amp: forward(amp) for amp in ("fp32", "bf16")}, repeats)
    return {"model": name, "mode": "infer", "size": size, "batch": 2,
            "max_abs_diff": (low - ref).abs().max().item(), "fp32_max_abs": ref.abs().max().item(),
            "rel_norm_diff": ((low - ref).norm() / ref.norm()).item(), "fp32": times["fp32"], "bf16": times["bf16"],
            "speedup_cpu": times["fp32"]["cpu_s"] / times["bf16"]["cpu_s"]}


def training(name: str, repeats: int) -> dict[str, Any]:
    x, y = torch.randn(16, 3, 224, 224), torch.randint(0, 1000, (16,))  # (B, C, H, W), (B,)
    steps = {}
    for amp in ("fp32", "bf16"):
        model = create(name, 224).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(amp: str = amp, model: torch.nn.Module = model, optimizer: torch.optim.Optimizer = optimizer) -> None:
            with autocast(amp):
                loss = torch.nn.functional.cross_entropy(model(x).float(), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

        steps[amp] = step
    times = timed(steps, repeats)
    return {"model": name, "mode": "train", "size": 224, "batch": 16, "fp32": times["fp32"], "bf16": times["bf16"],
            "speedup_cpu": times["fp32"]["cpu_s"] / times["bf16"]["cpu_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[224, 624], help="inference sides (default: 224 624)")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes of each kind (default: 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    parser.add_argument("--json", help="also write the rows and the machine to this file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    machine = machine_info()  # at the start: the load average the measurements began under
    rows = []
    for name in MODELS:
        for row in [*(inference(name, size, args.repeats) for size in args.sizes), training(name, args.repeats)]:
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        write_atomic(args.json, json.dumps({"machine": machine, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
