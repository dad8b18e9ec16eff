"""`python -m planner measure`: what this machine does, measured once and kept as its profile (planner/profile.py),
so that plans and `python -m planner --run` predict from it instead of an assumed MFU, and no run spends its
start-up measuring.

    python -m planner measure [--presets tiny] [--processes 1,2] [--threads 1] [--device auto|cpu|gpu]
                              [--precision fp32|fp16|bf16] [--cache_dir DIR] [--out PATH]

It measures, in this order: the CPU's peak FLOP/s at each thread count (planner/cpu_peak.py; runs read it for
their MFU); per preset and number of processes, those processes computing at once, each on `--threads`
threads (accelerate's OMP_NUM_THREADS=1 for a launch of several processes), the MFU of one micro-batch's
forward and backward (loss included) against the peak, and the rate of AdamW's element-wise passes on the
host, each the slowest process's, every pass started together (two processes that share cores each compute
slower than one alone); then, for each count of two or more, the link between them (planner/link.py: the
all-reduce, and a sharded run's all-gathers, reduce-scatters and FSDP2's per-unit calls). On a GPU machine
the compute and the link are the GPUs' (one per process), at the precision runs train in there. A worker that
fails stops the measurement with its error; nothing is left waiting.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import math
import multiprocessing
import queue
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from planner.errors import PlanError
from planner.profile import ComputeRate, MachineProfile, machine_key, profile_path, write_profile

CALIBRATION_REPEATS = 7  # passes after the first; the fastest is kept: other work only slows a pass down
CALIBRATION_BUDGET_S = 30.0  # fewer passes when they take longer (gpt2 on a CPU: a minute each), never under 2
PHASE_TIMEOUT_S = 900.0  # a worker that reaches no barrier in this long is taken for stuck
COLLECTIVE_TIMEOUT_S = 120  # the link's process group: a peer that died fails the others' collectives
# What torch's per-tensor AdamW moves per element of a decayed matrix: the 72 bytes of its passes plus the
# decoupled decay's multiply (planner/cost_model.py ADAMW_HOST_PASSES).
DECAYED_BYTES_PER_ELEMENT = 72 + 8
AUTOCAST = {"fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Layout:
    """What one measurement runs: the device kind, its precision, and each process's torch threads."""

    gpu: bool
    precision: str
    threads: int


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


# ---------------------------------------------------------------------------------------------------
# Workers: spawned interpreters (no thread pool or state inherited), each reporting ("ok", value) or
# ("error", its traceback's last line) on the queue, watched by the parent (_gather)


def _gather(target: Any, args_of: Any, processes: int) -> list[Any]:
    """Run `target(rank, *args_of(rank), results)` in `processes` spawned daemon processes; their values by rank.

    The parent watches every worker: one that fails or dies stops the measurement at once (PlanError with its
    error), the others are terminated, and nothing is left waiting on a barrier or a collective."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    workers = [
        context.Process(target=_reporting, args=(target, rank, args_of(rank), results), daemon=True)
        for rank in range(processes)
    ]
    try:
        for worker in workers:
            worker.start()
        return _collect(workers, results)
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.terminate()
            worker.join(timeout=10)


def _collect(workers: list[Any], results: Any) -> list[Any]:
    values: dict[int, Any] = {}
    while len(values) < len(workers):
        try:
            rank, status, value = results.get(timeout=1.0)
        except queue.Empty:
            gone = [rank for rank, w in enumerate(workers) if w.exitcode is not None and rank not in values]
            if gone:
                raise PlanError(f"measuring process {gone[0]} ended with status {workers[gone[0]].exitcode}") from None
            continue
        if status == "error":
            raise PlanError(f"measuring process {rank} failed: {value}")
        values[rank] = value
    return [values[rank] for rank in range(len(workers))]


def _reporting(target: Any, rank: int, args: tuple[Any, ...], results: Any) -> None:
    try:
        results.put((rank, "ok", target(rank, *args)))
    except BaseException as exc:  # every failure reaches the parent, which stops the others
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        results.put((rank, "error", last))


# ---------------------------------------------------------------------------------------------------
# The compute rate


def compute_rate(preset: str, processes: int, layout: Layout, peak_flops: float, device_name: str) -> ComputeRate:
    """`processes` processes at once, each timing its fastest forward and backward and its fastest AdamW step,
    every pass started together (a barrier before each), as a run's ranks compute."""
    from model import GPT2Config
    from model.shapes import flops_per_token
    from training.config import preset_overrides

    context = multiprocessing.get_context("spawn")
    barrier, stop = context.Barrier(processes, timeout=PHASE_TIMEOUT_S), context.Value("b", 0)
    timings = _gather(_compute_worker, lambda rank: (preset, layout, barrier, stop), processes)
    step_s, update_s = max(t[0] for t in timings), max(t[1] for t in timings)
    values = preset_overrides(preset)
    cfg = GPT2Config.from_preset(values["model_preset"])
    batch, block = values["micro_batch_size"], values["block_size"]
    return ComputeRate(
        preset=preset,
        processes=processes,
        threads=layout.threads,
        precision=layout.precision,
        device=device_name,
        micro_batch_size=batch,
        block_size=block,
        mfu=batch * block * flops_per_token(cfg, block) / (step_s * peak_flops),
        peak_flops=peak_flops,
        adamw_gb_s=DECAYED_BYTES_PER_ELEMENT * torch.Size(largest_shape(cfg)).numel() / update_s / 1e9,
    )


