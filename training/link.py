"""The link between the processes, measured at start: all-reduce bus bandwidth as NCCL's tests define it, and
the latency of one call.

A multi-process run all-reduces a buffer the size of DDP's gradient buckets (25 MiB, or all the gradients
when they are fewer) a few times and records NCCL's bus bandwidth, 2(n-1)/n x bytes / seconds: the figure
`python -m planner --link_gb_s` takes (or reads with `--link_from RUN_DIR`), so a plan can be made
with the link a run really had instead of an assumed one. It then times all-reduces of one element, whose
cost is all per-call latency (the alpha of the planner's alpha-beta model; the bandwidth is its beta). It
costs well under a second on a GPU link and about a second over gloo on the CPU.

A run that shards (FSDP2) also measures what its own collectives cost, which the all-reduce does not tell:
the bandwidth of an all-gather and of a reduce-scatter of the same message (each net of its one-element
call), and what one FSDP2 unit's all-gather and reduce-scatter cost per call as FSDP2 issues them (the
copy-in before the all-gather, the copy-out after it, the pre-forward, pre-backward and post-backward hooks,
and the call itself), timed on a few units of negligible size wrapped by `fully_shard` on the run's own mesh.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist

from training.record import LinkRecord

DDP_BUCKET_BYTES = 25 * 2**20  # DistributedDataParallel's default bucket_cap_mb
WARMUP_ALL_REDUCES = 2  # the first all-reduces set up the communicator's buffers and connections
TIMED_ALL_REDUCES = 5
TIMED_LATENCY_CALLS = 20  # one-element all-reduces: each takes tens of microseconds, so more of them
# FSDP2's per-unit cost: forward and backward of TOY_UNITS units of TOY_FEATURES x TOY_FEATURES weights (64
# elements: the bytes are nothing, every microsecond is per call), each unit its own `fully_shard` group.
TOY_UNITS = 4
TOY_FEATURES = 8
TIMED_TOY_STEPS = 10


def bus_bandwidth_gb_s(message_bytes: int, seconds: float, world_size: int) -> float:
    """NCCL's bus bandwidth of one all-reduce, in 10^9 bytes/s: algorithm bandwidth x 2(n-1)/n.

    A ring all-reduce moves 2(n-1)/n of the buffer through every link, so this figure is comparable
    with the link's own speed whatever n (nccl-tests, doc/PERFORMANCE.md).
    """
    if world_size < 2 or seconds <= 0:
        raise ValueError(f"a bus bandwidth needs >= 2 processes and a positive time, got {world_size}, {seconds}")
    return message_bytes / seconds * 2 * (world_size - 1) / world_size / 1e9


def message_bytes(gradient_numel: int, dtype: torch.dtype) -> int:
    """One DDP bucket, or all the gradients when they are smaller, rounded down to whole elements."""
    size = torch.tensor([], dtype=dtype).element_size()
    return min(DDP_BUCKET_BYTES // size, gradient_numel) * size


def _synchronize(device: torch.device) -> None:
    # Collectives are asynchronous on a GPU: without this the clock would time the launch, not the transfer.
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sharding_mesh(model: torch.nn.Module) -> Any:
    """The device mesh a sharded (FSDP2) model's parameters live on; None for a model that is not sharded."""
    return next((p.device_mesh for p in model.parameters() if hasattr(p, "device_mesh")), None)


def call_cost_s(with_calls_s: float, without_calls_s: float, calls: int) -> float:
    """Seconds per call of what `calls` calls add to a step: (with - without) / calls.

    Both timings are means over a few steps on a machine other jobs may share; a difference that comes out
    negative, zero or not finite measured noise, not the calls, and is refused (ValueError) rather than
    recorded as a cost.
    """
    if calls < 1:
        raise ValueError(f"a cost per call needs at least one call, got {calls}")
    cost = (with_calls_s - without_calls_s) / calls
    if not math.isfinite(cost) or cost <= 0:
        raise ValueError(
            f"{calls} call(s) took {with_calls_s:.6g} s against {without_calls_s:.6g} s without them: "
            "no positive, finite cost per call"
        )
    return cost


@dataclass(frozen=True)
class ShardedCalls:
    """What a sharding run's own collectives cost: the all-gather and reduce-scatter of the message (gross, as
    the all-reduce's is) and of one element, and FSDP2's per-unit all-gather and reduce-scatter per call
    (None where noise made the difference meaningless, see `call_cost_s`)."""

    shard_group_size: int  # the processes each all-gather and reduce-scatter spans
    seconds_per_all_gather: float
    all_gather_latency_s: float
    seconds_per_reduce_scatter: float
    reduce_scatter_latency_s: float
    fsdp_all_gather_call_s: float | None
    fsdp_reduce_scatter_call_s: float | None


