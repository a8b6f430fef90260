"""Where the time goes: a torch.profiler table of one WeightFormer (or DeiT) forward or training step.

    python benchmarks/profile_ops.py --resolution 1248 --mode infer
    python benchmarks/profile_ops.py --resolution 224 --batch 16 --mode train --model wf-t-naive

Runs one warm-up call, then profiles ``--steps`` calls and prints the top ops by self CPU time
(with ``--by-shape``, grouped by input shapes too). Used to explain targets that are not met.
"""

import argparse
import sys
from typing import List, Optional

import torch
from torch.profiler import ProfilerActivity, profile

from weightformer.bench.machine import describe, machine_info
from weightformer.bench.timing import inference_call, synchronize, training_step
from weightformer.bench.variants import INFER, TRAIN, VARIANTS, build_variant, get_variant, random_batch


def profile_table(
    model_key: str,
    resolution: int,
    batch: int,
    mode: str,
    steps: int = 1,
    rows: int = 25,
    by_shape: bool = False,
    device: str = "cpu",
) -> str:
    """The profiler's key-averages table for ``steps`` calls, sorted by self device (or CPU) time."""
    model = build_variant(get_variant(model_key), resolution, device)
    images, labels = random_batch(batch, resolution, device)
    call = inference_call(model, images) if mode == INFER else training_step(model, images, labels)
    call()
    synchronize(device)
    activities = [ProfilerActivity.CPU]
    sort_by = "self_cpu_time_total"
    if torch.device(device).type == "cuda":
        activities.append(ProfilerActivity.CUDA)
        sort_by = "self_cuda_time_total"
    with profile(activities=activities, record_shapes=by_shape) as prof:
        for _ in range(steps):
            call()
        synchronize(device)
    return prof.key_averages(group_by_input_shape=by_shape).table(sort_by=sort_by, row_limit=rows, max_name_column_width=60)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="wf-t", choices=list(VARIANTS))
    parser.add_argument("--resolution", type=int, default=1248)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--mode", default=INFER, choices=[INFER, TRAIN])
    parser.add_argument("--steps", type=int, default=1, help="profiled calls after one warm-up call")
    parser.add_argument("--rows", type=int, default=25)
    parser.add_argument("--by-shape", action="store_true", help="group ops by input shapes as well")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    machine = machine_info(args.device)
    print(describe(machine))
    print(f"command: {machine['command']}")
    print(f"{args.model} {args.mode} at {args.resolution}², batch {args.batch}, {args.steps} step(s)")
    print(profile_table(args.model, args.resolution, args.batch, args.mode, args.steps, args.rows, args.by_shape, args.device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
