"""The strategies: one typed entry each, and the one place that knows them by name.

Every other module asks this registry what a strategy is (its accelerate config file, whether it runs
several processes, which wrapper it puts around the model, its FSDP settings, what it shards, how it
communicates, how the planner counts it) instead of comparing names. Adding a strategy is one entry in
`STRATEGIES`, its config file in accelerate_configs/, and, when it communicates or holds memory in a way
no entry does yet, its terms in planner/cost_model.py.

Pure Python (no torch), so the analysis and notebook side can import it cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Communication(str, Enum):
    """What crosses the link between devices in a step (planner/cost_model.py prices each)."""

    NONE = "none"
    ALL_REDUCE = "all_reduce"  # every gradient, fp32, bucketed and overlapped with backward (DDP)
    GATHER_SCATTER = "gather_scatter"  # parameters all-gathered per unit, gradients reduce-scattered (FSDP)
    # FSDP's gathers and reduce-scatters inside each machine, then each gradient shard all-reduced across the
    # machines that hold the same shard (HSDP): only the last crosses the link between machines.
    HYBRID = "hybrid"


class Wrapper(str, Enum):
    """The class accelerate wraps the model in, as the strategy guard reads it off the prepared model."""

    NONE = "none"
    DDP = "DistributedDataParallel"
    FSDP = "FSDPModule"


@dataclass(frozen=True)
class FsdpMode:
    """FSDP2's settings that tell the FSDP strategies apart, as the config file and the live units hold them."""

    reshard_after_forward: bool  # free a block's gathered parameters after its forward (gather again in backward)
    offload_params: bool  # parameter shards, their gradients and the optimizer step on the CPU
    # Sharded over one dimension of a 2-D device mesh and replicated over the other (HSDP): the shard groups
    # are the devices of a machine, the replicas the machines.
    hybrid: bool = False


@dataclass(frozen=True)
class Strategy:
    """One way to train: how it is launched, what it wraps and shards, and how the planner counts it."""

    name: str
    config_file: str  # in accelerate_configs/; holds only the launch layout
    title: str  # the short human name, for tables and help
    summary: str  # one line: what it does
    multi_process: bool  # runs one process per device (its config's num_processes; --num_processes sets it)
    wrapper: Wrapper
    communication: Communication
    fsdp: FsdpMode | None = None
    multi_machine: bool = False  # its config spans several machines (launched once per machine, --machine_rank)
    reference: bool = False  # one of the reference paper's three, which an experiment trains by default
    colour: str = "#7f7f7f"  # its line and bar colour in the report's figures
    marker: str = "o"

    @property
    def shards(self) -> bool:
        """Parameters, gradients and optimizer state are split across the devices (each holds a shard)."""
        return self.fsdp is not None

    @property
    def offloads(self) -> bool:
        """Its model state lives in host memory and the optimizer steps there."""
        return self.fsdp is not None and self.fsdp.offload_params

    @property
    def gathers_per_micro_step(self) -> int:
        """All-gathers of each block's parameters per micro-step: for forward, and again for backward when
        they were freed after forward (0 for strategies that do not shard)."""
        if self.fsdp is None:
            return 0
        return 2 if self.fsdp.reshard_after_forward else 1

    def blocks_gathered_at_backward_start(self, n_layer: int) -> int:
        """Blocks whose parameters are whole when backward starts: FSDP prefetches the last one; kept
        unresharded, all of them are (0 for strategies that do not shard)."""
        if self.fsdp is None:
            return 0
        return 1 if self.fsdp.reshard_after_forward else n_layer


# The registry. Order is the order of tables, legends and plans: the reference's baseline first.
STRATEGIES: tuple[Strategy, ...] = (
    Strategy(
        "single",
        "single_gpu.yaml",
        "single GPU",
        "the whole model, gradients and optimizer state on one device",
        multi_process=False,
        wrapper=Wrapper.NONE,
        communication=Communication.NONE,
        reference=True,
        colour="#1f77b4",
        marker="o",
    ),
    Strategy(
        "ddp",
        "ddp.yaml",
        "DDP",
        "a full replica per device, gradients all-reduced",
        multi_process=True,
        wrapper=Wrapper.DDP,
        communication=Communication.ALL_REDUCE,
        reference=True,
        colour="#ff7f0e",
        marker="s",
    ),
    Strategy(
        "fsdp",
        "fsdp.yaml",
        "FSDP",
        "FSDP2 full sharding (ZeRO-3): parameters, gradients and optimizer state sharded; each block a "
        "unit, resharded after forward",
        multi_process=True,
        wrapper=Wrapper.FSDP,
        communication=Communication.GATHER_SCATTER,
        fsdp=FsdpMode(reshard_after_forward=True, offload_params=False),
        reference=True,
        colour="#2ca02c",
        marker="^",
    ),
    Strategy(
        "fsdp_zero2",
        "fsdp_zero2.yaml",
        "FSDP, ZeRO-2-like",
        "as FSDP, but a block's parameters stay whole from its forward to its backward: one all-gather "
        "per step instead of two, for more memory",
        multi_process=True,
        wrapper=Wrapper.FSDP,
        communication=Communication.GATHER_SCATTER,
        fsdp=FsdpMode(reshard_after_forward=False, offload_params=False),
        colour="#9467bd",
        marker="v",
    ),
    Strategy(
        "fsdp_offload",
        "fsdp_offload.yaml",
        "FSDP, CPU offload",
        "as FSDP, with parameter shards, gradients and the optimizer step on the CPU: least GPU memory, slowest",
        multi_process=True,
        wrapper=Wrapper.FSDP,
        communication=Communication.GATHER_SCATTER,
        fsdp=FsdpMode(reshard_after_forward=True, offload_params=True),
        colour="#8c564b",
        marker="P",
    ),
    Strategy(
        "hsdp",
        "hsdp.yaml",
        "HSDP",
        "FSDP2 hybrid sharding on a 2-D mesh (accelerate's parallelism_config): parameters, gradients and "
        "optimizer state sharded over a machine's devices and replicated across machines, so only the "
        "gradient shards' all-reduce crosses the link between machines",
        multi_process=True,
        multi_machine=True,
        wrapper=Wrapper.FSDP,
        communication=Communication.HYBRID,
        fsdp=FsdpMode(reshard_after_forward=True, offload_params=False, hybrid=True),
        colour="#17becf",
        marker="X",
    ),
)

