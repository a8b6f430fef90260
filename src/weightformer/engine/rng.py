"""Every random generator a run draws from, captured into a checkpoint and put back on resume."""

from __future__ import annotations

import random
from typing import Any, Mapping

import numpy as np
import torch

__all__ = ["capture_rng", "restore_rng"]


def capture_rng() -> dict[str, Any]:
    """This process's torch, CUDA, NumPy and Python generator states, as tensors and plain values."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": random.getstate(),
    }


def restore_rng(state: Mapping[str, Any]) -> None:
    """Undo :func:`capture_rng`."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
