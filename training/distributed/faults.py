"""One process failing alone: how its failure is told, and faults made on purpose to try that path.

A process of a multi-process job that fails during training (an exception, a write error) must end the job
with one `error:` line that names it and the cause. The others notice it only as a broken collective; they
say nothing when the launcher then stops them (its SIGTERM), so the one line is the cause's.

GPT2S_FAULT makes a fault happen, to try the failure paths (and the restarts) before a long run:

    GPT2S_FAULT="raise:rank=1:step=5"      # rank 1 raises after its optimizer step 5
    GPT2S_FAULT="save_error:rank=0:step=6" # rank 0 fails inside DCP's writer of step 6's checkpoint (no space left)
    GPT2S_FAULT="kill:step=6"              # every rank SIGKILLs itself half-way through step 6's checkpoint
    GPT2S_FAULT="inf_grad:step=3"          # step 3's gradient overflows: its last element is inf (nan_grad: nan)
    GPT2S_FAULT="term:step=5"              # SIGTERM arrives during step 5, as a pre-empting scheduler sends it

`rank` left out: every rank. `to=N` repeats a fault at every step from `step` to N. Several faults are
separated by commas ("inf_grad:step=3,term:step=5"). A fault fires only in a job's first attempt
(TORCHELASTIC_RESTART_COUNT unset or 0), so a job restarted by torchrun (--max_restarts) runs on without it.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

FAULT_VARIABLE = "GPT2S_FAULT"
EXIT_RANK_FAILED = 5
# How long a process whose collective broke waits for the launcher's SIGTERM before it reports the break as
# its own failure: torchrun stops the others within its monitor interval (0.1 s under accelerate launch)
# of seeing the failed process end.
LAUNCHER_STOP_GRACE_S = 10.0


class FaultKind(Enum):
    RAISE = "raise"  # an exception after the optimizer step
    SAVE_ERROR = "save_error"  # an OSError (no space left) inside DCP's storage writer, where a full disk fails
    KILL = "kill"  # SIGKILL at that same point: the checkpoint is written but not marked complete
    # After each backward of the step, the last element of the first parameter's gradient is set to inf (nan)
    # on the ranks that hold it (`poison_gradient`), as an fp16 overflow leaves it before the grad scaler looks.
    INF_GRAD = "inf_grad"
    NAN_GRAD = "nan_grad"
    TERM = "term"  # SIGTERM to this process during the step (after its backward), as a scheduler's pre-emption


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    step: int
    rank: int | None  # None: every rank
    to: int | None = None  # the last step it fires at (None: `step` only)

    def fires_at(self, step: int) -> bool:
        return self.step <= step <= (self.step if self.to is None else self.to)


class InjectedFault(RuntimeError):
    """The exception GPT2S_FAULT=raise:... raises."""


def parse_fault(text: str) -> Fault:
    """One fault of GPT2S_FAULT's value; ValueError (one line) when it is malformed."""
    kind, *pairs = text.strip().split(":")
    kinds = ", ".join(k.value for k in FaultKind)
    if kind not in {k.value for k in FaultKind}:
        raise ValueError(f"{FAULT_VARIABLE}={text!r}: the fault must be one of {kinds}")
    fields: dict[str, int] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        if key not in ("rank", "step", "to") or not value.isdigit():
            raise ValueError(f"{FAULT_VARIABLE}={text!r}: expected {kind}:rank=R:step=N:to=M (rank, to optional)")
        fields[key] = int(value)
    if "step" not in fields:
        raise ValueError(f"{FAULT_VARIABLE}={text!r}: give the step, e.g. {kind}:step=5")
    return Fault(FaultKind(kind), fields["step"], fields.get("rank"), fields.get("to"))


