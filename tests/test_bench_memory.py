"""Out of memory is a measured outcome (an "oom" row, the sweep goes on); other errors keep their traceback.
Also the one CUDA peak-memory helper, shared by the sweep and benchmarks/gpu.py (checked with a fake CUDA)."""

import importlib.util
import json
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from weightformer.bench import memory, sweep
from weightformer.bench.subjects import Subject
from weightformer.bench.sweep import Sweep, SweepConfig, markdown_table

REPO = Path(__file__).resolve().parents[1]


def _tiny(**kwargs) -> SweepConfig:
    settings = dict(models=["wf-t", "deit-t"], resolutions=[32], measurements=("infer",), repetitions=1,
                    min_rep_seconds=0.0, threads=1)
    return SweepConfig(**{**settings, **kwargs})


def _failing_build(monkeypatch, error: BaseException, model: str = "deit-t") -> None:
    get_subject = sweep.get_subject

    def failing(suite, name):
        subject = get_subject(suite, name)
        if name != model:
            return subject

        def build(resolution, device="cpu"):
            if device != "meta":
                raise error
            return subject.build(resolution, device)

        return Subject(**{**subject.__dict__, "build": build})

    monkeypatch.setattr(sweep, "get_subject", failing)


@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"),
        RuntimeError("[enforce fail at alloc_cpu.cpp:121] DefaultCPUAllocator: can't allocate memory: you tried to "
                     "allocate 68719476736 bytes. Error code 12 (Cannot allocate memory)"),
        MemoryError(),
    ],
    ids=["cuda", "cpu-allocator", "python"],
)
def test_out_of_memory_is_recorded_and_the_sweep_goes_on(monkeypatch, error):
    _failing_build(monkeypatch, error)
    result = Sweep(_tiny(), log=lambda _: None).run()
    rows = {r["model"]: r for r in result["rows"]}
    assert rows["wf-t"]["status"] == "ok" and rows["wf-t"]["value"] > 0
    assert rows["deit-t"]["status"] == "oom" and rows["deit-t"]["reason"].startswith("out of memory")
    assert "| DeiT-T fused attn | — | — | OOM |" in markdown_table(result)


def test_other_errors_keep_their_traceback(monkeypatch):
    _failing_build(monkeypatch, RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        Sweep(_tiny(), log=lambda _: None).run()


def _fake_worker(monkeypatch, returncode: int, stdout: str = "") -> None:
    def run(args, **kwargs):
        return subprocess.CompletedProcess(args, returncode, stdout=stdout, stderr="")

    monkeypatch.setattr(memory.subprocess, "run", run)


def test_memory_worker_killed_by_the_oom_killer_is_an_oom_point(monkeypatch):
    _fake_worker(monkeypatch, -signal.SIGKILL)
    result = Sweep(_tiny(models=["wf-t"], measurements=("memory",), memory_modes=("infer",)), log=lambda _: None).run()
    [row] = result["rows"]
    assert row["status"] == "oom" and "SIGKILL" in row["reason"]


def test_memory_worker_out_of_memory_is_reported_not_raised(monkeypatch, capsys):
    monkeypatch.setattr(memory, "_measure_cpu_here", lambda *a: (_ for _ in ()).throw(MemoryError()))
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # the worker's own process setting
    spec = {"suite": "cls", "name": "wf-t", "mode": "infer", "size": 32, "batch": 1, "dtype": "float32", "threads": 1}
    memory._worker([json.dumps(spec)])
    report = json.loads(capsys.readouterr().out)
    assert report == {"oom": "MemoryError"}
    _fake_worker(monkeypatch, 0, json.dumps(report) + "\n")
    with pytest.raises(memory.OutOfMemory):
        memory.measure("cls", "wf-t", "infer", 32, 1)
    _fake_worker(monkeypatch, 1)  # a worker that fails otherwise is a bug: it raises, and is no OOM
    with pytest.raises(RuntimeError, match="exit code 1") as failure:
        memory.measure("cls", "wf-t", "infer", 32, 1)
    assert not memory.is_oom(failure.value)


class FakeCuda:
    """Just enough of torch.cuda's memory statistics to follow one peak measurement."""

    def __init__(self):
        self.allocated, self.peak, self.events = 100, 100, []

    def install(self, monkeypatch):
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "empty_cache", lambda: self.events.append("empty_cache"))
        monkeypatch.setattr(cuda, "synchronize", lambda device=None: self.events.append("sync"))
        monkeypatch.setattr(cuda, "memory_allocated", lambda device=None: self.allocated)
        monkeypatch.setattr(cuda, "max_memory_allocated", lambda device=None: self.peak)
        monkeypatch.setattr(cuda, "reset_peak_memory_stats", lambda device=None: self._reset())

    def _reset(self):
        self.events.append("reset")
        self.peak = self.allocated

    def allocate(self, nbytes):
        self.events.append("call")
        self.peak = max(self.peak, self.allocated + nbytes)


def test_cuda_peak_counts_only_the_call(monkeypatch):
    fake = FakeCuda()
    fake.install(monkeypatch)
    fake.peak = 10_000  # an earlier call's peak must not count
    assert memory.cuda_peak(lambda: fake.allocate(500), "cuda") == (100, 600)
    assert fake.events.index("reset") < fake.events.index("call") < len(fake.events) - 1
    assert fake.events[-1] == "sync"  # the call's queued work is done before the peak is read


def test_gpu_script_uses_the_shared_cuda_peak(monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_gpu", REPO / "benchmarks" / "gpu.py")
    gpu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu)
    fake = FakeCuda()
    fake.install(monkeypatch)
    monkeypatch.setattr(gpu, "_images", lambda batch, resolution, device: None)
    monkeypatch.setattr(gpu, "inference_call", lambda model, images, dtype: lambda: fake.allocate(2**30))
    assert gpu.cuda_peak is memory.cuda_peak
    assert gpu.peak_memory(None, 8, 1248, "cuda") == {"batch": 8, "peak_gib": (100 + 2**30) / 2**30, "extra_gib": 1.0}
