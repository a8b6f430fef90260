"""More than one machine: two torchrun "nodes" on this one (c10d rendezvous on 127.0.0.1, one process each) end 6
deterministic steps of the bundled job with the same weights as one node with two processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest_train import assert_same_weights, weights

# A tiny model and 6 steps of the bundled job: the run is the rendezvous and the evaluation, a few seconds.
TRAIN = ["-m", "weightformer", "train", "--max-steps", "6", "--deterministic", "--model-kwargs", "embed_dim=32",
         "depth=2", "--batch-size", "16", "--device", "cpu", "--workers", "0"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(nodes: int, procs_per_node: int, data: str, output: Path) -> None:
    """``nodes`` torchrun launchers side by side, each starting ``procs_per_node`` processes, meeting at one
    c10d rendezvous on 127.0.0.1 (as on a cluster, but with one host's address)."""
    endpoint = f"127.0.0.1:{free_port()}"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    launchers = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--nproc-per-node",
         str(procs_per_node), "--node-rank", str(rank),  # read by the static rendezvous only; c10d numbers the nodes
         "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
         "--rdzv-id", output.name, *TRAIN, "--data", data, "--output", str(output)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) for rank in range(nodes)]
    try:
        logs = [launcher.communicate(timeout=300)[0] for launcher in launchers]
    finally:  # one launcher failed to start: the other would wait at the rendezvous
        for launcher in launchers:
            if launcher.poll() is None:
                launcher.kill()
    for launcher, log in zip(launchers, logs):
        assert launcher.returncode == 0, log[-3000:]


# The --data values the test runs: the bundled set (a folder-like source) and tar shards of a probe, streamed.
DATA = [pytest.param("mnist", id="bundled"), pytest.param("shards", id="tar-shards")]


@pytest.mark.parametrize("data", DATA)
def test_two_nodes_end_with_the_weights_of_one_node_with_two_processes(tmp_path: Path, data: str):
    if data == "shards":
        from weightformer.data.pack import pack_dataset

        pack_dataset("glyph_match:size=32,train=64,val=16", tmp_path / "shards", shard_size=20, verbose=False)
        data = str(tmp_path / "shards")
    torchrun(nodes=2, procs_per_node=1, data=data, output=tmp_path / "two-nodes")
    torchrun(nodes=1, procs_per_node=2, data=data, output=tmp_path / "one-node")
    for run in ("two-nodes", "one-node"):
        record = json.loads((tmp_path / run / "metrics.jsonl").read_text().splitlines()[-1])
        assert record["world_size"] == 2 and record["step"] == 6
    assert_same_weights(weights(tmp_path / "two-nodes" / "last.pt"), weights(tmp_path / "one-node" / "last.pt"))
