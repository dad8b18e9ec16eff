"""`python -m planner measure`: what this machine does, measured once and kept as its profile (planner/profile.py),
so that plans and `python -m planner --run` predict from it instead of an assumed MFU, and no run spends its
start-up measuring.

    python -m planner measure [--presets tiny] [--processes 1,2] [--threads 1] [--cache_dir DIR] [--out PATH]

It measures, in this order: the CPU's peak FLOP/s at each thread count (planner/cpu_peak.py; runs read it for
their MFU); per preset and number of processes, those processes computing at once, each on `--threads`
threads (accelerate's OMP_NUM_THREADS=1 for a launch of several processes), the MFU of one micro-batch's
forward and backward (loss included) against that peak and one core's AdamW rate, each the slowest process's,
since two processes that share cores each compute slower than one alone; then, with two or more processes,
the link between them (planner/link.py: the all-reduce, and a sharded run's all-gathers, reduce-scatters and
FSDP2's per-unit calls). On a machine with GPUs the compute and the link are the GPUs' (one per process).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import multiprocessing
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import torch

from planner.profile import ComputeRate, MachineProfile, machine_key, profile_path, write_profile

CALIBRATION_REPEATS = 7  # the fastest of these is kept: other work on the machine only slows a pass down
CALIBRATION_BUDGET_S = 30.0  # fewer passes when they take longer (gpt2 on a CPU: a minute each), never under 2
WORKER_TIMEOUT_S = 600
# What torch's per-tensor AdamW moves per element of a decayed matrix: the 72 bytes of its passes plus the
# decoupled decay's multiply (planner/cost_model.py ADAMW_HOST_PASSES).
DECAYED_BYTES_PER_ELEMENT = 72 + 8


def adamw_over(shapes: list[tuple[int, ...]]) -> torch.optim.Optimizer:
    """A per-tensor AdamW over fresh tensors of `shapes`, as training/step.py builds it (matrices decayed), its
    state created by one step."""
    params = [torch.nn.Parameter(torch.randn(shape)) for shape in shapes]
    for p in params:
        p.grad = torch.randn_like(p)
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=1e-3, foreach=False, fused=False)
    optimizer.step()
    return optimizer


def fastest_steps(optimizers: list[torch.optim.Optimizer], repeats: int) -> list[float]:
    """Each optimizer's fastest step of `repeats`, taken in turns."""
    best = [float("inf")] * len(optimizers)
    for _ in range(repeats):
        for i, optimizer in enumerate(optimizers):
            start = time.perf_counter()
            optimizer.step()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def largest_shape(model_config: Any) -> tuple[int, ...]:
    from model.shapes import parameter_shapes

    return max(parameter_shapes(model_config).values(), key=lambda shape: torch.Size(shape).numel())


def compute_rate(preset: str, processes: int, threads: int, peak_flops: float, device: str = "cpu") -> ComputeRate:
    """`processes` processes at once, each on `threads` threads (and its own GPU, on a machine with one per
    process), started in fresh interpreters (no thread pool or state inherited), each timing its fastest
    forward and backward in fp32 and then its fastest AdamW step on the host."""
    from model import GPT2Config
    from model.shapes import flops_per_token
    from training.config import preset_overrides

    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(processes), context.Queue()
    workers = [
        context.Process(target=_compute_worker, args=(preset, threads, rank, device != "cpu", barrier, results))
        for rank in range(processes)
    ]
    for worker in workers:
        worker.start()
    timings = [results.get(timeout=WORKER_TIMEOUT_S) for _ in workers]
    for worker in workers:
        worker.join()
    step_s, update_s = max(t[0] for t in timings), max(t[1] for t in timings)
    values = preset_overrides(preset)
    cfg = GPT2Config.from_preset(values["model_preset"])
    tokens = values["micro_batch_size"] * values["block_size"]
    return ComputeRate(
        preset=preset,
        processes=processes,
        threads=threads,
        precision="fp32",
        device=device,
        mfu=tokens * flops_per_token(cfg, values["block_size"]) / (step_s * peak_flops),
        peak_flops=peak_flops,
        adamw_gb_s=DECAYED_BYTES_PER_ELEMENT * torch.Size(largest_shape(cfg)).numel() / update_s / 1e9,
    )


