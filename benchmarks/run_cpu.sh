#!/usr/bin/env bash
# Regenerate the committed CPU results: the sweep, the targets, and the profiles that explain them.
# Run on a quiet machine; extra arguments go to the sweep (e.g. --resolutions 224,448 for a quick look).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m weightformer.bench --device cpu --threads 2 --out benchmarks/results/cpu --overwrite "$@"  # earlier results move aside
python benchmarks/targets.py --threads 2 --out benchmarks/results/targets_cpu.json
python benchmarks/profile_ops.py --model wf-t --mode infer --resolution 1248 > benchmarks/results/cpu/profile_wf-t_infer_1248.txt
python benchmarks/profile_ops.py --model wf-t --mode train --resolution 224 --batch 16 > benchmarks/results/cpu/profile_wf-t_train_224_b16.txt
