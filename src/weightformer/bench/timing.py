"""Timing primitives: one inference call, one training step (forward, backward, AdamW), a GEMM reference.

Every timed callable synchronises the device before the clock stops, so that asynchronous CUDA work
is inside the measurement.
"""

import contextlib
import math
import statistics
import time
from typing import Callable, ContextManager, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn


def autocast_context(device: str, dtype: torch.dtype) -> ContextManager:
    """Autocast to ``dtype`` on ``device``, or nothing for fp32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


def synchronize(device: str) -> None:
    """Wait for queued work on ``device`` (a no-op on CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def inference_call(model: nn.Module, images: torch.Tensor, dtype: torch.dtype = torch.float32) -> Callable[[], None]:
    """A callable running one forward pass of ``model`` in eval and inference mode."""
    model.eval()
    device = str(images.device)

    def call() -> None:
        with torch.inference_mode(), autocast_context(device, dtype):
            model(images)

    return call


def training_step(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    dtype: torch.dtype = torch.float32,
    optimizer: Optional[torch.optim.Optimizer] = None,
) -> Callable[[], None]:
    """A callable running one training step: zero grads, forward, cross-entropy, backward, AdamW step."""
    model.train()
    device = str(images.device)
    optimizer = optimizer or torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with autocast_context(device, dtype):
            loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()

    return step


def time_call(fn: Callable[[], None], device: str, iterations: int = 1) -> float:
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


def round_robin(
    calls: Dict[str, Callable[[], None]], repetitions: int, device: str, iterations: Dict[str, int]
) -> Dict[str, List[float]]:
    """Seconds per call of each callable, ``repetitions`` rounds, every callable timed once per round.

    Alternating spreads drifts in machine load over all callables instead of biasing whichever ran last.
    """
    samples: Dict[str, List[float]] = {key: [] for key in calls}
    for _ in range(repetitions):
        for key, fn in calls.items():
            samples[key].append(time_call(fn, device, iterations.get(key, 1)))
    return samples


def median(values: Sequence[float]) -> float:
    """The median of ``values``; raises ``ValueError`` on an empty sequence."""
    if not values:
        raise ValueError("median of an empty sequence; measure at least one repetition")
    return float(statistics.median(values))


def gemm_call(size: int = 2048, device: str = "cpu", dtype: torch.dtype = torch.float32) -> Callable[[], None]:
    """A callable multiplying two ``size``×``size`` matrices; it does 2·size³ FLOPs."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(device=device, dtype=dtype)
    b = torch.randn(size, size, generator=gen).to(device=device, dtype=dtype)
    out = torch.empty(size, size, device=device, dtype=dtype)

    def call() -> None:
        torch.mm(a, b, out=out)

    return call


def paired_rates(
    first: Callable[[], None],
    first_flops: float,
    second: Callable[[], None],
    second_flops: float,
    device: str,
    pairs: int = 5,
    min_seconds: float = 0.5,
) -> List[List[float]]:
    """GFLOP/s of two callables timed in alternation: ``pairs`` × [first, second], after one warm-up each."""
    calls = [(first, first_flops), (second, second_flops)]
    iters = [iterations_for(time_call(fn, device), min_seconds) for fn, _ in calls]
    rates: List[List[float]] = [[], []]
    for _ in range(pairs):
        for i, (fn, flops) in enumerate(calls):
            rates[i].append(flops / time_call(fn, device, iters[i]) / 1e9)
    return rates
