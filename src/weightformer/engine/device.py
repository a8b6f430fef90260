"""Where a model runs and in which precision: the one device picker and the one autocast context. Importing
it does not import torch (the command line reads :data:`AMP_MODES`); its functions do."""

from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from .errors import ConfigError

if TYPE_CHECKING:
    import torch

__all__ = ["AMP_MODES", "autocast", "pick_device"]

AMP_MODES = ("none", "bf16", "fp16")


def pick_device(name: str = "auto", local_rank: int = 0) -> torch.device:
    """``--device`` as a torch.device: ``auto`` is CUDA (GPU ``local_rank``) when one is visible, else the
    CPU; ``cuda`` is GPU ``local_rank``, ``cuda:N`` GPU N, ``cpu`` the CPU."""
    import torch

    kind, _, index = str(name).partition(":")
    if kind not in ("auto", "cuda", "cpu") or (index and (kind != "cuda" or not index.isdigit())):
        raise ConfigError(f"--device must be auto, cuda, cuda:N or cpu, got {name!r}")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {name}: no CUDA GPU is visible here; pass --device cpu or auto")
    if kind == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    if index and int(index) >= torch.cuda.device_count():
        raise ConfigError(f"--device {name}: this machine has {torch.cuda.device_count()} GPU(s); pass cuda:0 or auto")
    return torch.device("cuda", int(index) if index else local_rank)


def autocast(device: torch.device, amp: str) -> Any:
    """The autocast context for ``amp`` (none, bf16, fp16) on ``device``; fp16 needs a GPU."""
    if amp not in AMP_MODES:
        raise ConfigError(f"--amp must be none, bf16 or fp16, got {amp!r}")
    if amp == "none":
        return nullcontext()
    if amp == "fp16" and device.type != "cuda":
        raise ConfigError("--amp fp16 needs a GPU; use --amp bf16 (or none) on CPU")
    import torch

    return torch.autocast(device.type, dtype=torch.bfloat16 if amp == "bf16" else torch.float16)
