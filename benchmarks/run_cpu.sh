#!/usr/bin/env bash
# Regenerate every committed CPU benchmark table, in order: the sweep (benchmarks/results/cpu), the same models
# compiled and in bf16 (cpu/fast_paths), the targets,
# the profiles that explain them, the DiT table (cpu/dit), the dense cost table (cpu/dense) and the export
# runtimes (cpu/export). Each table records the machine, the threads, the load average when it started and
# its command. Run on an otherwise idle machine (2 threads): about 75 minutes on an idle 2-core machine.
# Extra arguments go to the sweep (e.g. --resolutions 224,448 for a quick look); a sweep that dies continues
# with the same command and --resume. Earlier results are moved aside (<name>.previous-<time>), never deleted.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
python -m weightformer.bench --device cpu --threads 2 --out benchmarks/results/cpu --overwrite "$@"
python -m weightformer.bench --device cpu --threads 2 --models wf-t,deit-t --resolutions 224,624,1248 \
    --batch 224:16,1 --measure infer,train --train-resolutions 224,624,1248 --runtime eager,compile \
    --dtype float32,bfloat16 --max-call-seconds 8 --out benchmarks/results/cpu/fast_paths --overwrite
python benchmarks/targets.py --threads 2 --sweep-results benchmarks/results/cpu/results.json \
    --out benchmarks/results/targets_cpu.json
python benchmarks/examples/profile_ops.py --model wf-t --mode infer --resolution 1248 > benchmarks/results/cpu/profile_wf-t_infer_1248.txt
for model in wf-t deit-t; do
    python benchmarks/examples/profile_ops.py --model $model --mode train --resolution 224 --batch 16 --steps 3 --rows 22 \
        > benchmarks/results/cpu/profile_${model}_train_224_b16.txt
done
python -m weightformer.bench --device cpu --threads 2 --models wf-t,deit-t,wf-s,deit-s --resolutions 224 \
    --measure infer,train --repetitions 9 --allocator cached --out benchmarks/results/cpu/allocator_224/cached --overwrite
python -m weightformer.bench --device cpu --threads 2 --models wf-t,deit-t,wf-s,deit-s --resolutions 224 \
    --measure infer,train --repetitions 9 --allocator system --out benchmarks/results/cpu/allocator_224/system --overwrite
python -m weightformer.bench dit --device cpu --threads 2 --out benchmarks/results/cpu/dit --overwrite
OMP_NUM_THREADS=2 python -m weightformer.bench dense --device cpu --modes infer --max-call-seconds 45 \
    --out benchmarks/results/cpu/dense --overwrite
python -m weightformer.bench export --repeats 1 --out benchmarks/results/cpu/export --overwrite