def restart_count(env: Mapping[str, str]) -> int:
    """Which restart of the job this is under torchrun's --max_restarts (0: its first attempt)."""
    return int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def planned_faults(env: Mapping[str, str]) -> tuple[Fault, ...]:
    """The faults this process is to suffer: only in the job's first attempt, only those of its rank."""
    text = env.get(FAULT_VARIABLE, "")
    if not text or restart_count(env) > 0:
        return ()
    faults = [parse_fault(part) for part in text.split(",")]
    return tuple(f for f in faults if f.rank in (None, int(env.get("RANK", "0"))))


@functools.cache
def _this_process_fault() -> tuple[Fault, ...]:
    return planned_faults(os.environ)


def _due(kind: FaultKind, step: int) -> bool:
    return any(f.kind is kind and f.fires_at(step) for f in _this_process_fault())


def after_step(step: int) -> None:
    """Called after every optimizer step: GPT2S_FAULT=raise:... raises here."""
    if _due(FaultKind.RAISE, step):
        raise InjectedFault(f"{FAULT_VARIABLE} fault after step {step}")


def inside_checkpoint_writer(step: int) -> None:
    """Called by DCP's storage writer as it starts writing this rank's part of a checkpoint."""
    if _due(FaultKind.SAVE_ERROR, step):
        raise OSError(errno.ENOSPC, f"No space left on device ({FAULT_VARIABLE} fault writing step {step})")


def during_checkpoint_write(step: int) -> None:
    """Called once a checkpoint's states are on disk and before it is marked complete."""
    if _due(FaultKind.KILL, step):
        os.kill(os.getpid(), signal.SIGKILL)


def with_step_faults(step: int, model: Any, after_backward: Callable[[], None] | None) -> Callable[[], None] | None:
    """`after_backward` (called after each backward of optimizer step `step`), with GPT2S_FAULT's faults of that
    step added: an overflowing gradient (inf_grad, nan_grad) after each backward, and a SIGTERM (term) once, as a
    scheduler sends it. Unchanged when none is due."""
    value = float("inf") if _due(FaultKind.INF_GRAD, step) else float("nan") if _due(FaultKind.NAN_GRAD, step) else None
    term = _due(FaultKind.TERM, step)
    if value is None and not term:
        return after_backward

    def faults_then_after_backward() -> None:
        nonlocal term
        if value is not None:
            poison_gradient(model, value)
        if term:
            term = False
            os.kill(os.getpid(), signal.SIGTERM)  # the handler (training/step.py) sets a flag: nothing stops here
        if after_backward is not None:
            after_backward()

    return faults_then_after_backward


def poison_gradient(model: Any, value: float) -> None:
    """Set the last element of the first parameter's gradient to `value`, where it lives: under DDP or one
    process on every rank (each holds the whole, reduced gradient); sharded (FSDP, HSDP), on the ranks whose
    shard holds it alone, so that only a grad scaler that agrees over all ranks makes every rank skip the step.

    FSDP2 shards a parameter along dimension 0 in torch.chunk's pieces of ceil(rows / shards) rows: the last
    row is in piece (rows - 1) // ceil(rows / shards) of each sharded mesh dimension.
    """
    import torch
    from torch.distributed.tensor import DTensor

    grad = next(iter(model.parameters())).grad
    if grad is None:  # not yet accumulated on this micro-batch (FSDP2 reduces on the step's last)
        return
    if isinstance(grad, DTensor):
        coordinate = grad.device_mesh.get_coordinate()
        for dim, placement in enumerate(grad.placements):
            if placement.is_shard():
                rows, shards = grad.shape[placement.dim], grad.device_mesh.size(dim)
                if coordinate is None or coordinate[dim] != (rows - 1) // -(-rows // shards):
                    return
        grad = grad.to_local()
    with torch.no_grad():
        grad[(-1,) * grad.dim()] = value


# ---------------------------------------------------------------------------------------------
# Telling a process's failure


class RankFailed(Exception):
    """A process failed during training; `quiet` when it only saw another process go (the launcher stopped it)."""

    def __init__(self, message: str, quiet: bool) -> None:
        super().__init__(message)
        self.quiet = quiet


