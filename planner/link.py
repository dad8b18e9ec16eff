"""The link between the processes, measured at start: all-reduce bus bandwidth as NCCL's tests define it, and
the latency of one call.

A multi-process run all-reduces a buffer the size of DDP's gradient buckets (25 MiB, or all the gradients
when they are fewer) a few times and records NCCL's bus bandwidth, 2(n-1)/n x bytes / seconds: the figure
`python -m planner --link_gb_s` takes (or reads with `--link_from RUN_DIR`), so a plan can be made
with the link a run really had instead of an assumed one. It then times all-reduces of one element, whose
cost is all per-call latency (the alpha of the planner's alpha-beta model; the bandwidth is its beta). It
costs well under a second on a GPU link and about a second over gloo on the CPU (a sharding run's own
collectives, below, about 1-2 s more there: lab/results/planning_checks.md). `python -m planner measure`
(planner/measure.py) calls it between processes of its own; a run measures nothing at start.

A run that shards (FSDP2) also measures what its own collectives cost, which the all-reduce does not tell:
the bandwidth of an all-gather and of a reduce-scatter of the same message (each net of its one-element
call), and what one FSDP2 unit's all-gather and reduce-scatter cost per call as FSDP2 issues them (the
copy-in before the all-gather, the copy-out after it, the pre-forward, pre-backward and post-backward hooks,
and the call itself), timed on a few units of negligible size wrapped by `fully_shard` on the run's own mesh.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist

from training.records.record import LinkRecord

DDP_BUCKET_BYTES = 25 * 2**20  # DistributedDataParallel's default bucket_cap_mb
WARMUP_ALL_REDUCES = 2  # the first all-reduces set up the communicator's buffers and connections
TIMED_ALL_REDUCES = 5
TIMED_LATENCY_CALLS = 20  # one-element all-reduces: each takes tens of microseconds, so more of them
# FSDP2's per-unit cost: forward and backward of toy models of TOY_UNITS[0] and TOY_UNITS[1] units of
# TOY_FEATURES x TOY_FEATURES weights (64 elements: the bytes are nothing, every microsecond is per call), each
# unit its own `fully_shard` group. The cost per unit is the slope between the two counts, so what a step pays
# once whatever its units (the root's pre-forward, the final backward callback) cancels.
TOY_UNITS = (1, 4)
TOY_FEATURES = 8
TIMED_TOY_STEPS = 8


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
    fsdp_all_gather_call_s: float | None  # units resharded after forward: half a unit's work per micro-step
    fsdp_kept_all_gather_call_s: float | None  # units kept gathered (fsdp_zero2): all of it, on its one gather
    fsdp_reduce_scatter_call_s: float | None


@dataclass(frozen=True)
class ToyTimings:
    """Seconds per forward and backward of the toy models, by unit count (TOY_UNITS): without FSDP, sharded
    and resharded after forward with gradient sync off and on, and sharded but kept gathered (sync off)."""

    plain: tuple[float, float]
    resharded: tuple[float, float]
    resharded_synced: tuple[float, float]
    kept: tuple[float, float]


def unit_call_costs(t: ToyTimings, units: tuple[int, int] = TOY_UNITS) -> tuple[float | None, ...]:
    """FSDP2's cost per call from the toy timings: (all-gather resharded, all-gather kept, reduce-scatter).

    Each is a slope over the two unit counts of what FSDP adds to the plain model, so once-per-step work
    cancels. FSDP2's work per unit is its hooks (pre-forward, post-forward, pre-backward, post-backward), the
    copy-in and copy-out and the call, and it does not scale with the gathers: a unit resharded after
    forward is gathered twice per micro-step and its work is priced half on each gather, a unit kept
    gathered (reshard_after_forward=False) once and all of it on that one gather, which is why the two are
    timed apart rather than one derived from the other. The reduce-scatter is what sync on adds per unit.
    Each is None where noise made it meaningless (`call_cost_s`)."""
    extra = [[t_s - p_s for t_s, p_s in zip(timed, t.plain, strict=True)] for timed in (t.resharded, t.kept)]
    more = units[1] - units[0]
    return (
        _or_none(extra[0][1], extra[0][0], 2 * more),
        _or_none(extra[1][1], extra[1][0], more),
        _or_none(t.resharded_synced[1] - t.resharded[1], t.resharded_synced[0] - t.resharded[0], more),
    )


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


def measure_model_link(device: torch.device, model: torch.nn.Module, gradient_numel: int) -> LinkRecord | None:
    """`measure_link` for a prepared model: its parameters' dtype, and its device mesh where it is sharded."""
    return measure_link(device, gradient_numel, next(model.parameters()).dtype, fsdp_mesh=sharding_mesh(model))