AUTO = "auto"  # train.py's --strategy default: whatever the launch config gives


def names() -> tuple[str, ...]:
    return tuple(s.name for s in STRATEGIES)


def config_files() -> dict[str, str]:
    """Each strategy's accelerate config file name (in accelerate_configs/), by strategy name."""
    return {s.name: s.config_file for s in STRATEGIES}


def reference_names() -> tuple[str, ...]:
    """The reference paper's strategies: what an experiment trains unless told otherwise."""
    return tuple(s.name for s in STRATEGIES if s.reference)


def find(name: str) -> Strategy | None:
    """The entry called `name`, or None (a run recorded under a name no entry has, such as a mismatch)."""
    return next((s for s in STRATEGIES if s.name == name), None)


def get(name: str) -> Strategy:
    """The entry called `name`; ValueError naming the known ones otherwise."""
    found = find(name)
    if found is None:
        raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(names())}")
    return found


def order(name: str) -> int:
    """Position in tables and legends; unknown names after every entry."""
    return next((i for i, s in enumerate(STRATEGIES) if s.name == name), len(STRATEGIES))


# How FSDP modes without an entry of their own are named (they still shard).
_FSDP_PREFIX = "fsdp"
_HYBRID_PREFIX = "hsdp"


def fsdp_mode_name(mode: FsdpMode | None) -> str:
    """The name of the FSDP strategy with `mode`; a mode no entry has is spelled out (it is still FSDP), and
    None (the blocks' units disagree, or hold a mode that cannot be read) says so."""
    if mode is None:
        return f"{_FSDP_PREFIX} (blocks in mixed or unknown modes)"
    found = next((s for s in STRATEGIES if s.fsdp == mode), None)
    if found is not None:
        return found.name
    return (
        (_HYBRID_PREFIX if mode.hybrid else _FSDP_PREFIX)
        + ("" if mode.reshard_after_forward else "_zero2")
        + ("_offload" if mode.offload_params else "")
    )


# Where activation checkpointing is applied (the levers' recorded value): through accelerate's FSDP option for a
# sharded model, whose wrapper must see the checkpointed blocks, and in the model itself otherwise.
CHECKPOINT_IN_FSDP = "fsdp"
CHECKPOINT_IN_MODEL = "model"


def activation_checkpointing(name: str) -> str:
    """How the strategy called `name` checkpoints activations: CHECKPOINT_IN_FSDP or CHECKPOINT_IN_MODEL."""
    return CHECKPOINT_IN_FSDP if shards(name) else CHECKPOINT_IN_MODEL


def shards(name: str) -> bool:
    """Whether the strategy called `name` shards: an entry's own answer, or an FSDP mode `fsdp_mode_name` spelled out."""
    entry = find(name)
    return entry.shards if entry is not None else name.startswith((_FSDP_PREFIX, _HYBRID_PREFIX))


def single_process(name: str) -> bool:
    """Whether the strategy called `name` runs one process: the baseline that multi-process runs are scaled
    and compared against. False for a name no entry has (a run recorded under a mismatch)."""
    entry = find(name)
    return entry is not None and not entry.multi_process


def unsharded(multi_process: bool) -> Strategy:
    """The entry that does not shard and runs one process (multi_process False) or one per device (True)."""
    return next(s for s in STRATEGIES if s.fsdp is None and s.multi_process == multi_process)


def by_wrapper(wrapper: str) -> Strategy | None:
    """The one entry that puts this wrapper class around the model, when only one does (DDP's)."""
    matching = [s for s in STRATEGIES if s.wrapper.value == wrapper]
    return matching[0] if len(matching) == 1 else None
