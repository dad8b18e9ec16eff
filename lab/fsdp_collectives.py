"""FSDP's collectives on this machine's link against the planner's alpha-beta model of them.

    python -m lab.fsdp_collectives [--preset tiny] [--processes 2]

planner/cost_model.py prices every collective from one all-reduce measurement (planner/link.py): a
per-call latency (a one-element all-reduce) and a bus bandwidth (a bucket-sized all-reduce), an all-gather
or a reduce-scatter moving (N-1)/N of its buffer over that bandwidth. This times, on `--processes`
processes of one thread each (as accelerate starts them), the collectives FSDP2 issues for the preset's
units: an all-gather and a reduce-scatter (planner/link.py `tensor_collectives`) of one block and
of the root unit (the embeddings and ln_f), plus the two all-reduces planner/link.py times, and prints each
beside the alpha-beta time those two all-reduces give. Each figure is the slowest rank's mean over a few
calls after two warm-up calls. A benchmark, not a test: it prints a table and asserts nothing
(lab/results/planning_checks.md keeps the figures with the date and this command).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from model.config import GPT2Config
from model.shapes import parameter_shapes
from planner.link import DDP_BUCKET_BYTES, bus_bandwidth_gb_s, tensor_collectives
from training.cli import run_main
from training.config import preset_overrides

PORT = 29_631


def _seconds(call: Callable[[], Any], iterations: int) -> float:
    """The slowest rank's mean seconds per call, after two warm-up calls, the ranks starting together."""
    for _ in range(2):
        call()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iterations):
        call()
    slowest = torch.tensor([(time.perf_counter() - start) / iterations], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return float(slowest.item())


def _worker(rank: int, world: int, units: dict[str, int], results: Any) -> None:
    torch.set_num_threads(1)  # what accelerate's OMP_NUM_THREADS=1 gives each process
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    bucket = torch.ones(DDP_BUCKET_BYTES // 4)
    one = torch.ones(1)
    timed = {
        "latency": _seconds(lambda: dist.all_reduce(one), 20),
        "bucket": _seconds(lambda: dist.all_reduce(bucket), 5),
    }
    all_gather, reduce_scatter = tensor_collectives()  # those this torch has (2.10 lacks the *_single forms)
    for name, elements in units.items():
        full, shard = torch.ones(elements), torch.ones(elements // world)
        calls = 20 if elements < 1_000_000 else 5
        timed[f"{name} all-gather"] = _seconds(lambda f=full, s=shard: all_gather(f, s), calls)
        timed[f"{name} reduce-scatter"] = _seconds(lambda f=full, s=shard: reduce_scatter(s, f), calls)
    if rank == 0:
        results.put(timed)
    dist.destroy_process_group()


def unit_elements(preset: str, world: int) -> dict[str, int]:
    """fp32 elements of one block and of the root unit, rounded up to a multiple of `world` (FSDP2 pads)."""
    shapes = parameter_shapes(GPT2Config.from_preset(preset_overrides(preset)["model_preset"]))
    block = sum(math.prod(s) for n, s in shapes.items() if n.startswith("transformer.h.0."))
    root = sum(math.prod(s) for n, s in shapes.items() if ".h." not in n)
    return {"block": -(-block // world) * world, "root": -(-root // world) * world}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args(argv)
    if args.processes < 2:
        print("error: --processes must be at least 2 (a collective needs two)", file=sys.stderr)
        return 2
    units = unit_elements(args.preset, args.processes)
    context = mp.get_context("spawn")
    results = context.Queue()
    workers = [context.Process(target=_worker, args=(r, args.processes, units, results)) for r in range(args.processes)]
    for worker in workers:
        worker.start()
    timed = results.get(timeout=600)
    for worker in workers:
        worker.join()
    n, latency = args.processes, timed["latency"]
    # planner/link.py's bus bandwidth, net of one call's latency (planner/plan.py measured_link does the same)
    gb_s = bus_bandwidth_gb_s(DDP_BUCKET_BYTES, timed["bucket"] - latency, n)
    print(f"{args.preset}, {n} processes, gloo: all-reduce latency {latency * 1e3:.3f} ms, bus {gb_s:.3f} GB/s")
    print("| collective | fp32 elements | alpha-beta ms | measured ms | measured / alpha-beta |")
    print("|---|---:|---:|---:|---:|")
    for name, elements in units.items():
        predicted = latency + (n - 1) / n * elements * 4 / (gb_s * 1e9)
        for kind in ("all-gather", "reduce-scatter"):
            measured = timed[f"{name} {kind}"]
            row = f"| {name} {kind} | {elements:,} | {predicted * 1e3:.3f} | {measured * 1e3:.3f} | {measured / predicted:.2f} |"
            print(row)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
