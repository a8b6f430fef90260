"""The engine's other tasks under torchrun: 2 CPU processes (gloo) train detection, segmentation and
generation and end with identical weights, with one run folder written by rank 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from weightformer.detection import synthetic as det_synthetic
from weightformer.segmentation.synthetic import write_shapes as write_seg_shapes

SCRIPT = """
import hashlib, json, os, sys
from weightformer.engine import train
from weightformer.detection.task import DetectionTask
from weightformer.segmentation.task import SegmentationTask
from weightformer.generation.task import GenerationTask

task, config = sys.argv[1], json.loads(sys.argv[2])
result = train(config, task={"det": DetectionTask, "seg": SegmentationTask, "gen": GenerationTask}[task])
digest = hashlib.sha256()
for name, tensor in sorted(result.model.state_dict().items()):
    digest.update(name.encode())
    digest.update(tensor.detach().contiguous().numpy().tobytes())
with open(os.path.join(sys.argv[3], f"rank{os.environ['RANK']}.txt"), "w") as f:
    f.write(digest.hexdigest())
"""

COMMON = dict(model="weightformer_tiny", batch_size=2, epochs=1, warmup_epochs=0, max_steps=2, workers=0,
              device="cpu", log_interval=1000, hflip=0.5)
DETECTOR = {"embed_dim": 32, "depth": 2, "drop_path_rate": 0.1, "conv_dim": 32, "fc_dim": 64,
            "rpn_pre_nms_top_n_train": 50, "rpn_post_nms_top_n_train": 16, "rpn_pre_nms_top_n_test": 20,
            "rpn_post_nms_top_n_test": 8, "box_batch_size_per_image": 8}
SEGMENTER = {"embed_dim": 32, "depth": 2, "drop_path_rate": 0.1, "channels": 16, "pyramid_channels": 16,
             "aux_channels": 8}


def _write_image_folder(root: Path) -> Path:
    """16 px RGB noise images in two classes, 4 train and 1 val image each."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in (("train", 4), ("val", 1)):
        for label in (0, 1):
            (root / split / f"c{label}").mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / f"c{label}" / f"{i}.png")
    return root


@pytest.mark.parametrize("task", ["det", "seg", "gen"])
def test_torchrun_two_cpu_processes_keep_identical_weights(tmp_path: Path, task: str):
    if task == "det":
        data = det_synthetic.write_shapes(tmp_path / "data", seed=2, split_sizes={"train": 8, "val": 2})
        config = dict(COMMON, data=str(data), model_kwargs=DETECTOR, img_size=64, cascade=True)
    elif task == "seg":
        data = write_seg_shapes(tmp_path / "data", train=8, val=2)
        config = dict(COMMON, data=str(data), model_kwargs=SEGMENTER, img_size=32, num_classes=4)
    else:  # label dropout, timesteps and noise differ per rank; DDP and the EMA must not
        data = _write_image_folder(tmp_path / "data")
        config = dict(COMMON, data=str(data), model="wf_dit_s_4", model_kwargs={"hidden_size": 32, "depth": 2},
                      img_size=16, ema=True, ema_decay=0.9, weight_decay=0.0)
    output = tmp_path / "out"
    config["output"] = str(output)
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(SCRIPT))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(script), task, json.dumps(config), str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    hashes = [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)]
    assert hashes[0] == hashes[1]  # drop path and jitter differ per rank; DDP keeps the weights equal
    record = json.loads((output / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["world_size"] == 2 and record["step"] == 2
    assert torch.load(output / "last.pt", weights_only=True)["global_step"] == 2
