"""The side-by-side timer: callables timed in interleaved rounds, so that drifts in load hit all alike; medians
over the rounds, and ratios as the median of each round's ratio. The device is synchronised before the clock
stops; the warm-up call is the caller's. :func:`keep_freed_memory` is the allocator policy timings run under.
"""

from __future__ import annotations

import ctypes
import math
import platform
import statistics
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence


def synchronize(device: str) -> None:
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], object], device: str = "cpu", iterations: int = 1) -> float:
    """Seconds per call of ``fn``, averaged over ``iterations`` back-to-back calls."""
    synchronize(device)
    start = time.perf_counter()
    for _ in range(iterations):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) / iterations


def iterations_for(seconds_per_call: float, min_seconds: float) -> int:
    return max(1, math.ceil(min_seconds / max(seconds_per_call, 1e-9)))


def side_by_side(calls: Mapping[str, Callable[[], object]], repetitions: int, device: str = "cpu",
                 iterations: Optional[Mapping[str, int]] = None) -> Dict[str, List[float]]:
    """Seconds per call of each callable, ``repetitions`` rounds of ``iterations[key]`` (default 1) calls each."""
    samples: Dict[str, List[float]] = {key: [] for key in calls}
    for _ in range(repetitions):
        for key, fn in calls.items():
            samples[key].append(time_call(fn, device, (iterations or {}).get(key, 1)))
    return samples


def paired_ratio(numerator: Sequence[float], denominator: Sequence[float]) -> float:
    """The median over rounds of ``numerator[i] / denominator[i]``: two callables timed side by side share each
    round's load, so a drift that slows both leaves their ratio (their medians' ratio does not cancel it)."""
    if len(numerator) != len(denominator) or not numerator:
        raise ValueError(f"paired ratio of {len(numerator)} and {len(denominator)} rounds; time both side by side")
    return median([a / b for a, b in zip(numerator, denominator)])


# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_NEVER_TRIM, _MMAP_ABOVE = 2**31 - 1, 2**30


_KEPT: list[bool] = []  # whether keep_freed_memory() changed this process's malloc


def allocator_policy() -> str:
    """What this process's malloc does with freed memory, for a result's machine line."""
    return "keeps freed memory" if _KEPT else "system"


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory in the process for reuse, as jemalloc and tcmalloc do (PyTorch's
    CPU tuning guide preloads one of them). By default glibc hands large freed blocks back to the kernel, so the
    next call faults its pages in again: on a 2-core VM 15,000-100,000 faults per 224² WeightFormer-S or DeiT-S
    forward, a number that changes with what ran before in the process and moves a model's time by up to 5%.
    For the rest of the process; False where the C library is not glibc (nothing changed)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL("libc.so.6")
    kept = bool(libc.mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM)) and bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_ABOVE))
    if kept and not _KEPT:
        _KEPT.append(True)
    return kept


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("median of an empty sequence; measure at least one repetition")
    return float(statistics.median(values))
