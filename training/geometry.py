"""The batch rule: a global batch, stated in tokens, divides into micro-batches of every process.

One rule for training (training/trainer.py), the experiment driver and the planner, and one source of
their defaults: a preset's values, else the config dataclasses'. Pure Python (no torch), so the analysis
side and the planner can import it cheaply.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields

from training.config import OptimConfig, RunError


class BatchError(ValueError):
    """A global batch that does not divide into whole micro-batches; the message is one line."""


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


def micro_step_tokens(micro_batch_size: int, block_size: int, world_size: int) -> int:
    """Tokens all processes take in one micro-step: the unit a global batch must be a multiple of."""
    return micro_batch_size * block_size * world_size


def nearest_multiples(tokens: int, unit: int) -> str:
    """The multiples of `unit` either side of `tokens`, as a suggestion ("2048 or 3072"; "1024" below one unit)."""
    lower = (tokens // unit) * unit
    upper = lower + unit
    return f"{lower} or {upper}" if lower else f"{upper}"


def divide(
    global_batch_tokens: int | None,
    micro_batch_size: int,
    block_size: int,
    world_size: int,
    processes: str = "processes",
) -> BatchGeometry:
    """Gradient accumulation from the global batch; None means one micro-batch per process (no accumulation).

    `processes` names what `world_size` counts in the error ("devices of ddp", "lcm(world sizes 1, 2)").
    """
    unit = micro_step_tokens(micro_batch_size, block_size, world_size)
    tokens = global_batch_tokens or unit
    if tokens % unit:
        raise BatchError(
            f"--global_batch_tokens {tokens} is not a multiple of micro_batch_size x block_size x {processes} "
            f"= {micro_batch_size} x {block_size} x {world_size} = {unit}; use {nearest_multiples(tokens, unit)}"
        )
    return BatchGeometry(micro_batch_size, tokens // unit, world_size, block_size)


def batch_geometry(optim: OptimConfig, block_size: int, world_size: int) -> BatchGeometry:
    """Training's geometry: accumulation derived from the global batch in tokens; it must divide exactly."""
    try:
        return divide(optim.global_batch_tokens, optim.micro_batch_size, block_size, world_size)
    except BatchError as exc:
        raise RunError(str(exc)) from None


def smallest_fitting(wanted: int, micro_batch_size: int, block_size: int, world_sizes: list[int]) -> int:
    """The smallest global batch of at least `wanted` tokens that every world size divides: a multiple of
    micro_batch x block_size x lcm(world sizes), so that strategies with different process counts train the
    same batch."""
    unit = micro_step_tokens(micro_batch_size, block_size, math.lcm(*world_sizes))
    return math.ceil(wanted / unit) * unit


@dataclass(frozen=True)
class BatchDefaults:
    """What train.py uses for the batch when the command line does not say."""

    micro_batch_size: int
    block_size: int
    global_batch_tokens: int | None  # None: one micro-batch per process


def batch_defaults(preset_values: Mapping[str, object]) -> BatchDefaults:
    """A preset's batch values (training/config.py), each falling back to its config dataclass's default, as
    train.py's command line resolves them (a value that is not a positive integer counts as unset)."""
    micro = _positive_int(preset_values.get("micro_batch_size")) or _default(OptimConfig, "micro_batch_size")
    block = _positive_int(preset_values.get("block_size")) or _data_block_size()
    return BatchDefaults(micro, block, _positive_int(preset_values.get("global_batch_tokens")))


def _data_block_size() -> int:
    # Imported only here: the data package loads torch and the tokenizer stack, and every preset sets a
    # block_size, so the experiment driver and the notebook stay light.
    from data.config import DataConfig

    return _default(DataConfig, "block_size")


def _default(cls: type, name: str) -> int:
    return next(f.default for f in fields(cls) if f.name == name)


def _positive_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
