"""One optimizer step, the gradient norm, the optimizer and its schedule, validation, and why a run stops
before its schedule ends (a signal, or a streak of non-finite steps), decided at a step boundary by every rank."""

from __future__ import annotations

import math
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from torch.optim.lr_scheduler import LRScheduler
from torch.utils.data import DataLoader, Dataset, Subset

from training.config import OptimConfig
from training.records.metrics import MetricsTracker


def make_optimizer(model: nn.Module, optim: OptimConfig, fused: bool = False) -> torch.optim.AdamW:
    """AdamW with decoupled weight decay on matrices (dim >= 2) only; biases and LayerNorms are not decayed.

    `fused`: one fused kernel for the whole update (training/distributed/speed_levers.py decides where); otherwise PyTorch's
    default, the multi-tensor (foreach) implementation.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": optim.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        groups, lr=optim.lr, betas=(optim.beta1, optim.beta2), eps=optim.eps, fused=True if fused else None
    )


def lr_factor(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """Linear warm-up to 1 over `warmup_steps`, then cosine decay to `min_ratio` at `total_steps`.

    `step` counts optimizer steps already taken, so the first step uses factor 1/warmup_steps.
    """
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def global_grad_norm(parameters: list[nn.Parameter]) -> torch.Tensor:
    """The L2 norm of all gradients, accumulated in float64 and reduced over FSDP shards.

    accelerate's `clip_grad_norm_` computes it in float32, whose rounding on GPT-2's large embedding
    gradient (about 1e-5 relative) depends on how the gradient is split into shards, so the same
    gradients gave different norms under FSDP than in one process. In float64 the strategies agree.
    """
    from torch.distributed.tensor import DTensor

    # The sums start from the first gradient's term, on its device: starting from a host zero would copy
    # it to the GPU, and a blocking host-to-device copy waits for the whole backward (a host sync).
    local_sq: torch.Tensor | None = None
    sharded_sq: torch.Tensor | None = None
    layout = None
    for p in parameters:
        if p.grad is None:
            continue
        grad = p.grad
        if isinstance(grad, DTensor):
            layout = _shard_layout(grad, layout)
            term = torch.linalg.vector_norm(grad.to_local(), dtype=torch.float64) ** 2
            sharded_sq = term if sharded_sq is None else sharded_sq + term.to(sharded_sq.device)
        else:
            term = torch.linalg.vector_norm(grad, dtype=torch.float64) ** 2
            local_sq = term if local_sq is None else local_sq + term.to(local_sq.device)
    if sharded_sq is not None and layout is not None:
        mesh, shard_dims = layout
        # Every element lives in exactly one shard of each group along the sharded dimensions, and is the same
        # on every replica along a replicated one (HSDP's): summing over the sharded dimensions only, once,
        # gives the global square. Reduced on the mesh's device: with parameters offloaded, gradients (and so
        # this sum) are on the CPU, which NCCL cannot reduce.
        sharded_sq = sharded_sq.to(mesh.device_type)
        for dim in shard_dims:
            torch.distributed.all_reduce(sharded_sq, group=mesh.get_group(dim))
    if sharded_sq is None:
        return torch.sqrt(local_sq) if local_sq is not None else torch.zeros((), dtype=torch.float64)
    return torch.sqrt(sharded_sq if local_sq is None else local_sq.to(sharded_sq.device) + sharded_sq)


def _shard_layout(grad: Any, seen: tuple[Any, tuple[int, ...]] | None) -> tuple[Any, tuple[int, ...]]:
    """(mesh, its sharded dimensions) of a DTensor gradient: each dimension sharded or replicated (FSDP: one
    sharded; HSDP: replicated, then sharded), the same for every gradient, or a RuntimeError."""
    if any(not (placement.is_shard() or placement.is_replicate()) for placement in grad.placements):
        raise RuntimeError(f"unexpected gradient placement {grad.placements}: only sharded or replicated DTensors")
    layout = (grad.device_mesh, tuple(i for i, placement in enumerate(grad.placements) if placement.is_shard()))
    if seen is not None and seen != layout:
        raise RuntimeError(f"gradients on different meshes or placements: {seen} and {layout}")
    return layout


def clip_gradients(accelerator: Accelerator, parameters: list[nn.Parameter], max_norm: float) -> torch.Tensor:
    """Unscale (fp16), measure the global grad norm before clipping, clip to `max_norm` (0 = no clipping)."""
    from torch.nn.utils import clip_grads_with_norm_

    accelerator.unscale_gradients()
    norm = global_grad_norm(parameters)
    if max_norm > 0:
        clip_grads_with_norm_(parameters, max_norm, norm.float())
    return norm


# The loss scale at and below which an fp16 overflow is no longer the grad scaler finding its scale: DeepSpeed's
# and Megatron-LM's minimum loss scale. A step skipped at a scale of 1 or less overflowed fp16 with its gradients
# not scaled up at all (or scaled down): the loss is exploding, and the step is as non-finite as an fp32 one.
MIN_LOSS_SCALE = 1.0


@dataclass(frozen=True)
class StepResult:
    grad_norm: torch.Tensor  # on the device: reading it is a host sync, left to the log interval
    skipped: bool  # the fp16 grad scaler found inf/nan gradients and did not update the weights
    skipped_unscaled: bool = False  # skipped at a loss scale of MIN_LOSS_SCALE or less: a real overflow


def train_step(
    accelerator: Accelerator,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler | None,
    micro_batches: list[dict[str, torch.Tensor]],
    tracker: MetricsTracker | None,
    grad_clip: float,
    after_backward: Callable[[], None] | None = None,
) -> StepResult:
    """One optimizer step over `micro_batches` (one per accumulation micro-step), then one schedule step.

    A step that the fp16 grad scaler skips (inf/nan gradients) did not train, so the schedule waits
    for one that does, as it would with the scaler's own bookkeeping.

    The grad norm is the global L2 norm of all gradients before clipping, measured even when clipping
    is off, and the same number under every strategy. Without a grad scaler nothing is read on the host;
    with one, whether the step was skipped is one read of the norm (`_overflowed`).

    `after_backward`, if given, is called after each micro-batch's backward (training/records/memory.py's probe).
    """
    grad_norm = torch.zeros((), device=accelerator.device)
    for batch in micro_batches:
        with accelerator.accumulate(model):
            # Only the loss is kept: holding the returned logits would keep a (B, T, vocab) tensor alive
            # through the whole backward, the largest activation of the step.
            loss = model(batch["input_ids"], batch["labels"])[1]
            accelerator.backward(loss)
            if after_backward is not None:
                after_backward()
            if tracker is not None:
                tracker.add_micro_batch(loss, batch["labels"].numel())
            if accelerator.sync_gradients:
                grad_norm = clip_gradients(accelerator, list(model.parameters()), grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    skipped = _overflowed(accelerator, grad_norm)
    if scheduler is not None and not skipped:
        scheduler.step()
    return StepResult(grad_norm, skipped, skipped and _skipped_at_scale(accelerator) <= MIN_LOSS_SCALE)


def _overflowed(accelerator: Accelerator, grad_norm: torch.Tensor) -> bool:
    """Whether the grad scaler skipped this step: its unscaled gradients held an inf or a nan.

    Not accelerate's `optimizer_step_was_skipped`, which notices a skip only when `GradScaler.step` leaves
    `optimizer.step` uncalled: a fused optimizer is always called and skips inside its kernel (accelerate issue
    #4242), so with fused AdamW (the GPU's default) every overflow read as a step taken. The global norm of the
    unscaled gradients is non-finite exactly when the scaler's found_inf is set (float64 holds the square of
    any finite float32), and is reduced over every rank already, so every rank decides alike. Reading it is a
    host sync that the foreach path's `GradScaler.step` makes anyway (it reads found_inf).
    """
    return accelerator.scaler is not None and not bool(torch.isfinite(grad_norm))


def _skipped_at_scale(accelerator: Accelerator) -> float:
    """The loss scale a step the grad scaler just skipped ran at: the scaler has backed off from it since."""
    scaler = accelerator.scaler
    return scaler.get_scale() / scaler.get_backoff_factor() if scaler is not None else math.inf


@torch.no_grad()
def evaluate(accelerator: Accelerator, model: nn.Module, loader: DataLoader) -> float:
    """Mean validation loss (token-weighted; blocks are equal-length) over all ranks; NaN with no blocks.

    The loader's blocks are the same under every strategy (see `eval_subset`): it is read to the end,
    so the blocks accelerate repeats to even out the last batch are known and dropped.
    """
    model.eval()
    losses = []
    for batch in loader:
        logits, _ = model(batch["input_ids"])
        blocks, length, vocab = logits.shape
        # The log-softmax over the vocabulary on contiguous rows: over the (B, vocab, T) transpose it read
        # strided memory and took three times as long (measured on CPU: 0.25 s against 0.075 s for 10 blocks).
        per_token = F.cross_entropy(logits.float().reshape(-1, vocab), batch["labels"].reshape(-1), reduction="none")
        per_block = per_token.view(blocks, length).mean(dim=1)
        # gather_for_metrics drops the samples accelerate repeats to even out the last batch.
        losses.append(accelerator.gather_for_metrics(per_block))
    model.train()
    if not losses:
        return float("nan")
    return torch.cat(losses).double().mean().item()


def eval_subset(val: Dataset, eval_blocks: int) -> Dataset:
    """The first `eval_blocks` validation blocks (all when 0 or more than there are).

    Stated in blocks over all processes, not batches per process: a per-process budget evaluated twice
    as many blocks with two processes, and the strategies' validation losses then measured different
    subsets.
    """
    if eval_blocks == 0 or eval_blocks >= len(val):
        return val
    return Subset(val, range(eval_blocks))


# ---------------------------------------------------------------------------------------------
# Why a run stops before its schedule ends, decided at a step boundary by every rank together. Two reasons: a
# signal (SIGTERM from a pre-empting scheduler, SIGINT from Ctrl-C) and a streak of steps whose loss or grad
# norm is not finite. Both are read once per optimizer step in one collective, so every rank stops at the same
# step: a rank that stopped alone would leave the others waiting in the next collective until its timeout.


EXIT_NONFINITE = 4


class SignalFlag:
    """SIGTERM and SIGINT set a flag instead of killing the process mid-step; a second SIGINT stops at once."""

    def __init__(self) -> None:
        self.received = 0

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # Python delivers signals to the main thread only; there is nothing to install from here
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        if self.received and signum == signal.SIGINT:
            raise KeyboardInterrupt  # Ctrl-C twice: the user does not want to wait for the checkpoint
        self.received = self.received or signum
        print(
            f"warning: {signal.Signals(signum).name} received: stopping after this step with a checkpoint "
            "(resume with --resume)",
            file=sys.stderr,
            flush=True,
        )


@dataclass(frozen=True)
class StepHealth:
    signal: int  # the signal any rank received so far, 0 for none
    nonfinite: bool  # this step's loss (on any rank) or grad norm is not finite and the weights took it


def step_health(
    accelerator: Accelerator, flag: SignalFlag, step_loss_sum: torch.Tensor, grad_norm: torch.Tensor, skipped: bool
) -> StepHealth:
    """The step's health as every rank sees it: one small all-reduce (max) and one host read.

    A step the fp16 grad scaler skipped while finding its scale (`skipped`) is not unhealthy: its inf gradients
    never reached the weights. One it skipped at the minimum loss scale is (training/step.py MIN_LOSS_SCALE).
    """
    bad_loss = ~torch.isfinite(step_loss_sum.float())
    bad_norm = ~torch.isfinite(grad_norm.float()) & torch.tensor(not skipped, device=grad_norm.device)
    local = torch.stack([torch.tensor(float(flag.received), device=grad_norm.device), (bad_loss | bad_norm).float()])
    if accelerator.num_processes > 1:
        torch.distributed.all_reduce(local, op=torch.distributed.ReduceOp.MAX)
    received, nonfinite = local.tolist()
    return StepHealth(int(received), bool(nonfinite))


class RunStopped(Exception):
    """The run stopped early on purpose; `exit_status` is train.py's, the message one line."""

    def __init__(self, message: str, exit_status: int, reason: str) -> None:
        super().__init__(message)
        self.exit_status = exit_status
        self.reason = reason


def preempted(signum: int, step: int) -> RunStopped:
    name = signal.Signals(signum).name
    return RunStopped(
        f"stopped by {name} after step {step}; its checkpoint is written: continue with --resume",
        128 + signum,
        "signal",
    )


def diverged(first_bad: int, step: int, good_checkpoint: int | None) -> RunStopped:
    where = (
        f"the newest checkpoint, step {good_checkpoint}, is the last good one"
        if good_checkpoint is not None
        else "no checkpoint was written before"
    )
    return RunStopped(
        f"{step - first_bad + 1} steps in a row (steps {first_bad}-{step}) had a non-finite loss or "
        f"grad norm: stopping; {where} (lower --lr, or raise --max_nonfinite_steps)",
        EXIT_NONFINITE,
        "nonfinite",
    )
