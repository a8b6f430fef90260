"""The memory probe: the extra peak memory of one call of a subject over a warmed-up process.

CUDA: ``max_memory_allocated`` during the call minus ``memory_allocated`` before it, after a warm-up call.
CPU: in a fresh subprocess per point (glibc's mmap threshold at 128 KiB, so freed tensors leave the resident
set), VmHWM after ``clear_refs`` minus the resident set after the warm-up call. Running out of memory is a
measured outcome (:class:`OutOfMemory`, or torch's own error, both recognised by :func:`is_oom`).
"""

from __future__ import annotations

import gc
import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, Optional, Tuple

from ..engine.errors import is_out_of_memory
from ..engine.metrics import json_text
from .subjects import get_subject, make_call

MIB = 2**20
CPU_METHOD = "VmHWM after clear_refs, fresh subprocess"
CUDA_METHOD = "torch.cuda.max_memory_allocated"


class OutOfMemory(RuntimeError):
    """A point ran out of memory (in a memory worker, or its worker was killed for it)."""


def is_oom(error: BaseException) -> bool:
    """Whether ``error`` is an out-of-memory failure: CUDA's, the CPU allocator's, Python's, or a worker's."""
    return isinstance(error, OutOfMemory) or is_out_of_memory(error)


def first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def release(device: str) -> None:
    """Collect garbage (and empty CUDA's cache)."""
    gc.collect()
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


def guarded(fn: Callable[[], Any], device: str = "cpu") -> Tuple[Any, Optional[str]]:
    """``(fn(), None)``, or ``(None, the error's first line)`` when it ran out of memory (memory then released)."""
    try:
        return fn(), None
    except (RuntimeError, MemoryError) as error:
        if not is_oom(error):
            raise
        reason = first_line(error)
    release(device)  # outside the handler, so that the error's frames no longer hold tensors
    return None, reason


@dataclass
class MemoryReport:
    """Peak memory of one call in MiB: the peak, the baseline before the call, the difference, and how."""

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


def cuda_peak(call: Callable[[], Any], device: str) -> Tuple[int, int]:
    """(baseline, peak) allocated CUDA bytes around ``call()``, garbage of earlier calls collected first."""
    import torch

    from .timing import synchronize

    gc.collect()
    torch.cuda.empty_cache()
    synchronize(device)
    baseline = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    call()
    synchronize(device)
    return baseline, torch.cuda.max_memory_allocated(device)


def _warm_and_measured(spec: Dict[str, Any], device: str) -> Tuple[Callable[[], None], Callable[[], None]]:
    """The warm-up call (gradients freed after it) and the measured call of one point, on one model."""
    import torch

    subject = get_subject(spec["suite"], spec["name"])
    dtype = getattr(torch, spec.get("dtype", "float32"))
    model = subject.build(spec["size"], device, **spec.get("build", {}))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05) if subject.optimizer else None
    small, small_target = subject.inputs(1, subject.warmup, device)
    args, target = subject.inputs(spec["batch"], spec["size"], device)
    if subject.fixed_size:
        warm = make_call(subject, subject.build(subject.warmup, device, **spec.get("build", {})), spec["mode"],
                         small, small_target, dtype)
    else:
        warm = make_call(subject, model, spec["mode"], small, small_target, dtype, optimizer)
    measured = make_call(subject, model, spec["mode"], args, target, dtype, optimizer)

    def warm_and_free() -> None:
        warm()
        model.zero_grad(set_to_none=True)

    return warm_and_free, measured


def _measure_cpu_here(spec: Dict[str, Any]) -> MemoryReport:
    warm, call = _warm_and_measured(spec, "cpu")
    warm()
    gc.collect()
    baseline = _proc_status_kib("VmRSS")
    method = CPU_METHOD if _reset_peak_rss() else "VmHWM without reset (peak may include setup), fresh subprocess"
    call()
    peak = _proc_status_kib("VmHWM")
    return MemoryReport(peak / 1024, baseline / 1024, (peak - baseline) / 1024, method)


def measure_cpu(spec: Dict[str, Any], timeout_s: Optional[float] = None) -> MemoryReport:
    import torch

    spec = {"threads": torch.get_num_threads(), **spec}
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    proc = subprocess.run([sys.executable, "-m", "weightformer.bench.memory", json.dumps(spec)],
                          capture_output=True, text=True, env=env, timeout=timeout_s)
    if proc.returncode == -signal.SIGKILL:
        raise OutOfMemory(f"memory worker for {spec} was killed by SIGKILL, most likely by the out-of-memory killer")
    if proc.returncode != 0:
        last = proc.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise RuntimeError(f"memory worker for {spec} failed with exit code {proc.returncode}: {last[0]}")
    document = json.loads(proc.stdout.strip().splitlines()[-1])
    if "oom" in document:
        raise OutOfMemory(document["oom"])
    return MemoryReport(**document)


def measure(suite: str, name: str, mode: str, size: Any, batch: int, device: str = "cpu", dtype: str = "float32",
            timeout_s: Optional[float] = None, **build: Any) -> MemoryReport:
    """Extra peak memory of one ``mode`` call ("infer" or "train") of subject ``name`` of ``suite``; ``build``
    goes to the subject's builder."""
    if mode not in ("infer", "train"):
        raise ValueError(f"mode must be 'infer' or 'train', got {mode!r}")
    spec = {"suite": suite, "name": name, "mode": mode, "size": size, "batch": batch, "dtype": dtype, "build": build}
    if not str(device).startswith("cuda"):
        return measure_cpu(spec, timeout_s)
    warm, call = _warm_and_measured(spec, device)
    warm()
    baseline, peak = cuda_peak(call, device)
    return MemoryReport(peak / MIB, baseline / MIB, (peak - baseline) / MIB, CUDA_METHOD)


def _worker(argv: Optional[list] = None) -> None:
    import torch

    spec = json.loads((argv or sys.argv[1:])[0])
    torch.set_num_threads(spec["threads"])
    try:
        report = _measure_cpu_here(spec)
    except (RuntimeError, MemoryError) as error:
        if not is_oom(error):
            raise
        print(json_text({"oom": str(error).splitlines()[0] if str(error) else type(error).__name__}))
        return
    print(json_text(report.as_dict()))


if __name__ == "__main__":
    _worker()