def sharded_calls(
    device: torch.device, nbytes: int, dtype: torch.dtype, mesh: Any, iterations: int = TIMED_ALL_REDUCES
) -> ShardedCalls:
    """The all-gather and reduce-scatter of `nbytes` (and of one element per rank) over the processes a shard
    spans (the mesh's last dimension: all of them, or one machine's under hybrid sharding), then FSDP2's
    per-unit calls: toy models of TOY_UNITS units of negligible size, each unit `fully_shard`-ed on that
    dimension, timed without FSDP, resharded after forward with gradient sync off (2 all-gathers per unit)
    and on (1 reduce-scatter per unit more), and kept gathered after forward (1 all-gather per unit), see
    `unit_call_costs`. Hybrid sharding's replica all-reduce is the all-reduce's, measured apart (`measure_link`)."""
    shard_mesh = _shard_dimension(mesh)
    group = shard_mesh.get_group(shard_mesh.ndim - 1)
    world = dist.get_world_size(group)
    size = torch.tensor([], dtype=dtype).element_size()
    per_rank = max(1, nbytes // size // world)
    full = torch.ones(per_rank * world, dtype=dtype, device=device)
    shard = torch.ones(per_rank, dtype=dtype, device=device)
    all_gather, reduce_scatter = tensor_collectives()
    gather = _seconds_per_call(lambda: all_gather(full, shard, group=group), iterations, device)
    scatter = _seconds_per_call(lambda: reduce_scatter(shard, full, group=group), iterations, device)
    one, few = torch.ones(1, dtype=dtype, device=device), torch.ones(world, dtype=dtype, device=device)
    calls = TIMED_LATENCY_CALLS
    gather_latency = _seconds_per_call(lambda: all_gather(few, one, group=group), calls, device)
    scatter_latency = _seconds_per_call(lambda: reduce_scatter(one, few, group=group), calls, device)
    unit_calls = unit_call_costs(_time_fsdp_units(device, shard_mesh))
    return ShardedCalls(world, gather, gather_latency, scatter, scatter_latency, *unit_calls)


def tensor_collectives() -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The all-gather and reduce-scatter into one flat tensor: torch 2.13's `all_gather_single` and
    `reduce_scatter_single` where they exist (which deprecate the older names with a warning), else
    `all_gather_into_tensor` and `reduce_scatter_tensor`, the only ones torch 2.10, the oldest supported, has."""
    return (
        getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor,
        getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor,
    )


def _shard_dimension(mesh: Any) -> Any:
    """The mesh FSDP2 shards over: all of a 1-D mesh, the last (named) dimension of hybrid sharding's 2-D one
    (an unnamed 2-D mesh is kept whole: its toy units then run hybrid sharding's reduce-scatter too)."""
    return mesh[mesh.mesh_dim_names[-1]] if mesh.ndim > 1 and mesh.mesh_dim_names else mesh


def _time_fsdp_units(device: torch.device, mesh: Any) -> ToyTimings:
    """Times the toy models (ToyTimings). Their weights are left uninitialised and filled with a constant, so
    every rank holds the same units and no random generator is drawn from: the run's random state (its
    dropout, its data order, on every device) is what it would be without this measurement."""
    from torch.distributed.fsdp import fully_shard

    def toy(units: int) -> torch.nn.Sequential:
        linears = (
            torch.nn.utils.skip_init(torch.nn.Linear, TOY_FEATURES, TOY_FEATURES, bias=False) for _ in range(units)
        )
        model = torch.nn.Sequential(*linears).to(device)
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(1.0 / TOY_FEATURES)
        return model

    def sharded(units: int, reshard_after_forward: bool) -> torch.nn.Module:
        model = toy(units)
        for unit in model:
            fully_shard(unit, mesh=mesh, reshard_after_forward=reshard_after_forward)
        fully_shard(model, mesh=mesh)  # the root, as accelerate wraps a model: it holds no parameter here
        return model

    x = torch.ones(1, TOY_FEATURES, device=device)

    def seconds(model: Any, sync: bool = False) -> float:
        if hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(sync)

        def step() -> None:
            model(x).sum().backward()
            model.zero_grad(set_to_none=True)

        return _median_seconds(step, TIMED_TOY_STEPS, device)

    def both(time_one: Callable[[int], float]) -> tuple[float, float]:
        return time_one(TOY_UNITS[0]), time_one(TOY_UNITS[1])

    resharded = {n: sharded(n, True) for n in TOY_UNITS}
    return ToyTimings(
        plain=both(lambda n: seconds(toy(n))),
        resharded=both(lambda n: seconds(resharded[n])),
        resharded_synced=both(lambda n: seconds(resharded[n], sync=True)),
        kept=both(lambda n: seconds(sharded(n, False))),
    )


def _or_none(with_calls_s: float, without_calls_s: float, calls: int) -> float | None:
    try:
        return call_cost_s(with_calls_s, without_calls_s, calls)
    except ValueError:
        return None


def _median_seconds(call: Callable[[], Any], iterations: int, device: torch.device) -> float:
    """The median time of one `call` after the warm-up, the slowest rank's. The toy steps' differences are a
    few milliseconds on a shared machine: a median leaves out the steps another job slowed, which a mean of
    so few would carry into every per-call figure."""
    _warm_up(call, device)
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        call()
        _synchronize(device)
        times.append(time.perf_counter() - start)
    return _slowest_rank(statistics.median(times), device)


def _seconds_per_all_reduce(buffer: torch.Tensor, iterations: int) -> float:
    """The mean time of one all-reduce of `buffer` after the warm-up, the slowest rank's (every rank records
    the same figure)."""
    return _seconds_per_call(lambda: dist.all_reduce(buffer), iterations, buffer.device)


def _seconds_per_call(call: Callable[[], Any], iterations: int, device: torch.device) -> float:
    """The mean time of `call` after the warm-up, the slowest rank's (every rank records the same figure)."""
    _warm_up(call, device)
    start = time.perf_counter()
    for _ in range(iterations):
        call()
    _synchronize(device)
    return _slowest_rank((time.perf_counter() - start) / iterations, device)


def _warm_up(call: Callable[[], Any], device: torch.device) -> None:
    """WARMUP_ALL_REDUCES untimed calls, then every rank waits for the others, so each starts its clock
    together and no rank times another's late arrival."""
    for _ in range(WARMUP_ALL_REDUCES):
        call()
    _synchronize(device)
    dist.barrier()


def _slowest_rank(seconds: float, device: torch.device) -> float:
    """The largest of every rank's `seconds`: a collective ends when its slowest rank does."""
    slowest = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return float(slowest.item())
