"""The link between the processes, measured at start: all-reduce bus bandwidth as NCCL's tests define it, and
the latency of one call.

A multi-process run all-reduces a buffer the size of DDP's gradient buckets (25 MiB, or all the gradients
when they are fewer) a few times and records NCCL's bus bandwidth, 2(n-1)/n x bytes / seconds: the figure
`python -m planner --link_gb_s` takes (or reads with `--link_from RUN_DIR`), so a plan can be made
with the link a run really had instead of an assumed one. It then times all-reduces of one element, whose
cost is all per-call latency (the alpha of the planner's alpha-beta model; the bandwidth is its beta). It
costs well under a second on a GPU link and about a second over gloo on the CPU.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from training.record import LinkRecord

DDP_BUCKET_BYTES = 25 * 2**20  # DistributedDataParallel's default bucket_cap_mb
WARMUP_ALL_REDUCES = 2  # the first all-reduces set up the communicator's buffers and connections
TIMED_ALL_REDUCES = 5
TIMED_LATENCY_CALLS = 20  # one-element all-reduces: each takes tens of microseconds, so more of them


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


def measure_link(
    device: torch.device, gradient_numel: int, dtype: torch.dtype, iterations: int = TIMED_ALL_REDUCES
) -> LinkRecord | None:
    """Every rank calls it at the same point; None when the run is one process (no link to measure)."""
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    world_size = dist.get_world_size()
    nbytes = message_bytes(gradient_numel, dtype)
    buffer = torch.ones(nbytes // torch.tensor([], dtype=dtype).element_size(), dtype=dtype, device=device)
    seconds = _seconds_per_all_reduce(buffer, iterations)
    del buffer
    latency_s = _seconds_per_all_reduce(torch.ones(1, dtype=dtype, device=device), TIMED_LATENCY_CALLS)
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
    )


def _seconds_per_all_reduce(buffer: torch.Tensor, iterations: int) -> float:
    """The mean time of one all-reduce of `buffer` after the warm-up, the slowest rank's (every rank records
    the same figure)."""
    for _ in range(WARMUP_ALL_REDUCES):
        dist.all_reduce(buffer)
    _synchronize(buffer.device)
    dist.barrier()  # every rank starts its clock together, so no rank times another's late arrival
    start = time.perf_counter()
    for _ in range(iterations):
        dist.all_reduce(buffer)
    _synchronize(buffer.device)
    seconds = (time.perf_counter() - start) / iterations
    slowest = torch.tensor([seconds], dtype=torch.float64, device=buffer.device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return float(slowest.item())