def measure_link(
    device: torch.device,
    gradient_numel: int,
    dtype: torch.dtype,
    iterations: int = TIMED_ALL_REDUCES,
    fsdp_mesh: Any = None,
) -> LinkRecord | None:
    """Every rank calls it at the same point; None when the run is one process (no link to measure).

    `fsdp_mesh`, the device mesh a sharding run's parameters live on, adds the sharded collectives'
    figures (`sharded_calls`); None (DDP) leaves them out."""
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    world_size = dist.get_world_size()
    nbytes = message_bytes(gradient_numel, dtype)
    buffer = torch.ones(nbytes // torch.tensor([], dtype=dtype).element_size(), dtype=dtype, device=device)
    seconds = _seconds_per_all_reduce(buffer, iterations)
    del buffer
    latency_s = _seconds_per_all_reduce(torch.ones(1, dtype=dtype, device=device), TIMED_LATENCY_CALLS)
    sharded = None if fsdp_mesh is None else sharded_calls(device, nbytes, dtype, fsdp_mesh, iterations)
    return LinkRecord(
        backend=str(dist.get_backend()),
        world_size=world_size,
        message_bytes=nbytes,
        dtype=str(dtype).removeprefix("torch."),
        iterations=iterations,
        seconds_per_all_reduce=seconds,
        algorithm_gb_s=nbytes / seconds / 1e9,
        bus_gb_s=bus_bandwidth_gb_s(nbytes, seconds, world_size),
        latency_s=latency_s,
        **({} if sharded is None else asdict(sharded)),
    )


def sharded_calls(
    device: torch.device, nbytes: int, dtype: torch.dtype, mesh: Any, iterations: int = TIMED_ALL_REDUCES
) -> ShardedCalls:
    """The all-gather and reduce-scatter of `nbytes` (and of one element per rank) over the processes a shard
    spans (the mesh's last dimension: all of them, or one machine's under hybrid sharding), then FSDP2's
    per-unit calls: TOY_UNITS units of negligible size, each `fully_shard`-ed on that dimension (with the
    default resharding after forward, so each unit is gathered in forward and again in backward), timed
    without FSDP, with gradient sync off (2 all-gathers per unit) and on (1 reduce-scatter per unit more).
    Hybrid sharding's replica all-reduce is the all-reduce's, measured apart (`measure_link`)."""
    shard_mesh = _shard_dimension(mesh)
    group = shard_mesh.get_group(shard_mesh.ndim - 1)
    world = dist.get_world_size(group)
    size = torch.tensor([], dtype=dtype).element_size()
    per_rank = max(1, nbytes // size // world)
    full = torch.ones(per_rank * world, dtype=dtype, device=device)
    shard = torch.ones(per_rank, dtype=dtype, device=device)
    gather = _seconds_per_call(lambda: dist.all_gather_single(full, shard, group=group), iterations, device)
    scatter = _seconds_per_call(lambda: dist.reduce_scatter_single(shard, full, group=group), iterations, device)
    one, few = torch.ones(1, dtype=dtype, device=device), torch.ones(world, dtype=dtype, device=device)
    calls = TIMED_LATENCY_CALLS
    gather_latency = _seconds_per_call(lambda: dist.all_gather_single(few, one, group=group), calls, device)
    scatter_latency = _seconds_per_call(lambda: dist.reduce_scatter_single(one, few, group=group), calls, device)
    gather_call, scatter_call = _fsdp_unit_calls(device, shard_mesh)
    return ShardedCalls(world, gather, gather_latency, scatter, scatter_latency, gather_call, scatter_call)


def _shard_dimension(mesh: Any) -> Any:
    """The mesh FSDP2 shards over: all of a 1-D mesh, the last (named) dimension of hybrid sharding's 2-D one
    (an unnamed 2-D mesh is kept whole: its toy units then run hybrid sharding's reduce-scatter too)."""
    return mesh[mesh.mesh_dim_names[-1]] if mesh.ndim > 1 and mesh.mesh_dim_names else mesh


def _fsdp_unit_calls(device: torch.device, mesh: Any) -> tuple[float | None, float | None]:
    """FSDP2's all-gather and reduce-scatter per unit and call, each None where noise hid it. The units'
    initialisation draws from a generator of its own forked off the global one, so the run's random state
    (its dropout, its data order) is what it would be without this measurement."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        return _time_fsdp_units(device, mesh)


def _time_fsdp_units(device: torch.device, mesh: Any) -> tuple[float | None, float | None]:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)  # every rank builds the same units, as a run's model is the same on every rank
    plain = torch.nn.Sequential(*(torch.nn.Linear(TOY_FEATURES, TOY_FEATURES, bias=False) for _ in range(TOY_UNITS)))
    plain = plain.to(device)
    sharded = copy.deepcopy(plain)
    for unit in sharded:
        fully_shard(unit, mesh=mesh)
    fully_shard(sharded, mesh=mesh)  # the root, as accelerate wraps a model: it holds no parameter here
    x = torch.ones(1, TOY_FEATURES, device=device)

    def step(model: torch.nn.Module) -> Callable[[], None]:
        def run() -> None:
            model(x).sum().backward()
            model.zero_grad(set_to_none=True)

        return run

    without = _seconds_per_call(step(plain), TIMED_TOY_STEPS, device)
    sharded.set_requires_gradient_sync(False)
    gathers = _seconds_per_call(step(sharded), TIMED_TOY_STEPS, device)
    sharded.set_requires_gradient_sync(True)
    scatters = _seconds_per_call(step(sharded), TIMED_TOY_STEPS, device)
    return _or_none(gathers, without, 2 * TOY_UNITS), _or_none(scatters, gathers, TOY_UNITS)


def _or_none(with_calls_s: float, without_calls_s: float, calls: int) -> float | None:
    try:
        return call_cost_s(with_calls_s, without_calls_s, calls)
    except ValueError:
        return None


def _seconds_per_all_reduce(buffer: torch.Tensor, iterations: int) -> float:
    """The mean time of one all-reduce of `buffer` after the warm-up, the slowest rank's (every rank records
    the same figure)."""
    return _seconds_per_call(lambda: dist.all_reduce(buffer), iterations, buffer.device)


def _seconds_per_call(call: Callable[[], Any], iterations: int, device: torch.device) -> float:
    """The mean time of `call` after the warm-up, the slowest rank's (every rank records the same figure)."""
    for _ in range(WARMUP_ALL_REDUCES):
        call()
    _synchronize(device)
    dist.barrier()  # every rank starts its clock together, so no rank times another's late arrival
    start = time.perf_counter()
    for _ in range(iterations):
        call()
    _synchronize(device)
    seconds = (time.perf_counter() - start) / iterations
    slowest = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return float(slowest.item())
