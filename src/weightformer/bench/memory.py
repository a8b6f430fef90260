"""Peak memory of one inference call or training step.

On CUDA: ``torch.cuda.max_memory_allocated`` around the call, in this process (``cuda_peak``, also used
by benchmarks/gpu.py), after the same warm-up call as on the CPU.

On CPU: peak resident set size, measured in a fresh subprocess per point so that earlier points'
allocations cannot hide this one's. The worker builds the model (and, for a training step, AdamW),
runs one warm-up call on a 64×64 image (loading kernels; creating AdamW's state), frees the gradients, reads its
resident set size (the baseline), resets the kernel's high-water mark (``/proc/self/clear_refs``) and
runs one step at the measured size. ``peak`` is the high-water mark (VmHWM); ``extra`` is peak minus
baseline, i.e. activations, gradients and temporaries. glibc's mmap threshold is pinned at 128 KiB
in the worker so that freed tensors go back to the system and the resident set tracks live memory.

Running out of memory is a measured outcome, not a failure: it raises ``OutOfMemory`` (or torch's own
error), which ``is_oom`` recognises, and the sweep records the point as OOM and goes on.
"""

import argparse
import gc
import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from .timing import inference_call, synchronize, training_step
from .variants import INFER, TRAIN, build_variant, get_variant, random_batch

MIB = 2**20
_WARMUP_RESOLUTION = 64


class OutOfMemory(RuntimeError):
    """A benchmark point ran out of memory (in a memory worker, or its worker was killed for it)."""


def is_oom(error: BaseException) -> bool:
    """Whether ``error`` is an out-of-memory failure: CUDA's, the CPU allocator's, Python's, or a worker's."""
    if isinstance(error, (OutOfMemory, MemoryError, torch.OutOfMemoryError)):
        return True
    text = str(error).lower()
    # CUDA: "CUDA out of memory"; CPU allocator: "DefaultCPUAllocator: can't allocate memory: ..."
    return isinstance(error, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


@dataclass
class MemoryReport:
    """Peak memory of one call, in MiB: absolute peak, the baseline before the call, and the difference."""

    peak_mib: float
    baseline_mib: float
    extra_mib: float
    method: str

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


def _proc_status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        match = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"/proc/self/status has no {field} line; CPU memory needs Linux procfs")
    return int(match.group(1))


def _reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False if the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _step(variant_key: str, mode: str, resolution: int, batch: int, device: str, dtype: torch.dtype):
    """Build the model for one point and return (warm-up call, measured call)."""
    model = build_variant(get_variant(variant_key), resolution, device)
    small, small_labels = random_batch(1, _WARMUP_RESOLUTION, device)
    images, labels = random_batch(batch, resolution, device)
    if mode == INFER:
        return inference_call(model, small, dtype), inference_call(model, images, dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
    warm = training_step(model, small, small_labels, dtype, optimizer)
    measured = training_step(model, images, labels, dtype, optimizer)

    def warm_and_free() -> None:
        warm()
        optimizer.zero_grad(set_to_none=True)

    return warm_and_free, measured


def cuda_peak(call: Callable[[], Any], device: str) -> Tuple[int, int]:
    """(baseline, peak) allocated CUDA bytes around ``call()``: the peak counts only what ``call`` adds on top.

    Frees collectable memory first, so that garbage of earlier calls is neither baseline nor peak.
    """
    gc.collect()
    torch.cuda.empty_cache()
    synchronize(device)
    baseline = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    call()
    synchronize(device)
    return baseline, torch.cuda.max_memory_allocated(device)


def measure_cuda(
    variant_key: str, mode: str, resolution: int, batch: int, device: str, dtype: torch.dtype
) -> MemoryReport:
    """Peak CUDA memory of one call, in this process."""
    warm, call = _step(variant_key, mode, resolution, batch, device, dtype)
    warm()
    baseline, peak = cuda_peak(call, device)
    return MemoryReport(peak / MIB, baseline / MIB, (peak - baseline) / MIB, "torch.cuda.max_memory_allocated")


def _measure_cpu_here(variant_key: str, mode: str, resolution: int, batch: int, dtype: torch.dtype) -> MemoryReport:
    warm, call = _step(variant_key, mode, resolution, batch, "cpu", dtype)
    warm()
    gc.collect()
    baseline = _proc_status_kib("VmRSS")
    method = "VmHWM after clear_refs, fresh subprocess"
    if not _reset_peak_rss():
        method = "VmHWM without reset (peak may include setup), fresh subprocess"
    call()
    peak = _proc_status_kib("VmHWM")
    return MemoryReport(peak / 1024, baseline / 1024, (peak - baseline) / 1024, method)


def measure_cpu(
    variant_key: str,
    mode: str,
    resolution: int,
    batch: int,
    dtype: torch.dtype = torch.float32,
    threads: Optional[int] = None,
    timeout_s: Optional[float] = None,
) -> MemoryReport:
    """Peak RSS of one call, measured in a fresh Python subprocess (see the module docstring)."""
    spec = {
        "variant": variant_key,
        "mode": mode,
        "resolution": resolution,
        "batch": batch,
        "dtype": str(dtype).removeprefix("torch."),
        "threads": threads or torch.get_num_threads(),
    }
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    proc = subprocess.run(
        [sys.executable, "-m", "weightformer.bench.memory", json.dumps(spec)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
    )
    if proc.returncode == -signal.SIGKILL:
        raise OutOfMemory(f"memory worker for {spec} was killed by SIGKILL, most likely by the out-of-memory killer")
    if proc.returncode != 0:
        last = proc.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise RuntimeError(f"memory worker for {spec} failed with exit code {proc.returncode}: {last[0]}")
    document = json.loads(proc.stdout.strip().splitlines()[-1])
    if "oom" in document:
        raise OutOfMemory(document["oom"])
    return MemoryReport(**document)


def measure(
    variant_key: str,
    mode: str,
    resolution: int,
    batch: int,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    timeout_s: Optional[float] = None,
) -> MemoryReport:
    """Peak memory of one ``mode`` call ("infer" or "train"): CUDA allocator on GPU, subprocess RSS on CPU."""
    if mode not in (INFER, TRAIN):
        raise ValueError(f"mode must be {INFER!r} or {TRAIN!r}, got {mode!r}")
    if torch.device(device).type == "cuda":
        return measure_cuda(variant_key, mode, resolution, batch, device, dtype)
    return measure_cpu(variant_key, mode, resolution, batch, dtype, timeout_s=timeout_s)


def _worker(argv: Optional[list] = None) -> None:
    parser = argparse.ArgumentParser(description="Measure the peak RSS of one benchmark point (internal).")
    parser.add_argument("spec", help="JSON: variant, mode, resolution, batch, dtype, threads")
    spec = json.loads(parser.parse_args(argv).spec)
    torch.set_num_threads(spec["threads"])
    try:
        report = _measure_cpu_here(
            spec["variant"], spec["mode"], spec["resolution"], spec["batch"], getattr(torch, spec["dtype"])
        )
    except (RuntimeError, MemoryError) as error:
        if not is_oom(error):
            raise
        print(json.dumps({"oom": str(error).splitlines()[0] if str(error) else type(error).__name__}))
        return
    print(json.dumps(report.as_dict()))


if __name__ == "__main__":
    _worker()