class PeerCheckpointFailed(RuntimeError):
    """Another rank failed writing the checkpoint this rank was writing: an echo, which that rank tells."""


@contextlib.contextmanager
def checkpoint_failure_told_once(rank: int) -> Iterator[None]:
    """Inside DCP's save, one rank's write error (a full disk) reaches every rank as one CheckpointException
    listing each failed rank's exception. The lowest failed rank raises its own exception, to be told as
    its failure; every other rank raises PeerCheckpointFailed, an echo that stays quiet."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except CheckpointException as exc:
        failures = exc.failures
        if failures and rank == min(failures):
            own, _trace = failures[rank]
            raise own from None
        raise PeerCheckpointFailed(f"rank(s) {sorted(failures)} failed writing the checkpoint") from None


def is_broken_collective(exc: BaseException) -> bool:
    """The error a process gets when a peer of its collective has gone (gloo's closed connection, NCCL's
    error, a timeout, another rank's failed checkpoint write), rather than a failure of its own."""
    import torch.distributed as dist

    text = str(exc)
    return isinstance(exc, (dist.DistError, PeerCheckpointFailed)) or any(
        mark in text for mark in ("Connection closed by peer", "Connection reset by peer", "gloo", "NCCL")
    )


def stopped_by_launcher(received: Callable[[], int], grace_s: float = LAUNCHER_STOP_GRACE_S) -> bool:
    """Whether SIGTERM (the launcher stopping the job) arrives within `grace_s`; polled, since the handler only
    sets a flag."""
    deadline = time.monotonic() + grace_s
    while not received():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def rank_failure(exc: BaseException, rank: int, step: int, received: Callable[[], int], multi: bool) -> RankFailed:
    """The failure of this process after optimizer step `step`, quiet when it is the echo of another's."""
    quiet = multi and is_broken_collective(exc) and stopped_by_launcher(received)
    return RankFailed(f"rank {rank} failed after step {step}: {type(exc).__name__}: {exc}", quiet)


# ---------------------------------------------------------------------------------------------
# Restarts


_restart_stores: list[object] = []  # the store rank 0 hosts for a restarted attempt, kept alive by reference


def fresh_store_on_restart(env: dict[str, str] | os._Environ, timeout_s: int) -> None:
    """On a torchrun restart, give the new attempt's process group a store of its own (sets MASTER_PORT).

    accelerate launch uses torchrun's static rendezvous, which keeps one TCPStore (the agent's) for every
    attempt, and the process group's keys in it carry no attempt number: the restarted processes read the
    dead attempt's gloo addresses and fail ("Connection refused" in connectFullMesh). So rank 0 hosts a new
    store on a free port and tells the others the port through the agent's store, under this restart's key.

    Rank 0 opens that store itself on a port the kernel picks and keeps it open: the process group's own
    store (env:// with multi_tenant) then serves from the same socket. Probing a free port and closing it
    again would leave the port to anyone between the probe and the process group's bind.
    """
    restart = restart_count(env)
    if restart == 0 or env.get("TORCHELASTIC_USE_AGENT_STORE") != str(True):
        return
    import datetime

    from torch.distributed import TCPStore

    agent = TCPStore(
        env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, timeout=datetime.timedelta(seconds=timeout_s)
    )
    key = f"gpt2s/restart_{restart}/master_port"
    if env.get("RANK", "0") == "0":
        timeout = datetime.timedelta(seconds=timeout_s)
        store = TCPStore(env["MASTER_ADDR"], 0, is_master=True, multi_tenant=True, timeout=timeout)
        _restart_stores.append(store)  # open until the process ends; the process group reuses its server
        agent.set(key, str(store.port))
    env["MASTER_PORT"] = agent.get(key).decode()
    env["TORCHELASTIC_USE_AGENT_STORE"] = str(False)  # rank 0 then hosts the store on that port