def _compute_worker(rank: int, preset: str, layout: Layout, barrier: Any, stop: Any) -> tuple[float, float]:
    from model import GPT2, GPT2Config
    from training.config import preset_overrides

    torch.set_num_threads(layout.threads)
    device = torch.device("cuda", rank) if layout.gpu else torch.device("cpu")
    if layout.gpu:
        torch.cuda.set_device(device)
    values = preset_overrides(preset)
    cfg = GPT2Config.from_preset(values["model_preset"])
    model = GPT2(cfg).to(device)
    batch, block = values["micro_batch_size"], values["block_size"]
    idx = torch.randint(0, cfg.vocab_size, (batch, block), generator=torch.Generator().manual_seed(0)).to(device)
    optimizer = adamw_over([largest_shape(cfg)])  # on the host: what an offloaded or CPU update runs
    best = _fastest_pass(lambda: _forward_backward(model, idx, layout, device), rank, barrier, stop)
    return best, _fastest_pass(optimizer.step, rank, barrier, stop)


def _forward_backward(model: Any, idx: torch.Tensor, layout: Layout, device: torch.device) -> None:
    mixed = layout.precision in AUTOCAST  # fp16 and bf16 as the runs use them: autocast on the GPU
    with torch.autocast("cuda", dtype=AUTOCAST[layout.precision]) if mixed else contextlib.nullcontext():
        _, loss = model(idx, targets=idx)
    loss.backward()
    model.zero_grad(set_to_none=True)
    if layout.gpu:
        torch.cuda.synchronize(device)  # the kernels are asynchronous: time them, not their launch


def _fastest_pass(work: Any, rank: int, barrier: Any, stop: Any) -> float:
    """The fastest of up to CALIBRATION_REPEATS timed passes of `work` after an untimed one, each started by
    every process together; rank 0 ends the passes for all once CALIBRATION_BUDGET_S is spent (at least 2)."""
    work()  # allocates, compiles kernels, warms the caches
    best, began = float("inf"), time.perf_counter()
    for done in range(CALIBRATION_REPEATS):
        if rank == 0 and done >= 2 and time.perf_counter() - began > CALIBRATION_BUDGET_S:
            stop.value = 1
        barrier.wait()  # every process has set or read the flag, and starts this pass together
        if stop.value:
            break
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
        barrier.wait()
    if rank == 0:
        stop.value = 0  # the next phase starts afresh
    barrier.wait()
    return best


# ---------------------------------------------------------------------------------------------------
# The link


def measure_link_between(processes: int, gpu: bool, gradient_numel: int) -> dict[str, Any]:
    """The link between `processes` processes (gloo on the CPU, NCCL over GPUs), as a LinkRecord's fields. They
    meet through a file, not a port, so no other program can take their rendezvous."""
    with tempfile.TemporaryDirectory() as folder:
        init = f"file://{Path(folder) / 'rendezvous'}"
        records = _gather(_link_worker, lambda rank: (processes, init, gpu, gradient_numel), processes)
    return records[0]


def _link_worker(rank: int, world: int, init: str, gpu: bool, gradient_numel: int) -> dict[str, Any] | None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from planner.link import measure_link

    torch.set_num_threads(1)
    device = torch.device("cuda", rank) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if gpu else "gloo",
        init_method=init,
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
    )
    try:
        mesh = init_device_mesh(device.type, (world,))
        record = measure_link(device, gradient_numel, torch.float32, fsdp_mesh=mesh)
        return None if record is None else record.to_dict()
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------------
# The command


