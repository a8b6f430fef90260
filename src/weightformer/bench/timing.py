"""The side-by-side timer: callables timed in interleaved rounds, one timed repetition of each per
round, so that drifts in machine load hit all of them alike; medians over the rounds.

Every timed call synchronises the device before the clock stops, so asynchronous CUDA work is inside
the measurement. The first call of each callable (the warm-up) is its caller's: :func:`time_call`
once, whose result also tells how many back-to-back calls fill a repetition (:func:`iterations_for`).
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence


def synchronize(device: str) -> None:
    """Wait for queued work on ``device`` (a no-op on CPU)."""
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
    """How many calls make one timed repetition last at least ``min_seconds``."""
    return max(1, math.ceil(min_seconds / max(seconds_per_call, 1e-9)))


def side_by_side(calls: Mapping[str, Callable[[], object]], repetitions: int, device: str = "cpu",
                 iterations: Optional[Mapping[str, int]] = None) -> Dict[str, List[float]]:
    """Seconds per call of each callable: ``repetitions`` rounds, every callable timed once per round
    (``iterations[key]`` back-to-back calls, default 1)."""
    samples: Dict[str, List[float]] = {key: [] for key in calls}
    for _ in range(repetitions):
        for key, fn in calls.items():
            samples[key].append(time_call(fn, device, (iterations or {}).get(key, 1)))
    return samples


def median(values: Sequence[float]) -> float:
    """The median of ``values``; ``ValueError`` on an empty sequence."""
    if not values:
        raise ValueError("median of an empty sequence; measure at least one repetition")
    return float(statistics.median(values))
