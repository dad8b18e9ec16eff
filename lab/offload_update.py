"""The planner's offloaded AdamW update on this CPU: its predicted time beside the measured one.

    python -m lab.offload_update [--preset mini] [--tries 3] [--repeats 9]

planner/cost_model.py counts fsdp_offload's host update pass by pass (torch's per-tensor AdamW: 72 bytes
per element, 80 for decayed matrices) at one core's rate, because accelerate starts each process with
OMP_NUM_THREADS=1. This measures that rate on one matrix the size of the largest tensor of the preset's
rank-0 shard (2 processes), predicts the whole shard's update from its bytes, and times it, on one thread.
Steps are timed in turns and the fastest of `--repeats` kept: interference on a shared machine only slows
a step, and then falls on both alike. It prints figures; it asserts nothing (lab/results/planning_checks.md records them).
"""

from __future__ import annotations

import argparse
import sys

import torch

from model.config import GPT2Config
from model.shapes import parameter_shapes
from planner.cost_model import Workload, host_update_bytes
from planner.measure import DECAYED_BYTES_PER_ELEMENT, adamw_over, fastest_steps
from training.cli import run_main
from training.distributed import registry


def measure(preset: str, repeats: int) -> tuple[float, float, float]:
    """(one core's rate in bytes/s, predicted and measured seconds of the rank-0 shard's update)."""
    offload = next(s.name for s in registry.STRATEGIES if s.offloads)
    w = Workload(GPT2Config.from_preset(preset), 8, 64, "fp32", 2, device="cpu")
    shard = [(max(1, -(-shape[0] // 2)), *shape[1:]) for shape in parameter_shapes(w.model).values()]
    largest = max(shard, key=lambda shape: torch.Size(shape).numel())
    calibration, measured = fastest_steps([adamw_over([largest]), adamw_over(shard)], repeats)
    rate = DECAYED_BYTES_PER_ELEMENT * torch.Size(largest).numel() / calibration
    return rate, host_update_bytes(w, offload, 0) / rate, measured


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.offload_update", description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="mini", help="model preset whose shard is updated (default mini)")
    parser.add_argument("--tries", type=int, default=3, help="measurements, each printed (default 3)")
    parser.add_argument("--repeats", type=int, default=9, help="steps per measurement; the fastest kept")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # what accelerate's OMP_NUM_THREADS=1 gives each process
    try:
        for _ in range(args.tries):
            rate, predicted, measured = measure(args.preset, args.repeats)
            print(
                f"one core: {rate / 1e9:.1f} GB/s over the AdamW passes; {args.preset} rank-0 shard update "
                f"predicted {predicted * 1e3:.2f} ms, measured {measured * 1e3:.2f} ms "
                f"({measured / predicted - 1:+.0%})"
            )
    finally:
        torch.set_num_threads(threads)
    return 0


if __name__ == "__main__":
    run_main(main)
