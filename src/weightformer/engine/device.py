"""Where a model runs and in which precision: the one device picker and the one autocast context. Importing
it does not import torch (the command line reads :data:`AMP_MODES`); its functions do."""

from __future__ import annotations

import os
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, Optional

from .errors import ConfigError, ResourceError

if TYPE_CHECKING:
    import torch

__all__ = ["AMP_MODES", "autocast", "available_memory", "check_batch_fits", "pick_device"]

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


FP16_NEEDS_A_GPU = "amp fp16 needs a GPU (set by --amp or by the recipe's amp: fp16); on the CPU pass --amp bf16 or --amp none"


def autocast(device: torch.device, amp: str) -> Any:
    """The autocast context for ``amp`` (none, bf16, fp16) on ``device``; fp16 needs a GPU."""
    if amp not in AMP_MODES:
        raise ConfigError(f"--amp must be none, bf16 or fp16, got {amp!r}")
    if amp == "none":
        return nullcontext()
    if amp == "fp16" and device.type != "cuda":
        raise ConfigError(FP16_NEEDS_A_GPU)
    import torch

    return torch.autocast(device.type, dtype=torch.bfloat16 if amp == "bf16" else torch.float16)


def available_memory() -> Optional[int]:
    """Bytes of memory a new allocation can get without swapping: the kernel's MemAvailable, else the free
    physical pages; None where neither is known."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def check_batch_fits(batch_size: int, img_size: Optional[int], channels: int = 1, copies: int = 2) -> None:
    """Before the work: ResourceError if ``copies`` of one batch of float32 (``batch_size``, ``channels``,
    ``img_size``, ``img_size``) images (the loader's and the model's input, before any activation) need more
    memory than this machine has available."""
    need = None if img_size is None else copies * batch_size * channels * img_size ** 2 * 4
    free = available_memory()
    if need is not None and free is not None and need > free:
        raise ResourceError(f"--img-size {img_size} at --batch-size {batch_size} cannot fit: one batch of images "
                            f"needs at least {need / 2 ** 30:,.1f} GiB ({copies} x {batch_size} x {channels} x "
                            f"{img_size}^2 float32) and this machine has {free / 2 ** 30:,.1f} GiB of memory "
                            f"available; pass a smaller --img-size or --batch-size")
