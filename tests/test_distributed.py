"""Data-parallel training under torchrun: 2 CPU processes (gloo) end with identical weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from conftest_train import make_image_folder, tiny_config

SCRIPT = """
import hashlib, json, os, sys
import torch
from weightformer.engine import train

config = json.loads(sys.argv[1])
result = train(config, task="classification")
digest = hashlib.sha256()
for name, tensor in sorted(result.model.state_dict().items()):
    digest.update(name.encode())
    digest.update(tensor.detach().contiguous().numpy().tobytes())
with open(os.path.join(sys.argv[2], f"rank{os.environ['RANK']}.txt"), "w") as f:
    f.write(digest.hexdigest())
"""


def test_torchrun_two_cpu_processes_keep_identical_weights(tmp_path: Path):
    data = make_image_folder(tmp_path / "data", train_per_class=8, val_per_class=3)
    output = tmp_path / "out"
    # Drop path and augmentation differ per rank; DDP's gradient averaging must still keep the weights equal.
    config = tiny_config(data, output, epochs=2, max_steps=3, model_kwargs={"patch_size": 4, "embed_dim": 32,
                         "depth": 2, "drop_path_rate": 0.1}, auto_augment="rand-m9-mstd0.5-inc1")
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(script), json.dumps(config), str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    hashes = [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)]
    assert hashes[0] == hashes[1]
    # Only rank 0 wrote the run folder; its records are reduced over both ranks' data.
    record = json.loads((output / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["world_size"] == 2 and record["step"] == 3
    saved = torch.load(output / "last.pt", weights_only=True)
    assert len(saved["rng"]) == 2 and saved["global_step"] == 3  # both ranks' random streams are kept
    assert proc.stdout.count("writing to") == 1  # only rank 0 prints