def measure(
    presets: list[str], processes: list[int], threads: int, cache_dir: Path, gpu: bool = False, precision: str = "fp32"
) -> MachineProfile:
    from model import GPT2Config
    from model.shapes import parameter_shapes
    from training.config import preset_overrides

    device = torch.cuda.get_device_name(0) if gpu else "cpu"
    # Each process count at `threads` threads (a launch of several processes), and on a CPU one process at
    # torch's own thread count too when that differs: what a plain `python train.py` computes with.
    layouts = [(count, Layout(gpu, precision, threads)) for count in processes]
    if not gpu and 1 in processes and torch.get_num_threads() != threads:
        layouts.append((1, Layout(gpu, precision, torch.get_num_threads())))
    compute = []
    for preset in presets:
        for count, layout in layouts:
            peak = _peak(device, layout, cache_dir)
            rate = compute_rate(preset, count, layout, peak, device)
            compute.append(rate)
            print(
                f"{preset}, {count} process(es) of {layout.threads} thread(s) at once on {device}, {precision}: "
                f"forward+backward at MFU {rate.mfu:.3f} of {peak / 1e9:,.1f} GFLOP/s, AdamW {rate.adamw_gb_s:.1f} GB/s",
                flush=True,
            )
    cfg = GPT2Config.from_preset(preset_overrides(presets[0])["model_preset"])
    numel = sum(torch.Size(shape).numel() for shape in parameter_shapes(cfg).values())
    links = {}
    for count in (c for c in processes if c > 1):
        link = links[str(count)] = measure_link_between(count, gpu, numel)
        print(
            f"link, {count} processes ({link['backend']}): all-reduce {link['bus_gb_s']:.2f} GB/s bus bandwidth, "
            f"{link['latency_s'] * 1e6:,.0f} us per call",
            flush=True,
        )
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return MachineProfile(machine_key(device), stamp, tuple(compute), links)


def _peak(device: str, layout: Layout, cache_dir: Path) -> float:
    """One process's peak FLOP/s: a GPU's datasheet figure at the precision, else the CPU's measured matmul rate
    at the layout's threads, cached where runs read it. A GPU without a table entry cannot give an MFU."""
    from planner.cpu_peak import cpu_peak_flops
    from training.records.peaks import gpu_peak_flops

    if layout.gpu:
        peak = gpu_peak_flops(device, layout.precision)
        if not math.isfinite(peak.flops_per_s):
            raise PlanError(peak.source)
        return peak.flops_per_s
    return cpu_peak_flops(cache_dir, threads=layout.threads).flops_per_s


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m planner measure", description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="tiny", help="model presets to measure, comma-separated (default tiny)")
    parser.add_argument(
        "--processes", default=None, help="process counts, comma-separated (default 1,2, or 1 on a machine of one GPU)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process (default 1)")
    parser.add_argument(
        "--device", choices=["auto", "cpu", "gpu"], default="auto", help="default: a GPU where there is one"
    )
    parser.add_argument(
        "--precision",
        choices=["fp32", "fp16", "bf16"],
        default=None,
        help="default: fp32 on the CPU, on a GPU bf16 where it has it, else fp16 (what runs train in there)",
    )
    parser.add_argument(
        "--cache_dir", type=Path, default=None, help="default: $GPT2S_CACHE or ~/.cache/gpt2-strategies"
    )
    parser.add_argument("--out", type=Path, default=None, help="the profile's path (default: under the cache folder)")
    return parser


def measure_main(argv: list[str]) -> int:
    from training.records.peaks import default_cache_dir

    args = _parser().parse_args(argv)
    try:
        presets, counts, gpu, precision = _checked(args)
        cache_dir = args.cache_dir or default_cache_dir()
        profile = measure(presets, counts, args.threads, cache_dir, gpu, precision)
    except PlanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    path = args.out or profile_path(cache_dir, profile.machine)
    write_profile(path, profile)
    print(f"machine profile: {path}")
    return 0


def _checked(args: argparse.Namespace) -> tuple[list[str], list[int], bool, str]:
    """The presets, process counts, device and precision asked for; PlanError (one line) for what cannot be."""
    from training.config import PRESETS

    presets = [p for p in args.presets.split(",") if p]
    unknown = [p for p in presets if p not in PRESETS]
    if unknown or not presets:
        raise PlanError(f"unknown preset(s) {', '.join(unknown)} (one of {', '.join(sorted(PRESETS))})")
    if args.threads < 1:
        raise PlanError(f"--threads must be >= 1, got {args.threads}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if args.device == "gpu" and gpus == 0:
        raise PlanError("--device gpu: this machine has no GPU torch can use")
    gpu = gpus > 0 and args.device != "cpu"
    counts = _counts(args.processes or ("1" if gpu and gpus < 2 else "1,2"))
    if counts is None:
        raise PlanError(f"--processes takes positive integers, got {args.processes!r}")
    if gpu and counts[-1] > gpus:
        raise PlanError(f"--processes {counts[-1]} needs {counts[-1]} GPUs, this machine has {gpus}")
    precision = args.precision or ("fp32" if not gpu else "bf16" if torch.cuda.is_bf16_supported() else "fp16")
    if not gpu and precision != "fp32":
        raise PlanError(f"--precision {precision}: runs on the CPU train in fp32")
    return presets, counts, gpu, precision


def _counts(text: str) -> list[int] | None:
    try:
        counts = sorted({int(part) for part in text.split(",") if part})
    except ValueError:
        return None
    return counts if counts and counts[0] >= 1 else None
