"""The side-by-side timer: callables timed in interleaved rounds, so that drifts in load hit all alike; medians
over the rounds. The device is synchronised before the clock stops; the warm-up call is the caller's.
"""

from __future__ import annotations

import math
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


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("median of an empty sequence; measure at least one repetition")
    return float(statistics.median(values))