def _compute_worker(preset: str, threads: int, rank: int, on_gpu: bool, barrier: Any, results: Any) -> None:
    """One computing process; the barrier starts each phase in every process together, as a run's ranks."""
    from model import GPT2, GPT2Config
    from training.config import preset_overrides

    torch.set_num_threads(threads)
    device = torch.device("cuda", rank) if on_gpu else torch.device("cpu")
    values = preset_overrides(preset)
    cfg = GPT2Config.from_preset(values["model_preset"])
    model = GPT2(cfg).to(device)
    batch, block = values["micro_batch_size"], values["block_size"]
    idx = torch.randint(0, cfg.vocab_size, (batch, block), generator=torch.Generator().manual_seed(0)).to(device)
    optimizer = adamw_over([largest_shape(cfg)])  # the host update: what the offloaded strategy runs per core
    barrier.wait()
    best, began = float("inf"), time.perf_counter()
    for done in range(CALIBRATION_REPEATS + 1):  # the first pass allocates: it is timed but cannot win
        if done >= 2 and time.perf_counter() - began > CALIBRATION_BUDGET_S:
            break
        start = time.perf_counter()
        _, loss = model(idx, targets=idx)
        loss.backward()
        if on_gpu:
            torch.cuda.synchronize(device)  # the kernels are asynchronous: time them, not their launch
        best = min(best, time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
    barrier.wait()
    (update_s,) = fastest_steps([optimizer], CALIBRATION_REPEATS)
    results.put((best, update_s))


def measure_link_between(processes: int, gradient_numel: int) -> dict[str, Any]:
    """The link between `processes` processes (gloo on the CPU, NCCL over GPUs), as a LinkRecord's fields."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = _free_port()
    workers = [
        context.Process(target=_link_worker, args=(rank, processes, port, gradient_numel, results))
        for rank in range(processes)
    ]
    for worker in workers:
        worker.start()
    record = results.get(timeout=WORKER_TIMEOUT_S)
    for worker in workers:
        worker.join()
    return record


def _link_worker(rank: int, world: int, port: int, gradient_numel: int, results: Any) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from planner.link import measure_link

    torch.set_num_threads(1)
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= world
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh(device.type, (world,))
        record = measure_link(device, gradient_numel, torch.float32, fsdp_mesh=mesh)
        if rank == 0:
            results.put(None if record is None else record.to_dict())
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(presets: list[str], processes: list[int], threads: int, cache_dir: Path) -> MachineProfile:
    from model import GPT2Config
    from model.shapes import parameter_shapes
    from training.config import preset_overrides

    on_gpu = torch.cuda.is_available() and torch.cuda.device_count() >= max(processes)
    device = torch.cuda.get_device_name(0) if on_gpu else "cpu"
    # Each process count at `threads` threads (a launch of several processes), and one process at torch's own
    # thread count too when that differs: what a plain `python train.py` computes with.
    layouts = [(count, threads) for count in processes]
    if device == "cpu" and 1 in processes and torch.get_num_threads() != threads:
        layouts.append((1, torch.get_num_threads()))
    compute = []
    for preset in presets:
        for count, per_process in layouts:
            peak = _peak(device, cache_dir, per_process)
            rate = compute_rate(preset, count, per_process, peak, device)
            compute.append(rate)
            print(
                f"{preset}, {count} process(es) of {per_process} thread(s) at once: forward+backward at MFU "
                f"{rate.mfu:.3f} of {peak / 1e9:,.1f} GFLOP/s, AdamW {rate.adamw_gb_s:.1f} GB/s",
                flush=True,
            )
    link = None
    if max(processes) > 1:
        cfg = GPT2Config.from_preset(preset_overrides(presets[0])["model_preset"])
        numel = sum(torch.Size(shape).numel() for shape in parameter_shapes(cfg).values())
        link = measure_link_between(max(processes), numel)
        print(
            f"link, {link['world_size']} processes ({link['backend']}): all-reduce {link['bus_gb_s']:.2f} GB/s bus "
            f"bandwidth, {link['latency_s'] * 1e6:,.0f} us per call",
            flush=True,
        )
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return MachineProfile(machine_key(device), stamp, tuple(compute), link)


def _peak(device: str, cache_dir: Path, threads: int) -> float:
    """One process's peak FLOP/s: the datasheet's for a GPU (fp32: the calibration runs in fp32), else the CPU's
    measured matmul rate at `threads` threads, cached where runs read it."""
    from planner.cpu_peak import cpu_peak_flops
    from training.records.peaks import gpu_peak_flops

    if device != "cpu":
        return gpu_peak_flops(device, "fp32").flops_per_s
    return cpu_peak_flops(cache_dir, threads=threads).flops_per_s


def measure_main(argv: list[str]) -> int:
    from training.config import PRESETS
    from training.records.peaks import default_cache_dir

    parser = argparse.ArgumentParser(prog="python -m planner measure", description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="tiny", help="model presets to measure, comma-separated (default tiny)")
    parser.add_argument("--processes", default="1,2", help="process counts, comma-separated (default 1,2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process (default 1)")
    parser.add_argument(
        "--cache_dir", type=Path, default=None, help="default: $GPT2S_CACHE or ~/.cache/gpt2-strategies"
    )
    parser.add_argument("--out", type=Path, default=None, help="the profile's path (default: under the cache folder)")
    args = parser.parse_args(argv)
    presets = [p for p in args.presets.split(",") if p]
    unknown = [p for p in presets if p not in PRESETS]
    counts = _counts(args.processes)
    if unknown or not presets or counts is None or args.threads < 1:
        why = (
            f"unknown preset(s) {', '.join(unknown)} (one of {', '.join(sorted(PRESETS))})"
            if unknown or not presets
            else f"--processes takes positive integers, got {args.processes!r}"
            if counts is None
            else f"--threads must be >= 1, got {args.threads}"
        )
        print(f"error: {why}", file=sys.stderr)
        return 2
    cache_dir = args.cache_dir or default_cache_dir()
    profile = measure(presets, counts, args.threads, cache_dir)
    path = args.out or profile_path(cache_dir, profile.machine)
    write_profile(path, profile)
    print(f"machine profile: {path}")
    return 0


def _counts(text: str) -> list[int] | None:
    with contextlib.suppress(ValueError):
        counts = sorted({int(part) for part in text.split(",") if part})
        if counts and counts[0] >= 1:
            return counts
    return None
