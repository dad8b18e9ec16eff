"""One training step of ddp, fsdp or fsdp_zero2 on this CPU, timed by phase.

    python -m lab.fsdp_step_pieces tiny fsdp 1 7 [--profile]

Two gloo processes of one thread each (as accelerate starts them) run the step training/step.py runs: the
model wrapped as accelerate wraps it (DistributedDataParallel; or `fully_shard` on each block, then the
root, resharding after forward for `fsdp` only), each micro-step's forward and backward (the gradient
synchronised in the last one only), the global grad norm and clipping, then AdamW. It prints the slowest
rank's mean of each phase over the steps after the first two: where FSDP's step spends what DDP's does not
(lab/results/planning_checks.md, "What the model misses for FSDP"). `--profile` also prints torch.profiler's table of the
last step on rank 0. A benchmark, not a test: it prints figures and asserts nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from model import GPT2, GPT2Config
from training.config import OptimConfig, preset_overrides
from training.distributed import registry
from training.distributed.registry import Communication
from training.step import global_grad_norm, make_optimizer

PORT = 29_632
PHASES = ("step", "forward_backward", "norm_clip", "adamw")


def _strategies() -> list[str]:
    """The registry's strategies this times: the all-reducing one and the sharding ones kept on the device."""
    return [
        name
        for name in registry.names()
        if registry.get(name).communication is Communication.ALL_REDUCE
        or (registry.get(name).shards and not registry.get(name).offloads and not registry.get(name).fsdp.hybrid)
    ]


def _wrap(model: torch.nn.Module, strategy: str) -> torch.nn.Module:
    entry = registry.get(strategy)
    if not entry.shards:
        return torch.nn.parallel.DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard

    reshard = entry.fsdp.reshard_after_forward
    for block in model.transformer.h:
        fully_shard(block, reshard_after_forward=reshard)
    return fully_shard(model, reshard_after_forward=reshard)


def _sync_context(model: Any, strategy: str, last: bool) -> Any:
    """Gradients synchronised in the last micro-step only, as accelerate's `accumulate` does."""
    if not registry.get(strategy).shards:
        return contextlib.nullcontext() if last else model.no_sync()
    model.set_requires_gradient_sync(last)
    return contextlib.nullcontext()


def _worker(rank: int, preset: str, strategy: str, micro_steps: int, steps: int, profile: bool, out: Any) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    values = preset_overrides(preset)
    cfg = GPT2Config.from_preset(values["model_preset"])
    torch.manual_seed(0)
    model = _wrap(GPT2(cfg), strategy)
    optimizer = make_optimizer(model, OptimConfig())
    shape = (values["micro_batch_size"], values["block_size"])
    idx = torch.randint(0, cfg.vocab_size, shape, generator=torch.Generator().manual_seed(rank))
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if profile else None
    timings = []
    for step in range(steps):
        if profiler is not None and step == steps - 1:
            profiler.__enter__()
        start, forward_backward = time.perf_counter(), 0.0
        for micro in range(micro_steps):
            begin = time.perf_counter()
            with _sync_context(model, strategy, micro == micro_steps - 1):
                model(idx, idx)[1].backward()
            forward_backward += time.perf_counter() - begin
        clip = time.perf_counter()
        parameters = list(model.parameters())
        torch.nn.utils.clip_grads_with_norm_(parameters, 1.0, global_grad_norm(parameters).float())
        update = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        end = time.perf_counter()
        timings.append((end - start, forward_backward, update - clip, end - update))
    if profiler is not None:
        profiler.__exit__(None, None, None)
        if rank == 0:
            print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
    out.put(timings[2:])
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    profile = "--profile" in args
    args = [a for a in args if a != "--profile"]
    if len(args) != 4 or args[1] not in _strategies() or not (args[2].isdigit() and args[3].isdigit()):
        print(f"error: usage: PRESET {{{','.join(_strategies())}}} MICRO_STEPS STEPS [--profile]", file=sys.stderr)
        return 2
    preset, strategy, micro_steps, steps = args[0], args[1], int(args[2]), int(args[3])
    if micro_steps < 1 or steps < 3:
        print("error: MICRO_STEPS must be at least 1 and STEPS at least 3", file=sys.stderr)
        return 2
    context = mp.get_context("spawn")
    out = context.Queue()
    workers = [
        context.Process(target=_worker, args=(r, preset, strategy, micro_steps, steps, profile, out)) for r in range(2)
    ]
    for worker in workers:
        worker.start()
    ranks = [out.get(timeout=600) for _ in workers]
    for worker in workers:
        worker.join()
    means = {
        phase: max(sum(t[i] for t in timings) / len(timings) for timings in ranks) for i, phase in enumerate(PHASES)
    }
    print(strategy, micro_steps, json.dumps({k: round(v, 4) for k, v in means.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
