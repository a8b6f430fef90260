#!/usr/bin/env bash
# The GPU checks, in the order a short lease can afford them:
#   1. where eager WeightFormer-T's time goes at 1248², bf16, batch 64 (a torch.profiler table by GPU time):
#      eager ran 5× slower than compiled on the H200 (benchmarks/results/gpu/README.md);
#   2. the per-sample depthwise convolution's two forms, eager (benchmarks/examples/dwconv_paths.py): the fold
#      eager runs against the taps compiled graphs run, alone and across the whole model;
#   3. benchmarks/gpu.py: 1248² eager, then compiled (each model at its largest batch, against DeiT-T with fused
#      and explicit attention), the compiled/bf16 agreement check, then 224². It writes its JSON after every
#      stage, so a run cut short by its time limit keeps what it measured.
# Writes into $OUT (default benchmarks/results/gpu/next). A compiled stage on a fresh machine spends minutes in
# Inductor (187 s for WeightFormer-T's batch search on 2026-12-04): give step 3 seven minutes or more.
#
#   OUT=/some/folder GPU_SECONDS=420 bash benchmarks/run_gpu.sh
#
# On this workplace's lent GPU machine (the package is not installed there): PYTHONPATH=$PWD/src, and a timm
# wheel carried in .whl when the machine's timm is older than pyproject.toml asks (benchmarks/results/gpu/README.md).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/gpu/next}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
nvidia-smi > "$OUT/nvidia_smi.txt" 2>&1
timeout 120 "$PYTHON" benchmarks/examples/profile_ops.py --device cuda --dtype bfloat16 --resolution 1248 --batch 64 \
    --rows 25 > "$OUT/profile_wf-t_infer_1248_b64_cuda.txt" 2>&1
timeout 120 "$PYTHON" benchmarks/examples/dwconv_paths.py --device cuda --dtype bfloat16 --resolution 1248 --batch 64 \
    > "$OUT/dwconv_paths_cuda.txt" 2>&1
timeout "${GPU_SECONDS:-420}" "$PYTHON" benchmarks/gpu.py --out-dir "$OUT" 2>&1 | tee "$OUT/gpu.log"
