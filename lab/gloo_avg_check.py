"""Whether this torch's gloo averages: two CPU processes reduce-scatter and all-reduce 1 and 2 with ReduceOp.AVG.

FSDP2 reduces fp32 gradients with AVG; a gloo that sums instead doubles every FSDP gradient over 2 processes on
the CPU (the suite's strategy tests catch it). docs/compat.md holds what each release printed:

    python lab/gloo_avg_check.py        # torch 2.9.0: reduce_scatter 1.5, all_reduce 1.5
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def outcome(collective, *args) -> str:
    try:
        collective(*args, op=dist.ReduceOp.AVG)
    except RuntimeError as exc:
        return f"RuntimeError: {str(exc).splitlines()[0]}"
    return ""


def work(rank: int, rendezvous: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    out, values = torch.empty(1), torch.full((2,), float(rank + 1))
    scattered = outcome(dist.reduce_scatter_tensor, out, values) or f"{out.item():g}"
    total = torch.tensor([float(rank + 1)])
    reduced = outcome(dist.all_reduce, total) or f"{total.item():g}"
    if rank == 0:
        print(
            f"torch {torch.__version__}: gloo AVG of 1 and 2 (1.5 is right): reduce_scatter {scattered}, all_reduce {reduced}"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    # A file rendezvous: no port to find free and lose to another program before the processes bind it.
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(work, args=(str(Path(folder) / "rendezvous"),), nprocs=2)
