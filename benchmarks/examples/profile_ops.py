"""Where the time goes: a torch.profiler table of one call of a benchmark subject (a forward or a training step).

    python benchmarks/examples/profile_ops.py --resolution 1248 --mode infer
    python benchmarks/examples/profile_ops.py --resolution 224 --batch 16 --mode train --model wf-t-naive
    python benchmarks/examples/profile_ops.py --resolution 224 --batch 16 --mode train --runtime compile
    python benchmarks/examples/profile_ops.py --device cuda --dtype bfloat16 --batch 64   # GPU kernels, by CUDA time

Under ``--runtime compile`` (torch.compile with Inductor and dynamic shapes, as ``train --compile``) Inductor's
own kernels are profiled too (``cpp_fused_*`` rows); matrix products stay ATen calls (``aten::mm``, ...).
"""

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from weightformer.bench.results import describe, machine_info
from weightformer.bench.checks import ALLOCATORS
from weightformer.bench.subjects import get_subject, prepare, suite
from weightformer.bench.timing import keep_freed_memory

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--model", default="wf-t", choices=list(suite("cls")))
parser.add_argument("--resolution", type=int, default=1248)
parser.add_argument("--batch", type=int, default=1)
parser.add_argument("--mode", default="infer", choices=["infer", "train"])
parser.add_argument("--steps", type=int, default=1, help="profiled calls after one warm-up call")
parser.add_argument("--rows", type=int, default=25)
parser.add_argument("--by-shape", action="store_true", help="group ops by input shapes as well")
parser.add_argument("--threads", type=int, default=2)
parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cuda: rows sorted by GPU time")
parser.add_argument("--runtime", default="eager", choices=["eager", "compile"])
parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="autocast dtype")
parser.add_argument("--allocator", default="cached", choices=ALLOCATORS,
                    help="cached: glibc keeps freed memory, as the sweep times (default); system: glibc's defaults")
args = parser.parse_args()
torch.set_num_threads(args.threads)
machine = machine_info(args.device)
machine["allocator"] = "keeps freed memory" if args.allocator == "cached" and keep_freed_memory() else "system"
print(describe(machine))
print(f"command: {machine['command']}")
print(f"{args.model} {args.mode} at {args.resolution}², batch {args.batch}, {args.steps} step(s), {args.runtime}, "
      f"{args.dtype}")
subject = get_subject("cls", args.model)
model = subject.build(args.resolution, args.device)
if args.runtime == "compile":
    import torch._inductor.config

    from weightformer.engine.loop import compiled

    torch._inductor.config.cpp.enable_kernel_profile = True  # a profiler row per generated CPU kernel
    model = compiled(model, "inductor")
call = prepare(subject, args.mode, args.resolution, args.batch, args.device, getattr(torch, args.dtype), model=model)
call()  # warm-up (and compilation)
call()
activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
with profile(activities=activities, record_shapes=args.by_shape) as prof:
    for _ in range(args.steps):
        call()
    if args.device == "cuda":
        torch.cuda.synchronize()
sort_by = "self_cuda_time_total" if args.device == "cuda" else "self_cpu_time_total"
print(prof.key_averages(group_by_input_shape=args.by_shape).table(sort_by=sort_by, row_limit=args.rows,
                                                                    max_name_column_width=60))
