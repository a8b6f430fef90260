"""A distributed sampler that can resume part-way through an epoch, and the loaders of a split over the ranks
(a map-style split through the sampler; a stream, :class:`~.shards.ShardStream`, splits itself)."""

from __future__ import annotations

import math
from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

__all__ = ["ResumableSampler", "split_loader", "split_sampler"]


class ResumableSampler(Sampler[int]):
    """Shuffled, rank-sharded sample indices with an exact start point inside the epoch: epoch ``e``'s permutation
    is seeded ``seed + e`` and sharded as ``DistributedSampler`` does; ``pad`` repeats its head so all ranks get
    the same count (training); ``set_epoch(e, start)`` skips the first ``start`` indices of this rank's shard."""

    def __init__(self, num_samples: int, num_replicas: int = 1, rank: int = 0, shuffle: bool = True, seed: int = 0,
                 pad: bool = True):
        if num_samples <= 0:
            raise ValueError(f"num_samples must be positive, got {num_samples}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, {num_replicas}), got {rank}")
        self.num_samples, self.num_replicas, self.rank = num_samples, num_replicas, rank
        self.shuffle, self.seed, self.pad = shuffle, seed, pad
        self.epoch = self.start = 0

    @property
    def shard_size(self) -> int:
        """Indices this rank gets in a whole epoch."""
        if self.pad:
            return math.ceil(self.num_samples / self.num_replicas)
        return len(range(self.rank, self.num_samples, self.num_replicas))

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Use epoch ``epoch``'s permutation and skip the first ``start`` indices of this shard."""
        if not 0 <= start <= self.shard_size:
            raise ValueError(f"start must be in [0, {self.shard_size}], got {start}")
        self.epoch, self.start = epoch, start

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.num_samples, generator=generator).tolist()
        else:
            order = list(range(self.num_samples))
        if self.pad:
            total = self.shard_size * self.num_replicas
            order = (order * math.ceil(total / self.num_samples))[:total]
        shard = order[self.rank :: self.num_replicas]
        return iter(shard[self.start :])

    def __len__(self) -> int:
        return self.shard_size - self.start


def split_sampler(dataset: Dataset, rank: int, world_size: int, train: bool, seed: int = 0) -> Any:
    """What places ``rank`` in ``dataset``'s epochs, with ``shard_size`` and ``set_epoch(epoch, start)``: a
    :class:`ResumableSampler` (``train``: shuffled and padded), or a stream itself (``train``: equal parts)."""
    if isinstance(dataset, IterableDataset):
        dataset.distribute(rank, world_size, equal=train)
        return dataset
    return ResumableSampler(len(dataset), world_size, rank, shuffle=train, seed=seed, pad=train)


def split_loader(dataset: Dataset, sampler: Any, batch_size: int, drop_last: bool = False, **loader_args: Any) -> DataLoader:
    """A DataLoader of ``dataset`` through :func:`split_sampler`'s ``sampler``, with a private generator: making
    its iterators draws nothing from the global RNG (exact resume)."""
    stream = sampler is dataset
    if stream:  # a stream cuts its own batches, worker w serving every W-th
        dataset.batch_size = batch_size
    return DataLoader(dataset, batch_size=batch_size, sampler=None if stream else sampler, drop_last=drop_last,
                      generator=torch.Generator(), **loader_args)
