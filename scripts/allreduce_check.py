"""All-reduce check: every process adds its rank + 1 into a 4 MiB tensor and checks the sum.

    accelerate launch --config_file accelerate_configs/ddp.yaml scripts/allreduce_check.py

Run before a multi-GPU training to find a broken collective in seconds rather than as a training job
that hangs (two T4s on Kaggle hang in NCCL peer-to-peer; `NCCL_P2P_DISABLE=1` works around it).
The process group is the one training uses: accelerate's, NCCL on GPUs, gloo on CPU. Exit status 0
when the sum is right on every rank, 1 when not.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
from accelerate import PartialState


def main() -> int:
    # cpu=True on a machine without a GPU, as training does: otherwise accelerate starts unconnected
    # single processes there instead of a gloo group.
    state = PartialState(cpu=not torch.cuda.is_available())
    if state.num_processes < 2:
        print("allreduce check: one process, nothing to reduce", flush=True)
        return 0
    values = torch.full((1 << 20,), float(state.process_index + 1), device=state.device)
    start = time.perf_counter()
    dist.all_reduce(values)
    if values.is_cuda:
        torch.cuda.synchronize(values.device)
    seconds = time.perf_counter() - start
    expected = state.num_processes * (state.num_processes + 1) / 2
    ok = bool(torch.all(values == expected))
    print(
        f"allreduce check: rank {state.process_index} of {state.num_processes} on {state.device} "
        f"({dist.get_backend()}): {'ok' if ok else f'WRONG SUM {values[0].item()} != {expected}'} "
        f"in {seconds * 1000:.0f} ms",
        flush=True,
    )
    dist.barrier()
    state.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
