"""The data order every strategy shares; the global batch rule lives in training/geometry.py (torch-free)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import Sampler


class EpochOrderSampler(Sampler[int]):
    """A permutation of the training blocks fixed by (seed, epoch), cut to whole optimizer steps.

    The order depends on nothing else, so every strategy sees the same blocks in the same optimizer
    step: accelerate hands rank r every world_size-th micro-batch, and one process taking
    world_size x accumulation consecutive micro-batches per step takes the same set.
    """

    def __init__(self, num_blocks: int, usable: int, seed: int) -> None:
        self.num_blocks = num_blocks
        self.usable = usable
        self.seed = seed
        self.epoch = 1

    # Not named set_epoch on purpose: accelerate's DataLoaderShard calls `sampler.set_epoch` with its own
    # iteration count, which differs between a single process and a sharded loader, and after a resume.
    def use_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        yield from torch.randperm(self.num_blocks, generator=generator)[: self.usable].tolist()

    def __len__(self) -> int:
        return self.usable


def chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
