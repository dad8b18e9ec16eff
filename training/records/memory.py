"""What a run measures of its own memory, for planner/plan.py to put beside its prediction.

Two figures per process, both in bytes:
  * model state: the parameters, gradients and optimizer state this process holds, read from the live
    tensors right after the first optimizer step (local shards under FSDP, wherever they are stored);
  * the peak of live tensor bytes during one training step (the "probe step": the second, the first
    with optimizer state from its start, or the first when a run has one step). On a GPU it is
    `torch.cuda.max_memory_allocated` since the epoch began (steps 1 and 2); on the CPU, where no
    allocator keeps a peak, PyTorch's MemTracker (torch.distributed._tools) follows every tensor
    storage created or freed during the step.

MemTracker sees the tensors the step creates and those of the model and optimizer; it cannot see
tensors allocated before the step that are neither, of which a run has one kind: DDP's gradient
buckets. Their size, read from DDP's own logging data, is added to the tracked peak when the tracker
did not see them allocated (both figures are recorded).
"""

from __future__ import annotations

import contextlib
import resource
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from training.distributed.strategy import local_tensor, optimizer_tensors


def _bytes(tensors: list[torch.Tensor]) -> int:
    seen: set[tuple[int, int]] = set()
    total = 0
    for t in tensors:
        local = local_tensor(t)
        # The same tensor listed twice counts once; distinct views of one flat buffer (FSDP's shards) each count.
        key = (local.data_ptr(), local.numel())
        if key in seen and local.numel():
            continue
        seen.add(key)
        total += local.numel() * local.element_size()
    return total


def model_state_bytes(optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer state this process holds (call after a step, before zero_grad)."""
    params, grads, states = optimizer_tensors(optimizer)
    return {"parameters": _bytes(params), "gradients": _bytes(grads), "optimizer": _bytes(states)}


def ddp_bucket_bytes(model: nn.Module) -> int:
    """Bytes of DDP's gradient buckets (0 when the model is not DDP), as DDP itself reports them."""
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        return 0
    data = model._get_ddp_logging_data()
    sizes = data.get("bucket_sizes", "")
    return sum(int(size) for size in str(sizes).split(",") if size.strip())


@dataclass
class MemoryProbe:
    """Measures model state after the first step and the probe step's peak; `result` is summary.json's "memory".

    Every process measures its own; the figures of all processes are gathered to each, so the main
    process records them in rank order (lists of one entry per process).
    """

    device: torch.device
    probe_step: int
    model: nn.Module
    optimizer: torch.optim.Optimizer  # the torch optimizer itself, not accelerate's wrapper
    result: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._own: dict[str, Any] = {}
        # Not removed once it has run: torch iterates over the live dict of step hooks (see ShardingObserver).
        self.optimizer.register_step_post_hook(self._after_first_step)

    def _after_first_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if "model_state_bytes" not in self._own:
            self._own["model_state_bytes"] = model_state_bytes(optimizer)

    @contextlib.contextmanager
    def around(self, step: int) -> Iterator[Callable[[], None] | None]:
        """Wrap the training step numbered `step` (1-based); only the probe step is measured.

        Yields what the step must call after each micro-batch's backward (None: nothing): MemTracker
        takes a second forward of the model before the step's end for a bug unless told it is a new pass.
        """
        if step != self.probe_step:
            yield None
            return
        own = self._own
        if self.device.type == "cuda":
            yield None
            own["step_peak_bytes"] = torch.cuda.max_memory_allocated(self.device)
            source = f"torch.cuda.max_memory_allocated, steps 1-{step}"
        elif self.device.type == "cpu":
            from torch.distributed._tools.mem_tracker import MemTracker

            tracker = MemTracker()
            tracker.track_external(self.model, self.optimizer)
            rebuilt_before = getattr(self.model, "_has_rebuilt_buckets", True)
            with tracker:
                yield tracker.reset_mod_stats
            # Keyed by device without an index ("cpu"), while the accelerator's may have one ("cpu:0").
            peak = next((v for k, v in tracker.get_tracker_snapshot("peak").items() if k.type == "cpu"), {})
            tracked = int(peak.get("Total", 0))
            # DDP allocates its buckets before the first step and once more at the start of the second
            # (in the order the first backward produced gradients): only in that step does the tracker
            # see them; in any other they were there all along, unseen, and are added.
            rebuilt_now = not rebuilt_before and getattr(self.model, "_has_rebuilt_buckets", False)
            unseen = 0 if rebuilt_now else ddp_bucket_bytes(self.model)
            own["step_peak_bytes"] = tracked + unseen
            own["step_peak_tracked_bytes"] = tracked
            own["step_peak_unseen_ddp_bucket_bytes"] = unseen
            own["step_peak_by_kind"] = {
                str(kind).split(".")[-1].lower(): int(n) for kind, n in peak.items() if str(kind) != "Total"
            }
            source = f"torch.distributed._tools.MemTracker, step {step}"
        else:
            yield None
            return
        ranks = _gather(own)
        self.result.update(
            {"probe_step": step, "step_peak_source": source, **{key: [r.get(key) for r in ranks] for key in own}}
        )


def _gather(value: dict[str, Any]) -> list[dict[str, Any]]:
    """Every process's `value`, in rank order (just this one without a process group)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


# ---------------------------------------------------------------------------------------------
# Readings of the device's allocator, for the per-epoch peak and step timings


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so a perf_counter difference measures the work itself."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


MIB = 2**20


def peak_memory_mib(device: torch.device) -> tuple[float, float]:
    """(peak allocated, peak reserved) in MiB since the last reset.

    On CPU both are the process's peak resident set size, which the OS cannot reset: on CPU the
    per-epoch figure is the peak since the process started.
    """
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / MIB, torch.cuda.max_memory_reserved(device) / MIB
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss_bytes = rss if sys.platform == "darwin" else rss * 1024  # Linux reports KiB, macOS bytes
    return rss_bytes / MIB, rss_bytes / MIB
