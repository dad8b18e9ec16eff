"""The global batch, stated in tokens, and the data order every strategy shares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import torch
from torch.utils.data import Sampler

from training.config import OptimConfig
from training.errors import RunError


@dataclass(frozen=True)
class BatchGeometry:
    micro_batch_size: int  # sequences per process per micro-step
    grad_accum_steps: int
    world_size: int
    block_size: int

    @property
    def samples_per_step(self) -> int:
        return self.micro_batch_size * self.grad_accum_steps * self.world_size

    @property
    def tokens_per_step(self) -> int:
        return self.samples_per_step * self.block_size


def batch_geometry(optim: OptimConfig, block_size: int, world_size: int) -> BatchGeometry:
    """Derive gradient accumulation from the global batch in tokens; it must divide exactly."""
    per_micro_step = optim.micro_batch_size * block_size * world_size
    global_tokens = optim.global_batch_tokens or per_micro_step
    if global_tokens % per_micro_step:
        raise RunError(
            f"--global_batch_tokens {global_tokens} is not a multiple of micro_batch_size x block_size x processes "
            f"= {optim.micro_batch_size} x {block_size} x {world_size} = {per_micro_step}; "
            f"use a multiple of {per_micro_step}"
        )
    return BatchGeometry(optim.micro_batch_size, global_tokens // per_micro_step, world_size, block_size)


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
