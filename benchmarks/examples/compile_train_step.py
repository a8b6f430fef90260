"""What compiling buys a WeightFormer-T training step on the CPU, and what keeping the hand-written ops would.

    python benchmarks/examples/compile_train_step.py [--opaque] [--resolution 224] [--batch 16] [--threads 2]

Times the eager step and the step compiled as ``train --compile`` compiles it (``engine.loop.compiled``:
Inductor, dynamic shapes), side by side, median over ``--rounds`` rounds of 3 steps; prints each one's seconds
per step and eager's time over it (the speed-up). ``--opaque`` hides the two hand-written autograd ops from
Inductor (``gelu_linear`` and ``add_normalised_rows`` under ``torch.compiler.disable``, one graph break each),
so the compiled step calls them as eager does and Inductor compiles only what lies between them: an upper
bound on what registering them as ``torch.library`` custom ops would give, graph breaks apart.
"""

import argparse
import time

import torch

import weightformer.layers.dynamic_linear as dynamic_linear
import weightformer.models.weightformer as weightformer_model
from weightformer.bench.results import describe, machine_info
from weightformer.bench.subjects import TRAIN, get_subject, prepare
from weightformer.bench.timing import keep_freed_memory, median, paired_ratio, side_by_side
from weightformer.engine.loop import compiled

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--opaque", action="store_true", help="keep gelu_linear and add_normalised_rows out of the graph")
parser.add_argument("--resolution", type=int, default=224)
parser.add_argument("--batch", type=int, default=16)
parser.add_argument("--threads", type=int, default=2)
parser.add_argument("--rounds", type=int, default=5)
args = parser.parse_args()
torch.set_num_threads(args.threads)
keep_freed_memory()
print(describe(machine_info("cpu")))
if args.opaque:
    weightformer_model.gelu_linear = torch.compiler.disable(weightformer_model.gelu_linear)
    dynamic_linear.add_normalised_rows = torch.compiler.disable(dynamic_linear.add_normalised_rows)
subject = get_subject("cls", "wf-t")
steps = {"eager": prepare(subject, TRAIN, args.resolution, args.batch, "cpu")}
start = time.perf_counter()
model = compiled(subject.build(args.resolution, "cpu"), "inductor")
steps["compiled"] = prepare(subject, TRAIN, args.resolution, args.batch, "cpu", model=model)
steps["compiled"]()
steps["compiled"]()
print(f"compilation and two first steps: {time.perf_counter() - start:.0f} s")
seconds = side_by_side(steps, args.rounds, "cpu", {key: 3 for key in steps})
for key, samples in seconds.items():
    print(f"{key}: {median(samples):.3f} s per step, eager / {key} {paired_ratio(seconds['eager'], samples):.2f}×")
