"""torch.distributed helpers: start-up from torchrun's environment, rank checks, metric reduction."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .device import pick_device

__all__ = ["DistInfo", "all_gather_objects", "all_reduce_sum", "init_distributed", "max_over_ranks",
           "shutdown_distributed"]


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job. A single process is rank 0 of world size 1."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    owns_process_group: bool  # this module created the process group and will destroy it

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def init_distributed(device: str = "auto") -> DistInfo:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK), if any: NCCL on GPU, gloo on
    CPU; an existing one is used as it is. Without torchrun's variables, a single process on rank 0."""
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    dev = pick_device(device, local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if dist.is_available() and dist.is_initialized():
        return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, dev, owns_process_group=False)
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    if world_size == 1:
        return DistInfo(0, 1, 0, dev, owns_process_group=False)
    dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, dev, owns_process_group=True)


def shutdown_distributed(info: DistInfo) -> None:
    """Destroy the process group if :func:`init_distributed` created it."""
    if info.owns_process_group and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(values: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Sum ``values`` over ranks (a no-op for one process); returns the summed tensor."""
    if info.distributed:
        values = values.clone()
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def max_over_ranks(value: int, info: DistInfo) -> int:
    """The largest ``value`` of all ranks (one collective for several flags coded as levels)."""
    if not info.distributed:
        return value
    t = torch.tensor([float(value)], device=info.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def all_gather_objects(obj: Any, info: DistInfo) -> list[Any]:
    """Every rank's ``obj``, indexed by rank."""
    if not info.distributed:
        return [obj]
    gathered: list[Any] = [None] * info.world_size
    dist.all_gather_object(gathered, obj)
    return gathered


def broadcast_buffers(module: torch.nn.Module, info: DistInfo) -> None:
    """Give every rank rank 0's buffers (BatchNorm's running statistics): DDP broadcasts them before each
    forward, but each rank's last forward updates its own copy, so the ranks would evaluate differently."""
    if info.distributed:
        for buffer in module.buffers():
            dist.broadcast(buffer.data, src=0)
