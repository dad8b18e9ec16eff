"""Why a run stops before its schedule ends, decided at a step boundary by every rank together.

Two reasons: a signal (SIGTERM from a pre-empting scheduler, SIGINT from Ctrl-C) and a streak of steps
whose loss or grad norm is not finite. Both are read once per optimizer step in one collective, so every
rank stops at the same step: a rank that stopped alone would leave the others waiting in the next
collective until its timeout.
"""

from __future__ import annotations

import signal
import sys
import threading
from dataclasses import dataclass

import torch
from accelerate import Accelerator

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
