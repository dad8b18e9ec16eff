"""The training run: set up, train (step, log, evaluate, checkpoint), finish."""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

from training.batching import chunks
from training.checkpoints.resume import origin_record
from training.checkpoints.store import background_groups, start_checkpoint
from training.config import RunError
from training.distributed.faults import RankFailed, after_step, rank_failure, with_step_faults
from training.durable import write_atomic
from training.records.memory import reset_peak_memory, synchronize
from training.records.metrics import epoch_summary, eval_line, total_summary
from training.records.record import (
    CheckpointSave,
    EpochFigures,
    EvalLine,
    RunFacts,
    RunSummary,
    StopRecord,
    run_summary,
)
from training.records.sinks import wandb_summary_key
from training.step import RunStopped, StepHealth, diverged, evaluate, preempted, step_health, train_step
from training.trainer import Trainer

__all__ = ["RunError", "run_training"]


def run_training(cfg: Any) -> dict[str, Any]:
    """Train as configured (a training.config.TrainConfig); returns the summary, also in summary.json.

    A run stopped early on purpose (a signal, a non-finite streak) still finishes: its summary's "stop"
    says why and with which exit status train.py ends.
    """
    trainer = Trainer(cfg)
    try:
        try:
            train(trainer)
        except RunStopped as stop:
            return finish(trainer, stop)
        return finish(trainer)
    except CheckpointWriteFailed as failed:  # told as the failure after the step whose checkpoint it was
        raise _failed(trainer, failed.cause, failed.step) from failed.cause
    except Exception as exc:  # after set-up a failure is this process's alone: train.py tells it
        _let_pending_save_finish(trainer)
        raise _failed(trainer, exc, trainer.state.step) from exc


# How long a failing process waits for a background save already under way before it exits: its files are
# written or nearly so, and only the wait lets it be marked complete (the thread that marks it dies with the
# process). Bounded: the failure may be what keeps the save from finishing (a peer that died mid-collective).
SETTLE_ON_FAILURE_S = 120.0


def _let_pending_save_finish(s: Trainer, timeout_s: float | None = None) -> None:
    """Give a background save in flight the chance to be marked complete before the process fails; whatever
    becomes of it, the failure being raised is the one told."""
    pending, s.pending_save = s.pending_save, None
    if pending is None:
        return
    limit = min(SETTLE_ON_FAILURE_S, s.cfg.run.collective_timeout_s) if timeout_s is None else timeout_s
    try:
        pending.future.result(timeout=limit)
    except Exception:  # a write that failed or did not finish in time: the previous checkpoint stays the newest
        return
    s.last_checkpoint = pending.step


class CheckpointWriteFailed(Exception):
    """Writing a checkpoint in the background failed (found when the next save or the end waits on it)."""

    def __init__(self, step: int, cause: Exception) -> None:
        super().__init__(f"writing the checkpoint of step {step} failed: {cause}")
        self.step, self.cause = step, cause


def _failed(s: Trainer, exc: Exception, step: int) -> RankFailed:
    accelerator = s.accelerator
    return rank_failure(exc, accelerator.process_index, step, lambda: s.signals.received, accelerator.num_processes > 1)


# ---------------------------------------------------------------------------------------------
# Training


def train(s: Trainer) -> None:
    """Optimizer steps until the schedule ends or --stop_after_steps, an epoch at a time."""
    progress = _progress_bar(s.is_main, total=s.schedule.stop_at, initial=s.state.step)
    s.model.train()
    while s.state.step < s.schedule.stop_at:
        _train_epoch(s, progress)
    progress.close()


def _train_epoch(s: Trainer, progress: Any) -> None:
    """The rest of the current epoch (all of it unless resumed inside it), or until the stop step."""
    state = s.state
    s.sampler.use_epoch(state.epoch)
    if state.steps_in_epoch == 0:
        reset_peak_memory(s.accelerator.device)
    skip = state.steps_in_epoch * s.geometry.grad_accum_steps
    loader = s.accelerator.skip_first_batches(s.train_loader, skip) if skip else s.train_loader
    clock = _StepClock(s)
    for micro_batches in chunks(loader, s.geometry.grad_accum_steps):
        health = _optimizer_step(s, micro_batches, clock)
        after_step(state.step)  # GPT2S_FAULT's test-only fault, if one is set for this step and rank
        paused = _after_step(s, progress, health)
        if state.steps_in_epoch == 0 or state.step >= s.schedule.stop_at:  # the epoch closed, or we stop
            return
        if paused:
            clock.restart()  # evaluation and checkpointing are not training time


class _StepClock:
    """Wall time of each optimizer step: perf_counter differences after the device finished its work."""

    def __init__(self, s: Trainer) -> None:
        self.device = s.accelerator.device
        self.restart()

    def restart(self) -> None:
        synchronize(self.device)
        self.start = time.perf_counter()

    def lap(self) -> float:
        synchronize(self.device)
        now = time.perf_counter()
        seconds, self.start = now - self.start, now
        return seconds


def _optimizer_step(s: Trainer, micro_batches: list[Any], clock: _StepClock) -> StepHealth:
    state = s.state
    lr = s.optimizer.param_groups[0]["lr"]  # the rate this step applies (a resume sets it: follow_schedule)
    with s.memory.around(state.step + 1) as after_backward:
        result = train_step(
            s.accelerator,
            s.model,
            s.optimizer,
            s.scheduler,
            micro_batches,
            s.tracker,
            s.cfg.optim.grad_clip,
            with_step_faults(state.step + 1, s.model, after_backward),  # GPT2S_FAULT's test-only faults, if any
        )
    # A skip at the minimum loss scale is a real overflow: it counts towards --max_nonfinite_steps.
    harmless_skip = result.skipped and not result.skipped_unscaled
    health = step_health(s.accelerator, s.signals, s.tracker.step_loss_sum, result.grad_norm, harmless_skip)
    seconds = clock.lap()
    s.times.train_s += seconds
    state.step += 1
    state.steps_in_epoch += 1
    s.tracker.end_step(
        state.step, state.epoch, state.step * s.geometry.tokens_per_step, result.grad_norm, lr, seconds, result.skipped
    )
    return health


# ---------------------------------------------------------------------------------------------
# After each step: what is due, decided from the loop's state alone


@dataclass(frozen=True)
class Cadence:
    """How often things happen, fixed for the run (--log_interval, ... and the schedule); 0: never."""

    log_interval: int
    eval_interval: int
    checkpoint_interval: int
    max_nonfinite_steps: int
    steps_per_epoch: int
    stop_at: int  # where this launch stops
    total_steps: int  # where the schedule ends (the end validates anyway)


@dataclass(frozen=True)
class LoopState:
    """Where the loop is after an optimizer step: the facts `decide` needs."""

    cadence: Cadence
    step: int  # the step just finished
    steps_in_epoch: int  # steps of the current epoch, this one included
    nonfinite: bool  # this step's loss or grad norm was not finite
    nonfinite_since: int | None  # first step of the streak of non-finite steps before this one
    signal: int  # a signal that arrived (0: none); on any rank, as the step's health all-reduce says


class Stop(Enum):
    DIVERGED = "diverged"  # --max_nonfinite_steps non-finite steps in a row
    SIGNAL = "signal"  # preempted: stop after this step's checkpoint


@dataclass(frozen=True)
class Actions:
    """What the loop does after the step, in this order, then whether it stops."""

    log: bool
    evaluate: bool  # an --eval_interval validation (an epoch's end validates when it closes)
    close_epoch: bool
    checkpoint: bool
    write_summary: bool
    nonfinite_since: int | None  # the streak of non-finite steps, this one included; None after a finite step
    stop: Stop | None

    @property
    def pauses(self) -> bool:
        """Whether training pauses (evaluation and checkpointing are not training time)."""
        return self.evaluate or self.close_epoch or self.checkpoint


def decide(state: LoopState) -> Actions:
    """Log, validate, close the epoch and checkpoint as due, or stop.

    On a signal the step in flight is finished, logged and checkpointed, and the run stops. During a
    streak of non-finite steps nothing is checkpointed, so the newest checkpoint stays a good one; the
    streak reaching --max_nonfinite_steps stops the run (before a signal would).
    """
    c = state.cadence
    since = None if not state.nonfinite else state.step if state.nonfinite_since is None else state.nonfinite_since
    epoch_done = state.steps_in_epoch == c.steps_per_epoch
    stopping = state.step >= c.stop_at or state.signal != 0
    final_eval_follows = stopping and state.step >= c.total_steps
    due = bool(c.checkpoint_interval) and state.step % c.checkpoint_interval == 0
    diverged = since is not None and bool(c.max_nonfinite_steps) and state.step - since + 1 >= c.max_nonfinite_steps
    return Actions(
        log=state.step % c.log_interval == 0 or epoch_done or stopping or state.nonfinite,
        evaluate=(
            bool(c.eval_interval)
            and state.step % c.eval_interval == 0
            and not epoch_done
            and not final_eval_follows
            and not state.signal
        ),
        close_epoch=epoch_done,
        checkpoint=(due or stopping) and since is None,
        write_summary=epoch_done or stopping,
        nonfinite_since=since,
        stop=Stop.DIVERGED if diverged else Stop.SIGNAL if state.signal else None,
    )


def _loop_state(s: Trainer, health: StepHealth) -> LoopState:
    run_cfg, schedule = s.cfg.run, s.schedule
    cadence = Cadence(
        run_cfg.log_interval,
        run_cfg.eval_interval,
        run_cfg.checkpoint_interval,
        run_cfg.max_nonfinite_steps,
        schedule.steps_per_epoch,
        schedule.stop_at,
        schedule.total_steps,
    )
    return LoopState(cadence, s.state.step, s.state.steps_in_epoch, health.nonfinite, s.nonfinite_since, health.signal)


def _after_step(s: Trainer, progress: Any, health: StepHealth) -> bool:
    """Carry out what `decide` says is due after this step; True when any of it paused training."""
    actions = decide(_loop_state(s, health))
    s.nonfinite_since = actions.nonfinite_since
    if health.nonfinite:
        _warn_nonfinite(s)
    if actions.log:
        _log_interval(s, progress)
    if actions.evaluate:
        evaluate_now(s)
    if actions.close_epoch:
        _close_epoch(s, partial=False)
    if actions.checkpoint:
        # The last save of the launch (its end, a signal's) is synchronous: the process may exit right after.
        checkpoint_now(s, wait=actions.stop is not None or s.state.step >= s.schedule.stop_at)
    if actions.write_summary:
        _write_summary(s, complete=False)
    if actions.stop is Stop.DIVERGED:
        settle_checkpoint(s)  # the newest good checkpoint it names is complete
        raise diverged(s.nonfinite_since, s.state.step, s.last_checkpoint)
    if actions.stop is Stop.SIGNAL:
        raise preempted(health.signal, s.state.step)
    return actions.pauses


def _warn_nonfinite(s: Trainer) -> None:
    streak = s.state.step - s.nonfinite_since + 1
    limit = s.cfg.run.max_nonfinite_steps
    s.log(
        f"warning: step {s.state.step}: non-finite loss or grad norm ({streak} in a row"
        f"{f' of {limit} allowed' if limit else ''}); no checkpoint until a finite step"
    )


def _log_interval(s: Trainer, progress: Any) -> None:
    new = s.tracker.flush()
    line = s.tracker.interval_line(new, s.times.train_s)
    s.emit(line.line())
    progress.update(line.step - progress.n)  # `new` may begin with steps a resumed run took back from its checkpoint
    progress.set_postfix(loss=f"{line.loss:.3f}", tok_s=f"{line.tokens_per_s:,.0f}")


def _close_epoch(s: Trainer, partial: bool) -> None:
    state = s.state
    # Kept as the JSON object the summary and the checkpoint hold.
    state.epochs.append(asdict(epoch_summary(s.tracker, state.epoch, evaluate_now(s), partial=partial)))
    state.epoch += 1
    state.steps_in_epoch = 0


# ---------------------------------------------------------------------------------------------
# Evaluating and checkpointing


def evaluate_now(s: Trainer) -> EvalLine:
    """Validate on the run's validation blocks; the result is logged and kept as the latest."""
    synchronize(s.accelerator.device)
    start = time.perf_counter()
    val_loss = evaluate(s.accelerator, s.model, s.val_loader)
    synchronize(s.accelerator.device)
    seconds = time.perf_counter() - start
    s.times.eval_s += seconds
    line = eval_line(s.state.step, s.state.epoch, s.state.step * s.geometry.tokens_per_step, val_loss, seconds)
    s.emit(line.line())
    s.last_val = line
    return line


def checkpoint_now(s: Trainer, wait: bool = True) -> None:
    """Checkpoint this step, once the save before it is complete. With --checkpoint_async and not `wait`, training
    pauses only while the states are copied to host memory, and the write goes on beside it (settle_checkpoint).

    A save of this very step already in flight is waited for, not written again: on a signal the grace
    period pays for one save, not two. A save of an earlier step is waited for before this one starts rather
    than run beside it: this save's prune would delete the folder still being written (it has no complete.json
    yet), and two writes would share the disk and double the host memory (docs/design/faults.md)."""
    in_flight = s.pending_save
    settle_checkpoint(s)
    state = s.state
    if in_flight is not None and in_flight.step == state.step:
        return
    s.tracker.settle()  # the steps since the last metrics line too: a resume from here must not lose them
    state.records, state.unlogged = [vars(r) for r in s.tracker.records], s.tracker.unlogged
    state.times = {"train_s": s.times.train_s, "eval_s": s.times.eval_s, "checkpoint_s": s.times.checkpoint_s}
    train_state = {"state": state.state_dict(), "scheduler": s.scheduler.state_dict()}
    effective = s.launch.effective
    origin = origin_record(effective.strategy, s.accelerator.num_processes, s.identity)
    asynchronous = s.cfg.run.checkpoint_async and not wait
    if asynchronous and s.save_groups is None:
        s.save_groups = background_groups(s.cfg.run.collective_timeout_s)  # once, on every rank at the same save
    s.pending_save = start_checkpoint(
        s.accelerator,
        s.model,
        s.optimizer,
        s.out,
        state.step,
        s.model_config.to_dict(),
        s.cfg.run.keep_checkpoints,
        train_state,
        origin,
        asynchronous=asynchronous,
        groups=s.save_groups,
    )
    s.times.checkpoint_s += s.pending_save.blocked_s
    if not asynchronous:
        settle_checkpoint(s)


# The longest a save is waited for: generous, since writing a large model's states to a slow disk takes minutes;
# a stalled file system must still end the run with one line rather than hold its machines for ever.
SAVE_WAIT_S = 3600.0


def settle_checkpoint(s: Trainer) -> None:
    """Wait until the save in progress, if any, is complete, and record how long it paused training and took.

    Raises CheckpointWriteFailed when its write failed (the previous checkpoint is then the newest complete).
    """
    pending, s.pending_save = s.pending_save, None
    if pending is None:
        return
    try:
        waited = pending.wait(SAVE_WAIT_S)
    except Exception as exc:  # a TimeoutError too: told as a failed write of that step
        raise CheckpointWriteFailed(pending.step, exc) from exc
    s.times.checkpoint_s += waited
    s.checkpoint_saves.append(
        CheckpointSave(pending.step, pending.asynchronous, pending.blocked_s + waited, pending.total_s)
    )
    s.last_checkpoint = pending.step


# ---------------------------------------------------------------------------------------------
# Finishing


def finish(s: Trainer, stop: RunStopped | None = None) -> dict[str, Any]:
    """Close a partial last epoch, export, write the summary, close the sinks, then the process group."""
    settle_checkpoint(s)  # nothing of a save is left in flight when the process ends
    complete = s.state.step >= s.schedule.total_steps and stop is None
    if complete and s.state.steps_in_epoch:
        _close_epoch(s, partial=True)  # the step budget ended inside an epoch
    if complete and s.cfg.run.export_hf:
        _export_hf(s)
    summary = _write_summary(s, complete, stop)
    s.wandb.summary({wandb_summary_key(k): v for k, v in summary.total.to_dict().items() if v is not None})
    s.wandb.finish()
    s.log(_closing_line(s, summary))
    sync_line = s.wandb.sync_line()
    if sync_line:
        s.log(sync_line)
    s.accelerator.wait_for_everyone()
    # Last: after this no rank may touch a collective.
    s.accelerator.state.destroy_process_group()
    return summary.to_dict()


def _write_summary(s: Trainer, complete: bool, stop: RunStopped | None = None) -> RunSummary:
    summary = _summary(s, complete, stop)
    if s.is_main:
        write_atomic(s.out / "summary.json", json.dumps(summary.to_dict(), indent=2))
    return summary


def _closing_line(s: Trainer, summary: RunSummary) -> str:
    t = summary.total
    skipped = f", {t.skipped_steps} skipped (fp16 overflow)" if t.skipped_steps else ""
    return (
        f"{'done' if summary.complete else 'stopped'}: {s.state.step} of {s.schedule.total_steps} steps"
        f"{skipped}, loss {_shown(t.final_loss, '.4f')}, val loss {_shown(t.final_val_loss, '.4f')}, "
        f"{_shown(t.tokens_per_s, ',.0f')} tokens/s, peak allocated {_shown(t.peak_mem_allocated_mib_max, '.0f')} "
        f"MiB, train time {t.train_time_s:.1f} s -> {s.out}"
    )


def _shown(value: float | None, spec: str) -> str:
    """A figure of the closing line; a non-finite one (null in summary.json) shows as n/a."""
    return "n/a" if value is None or not math.isfinite(value) else format(value, spec)


def _summary(s: Trainer, complete: bool, stop: RunStopped | None = None) -> RunSummary:
    """The run's summary: its launch record and how far it got."""
    geometry, state, records = s.geometry, s.state, s.tracker.records
    epochs = [EpochFigures.from_dict(e) for e in state.epochs]
    total = total_summary(
        s.tracker,
        epochs,
        s.times,
        time.perf_counter() - s.wall_start,
        s.last_val,
        open_epoch=state.steps_in_epoch > 0,
    )
    return run_summary(
        s.launch,
        RunFacts(
            experiment=s.cfg.run.experiment,
            preset=s.cfg.preset,
            seed=s.cfg.run.seed,
            block_size=geometry.block_size,
            sharding_observed=s.sharding_observed,
            memory=s.memory.result,
            steps=state.step,
            tokens_trained=state.step * geometry.tokens_per_step,
            complete=complete,
            epochs=epochs,
            total=total,
            step_times_s=[r.step_time_s for r in records],
            skipped_step_numbers=[r.step for r in records if r.skipped],
            checkpoint_saves=list(s.checkpoint_saves),
            stop=None if stop is None else StopRecord(stop.reason, stop.exit_status, str(stop)),
        ),
    )


def _export_hf(s: Trainer) -> None:
    """Gather the full weights (under FSDP every rank takes part) and write the Hugging Face folder."""
    from data import load_tokenizer
    from model import GPT2, save_hf

    state = s.accelerator.get_state_dict(s.model)
    if s.is_main:
        full = GPT2(s.model_config)
        state = dict(state)
        state.setdefault("lm_head.weight", state["transformer.wte.weight"])
        full.load_state_dict(state)
        tokenizer = load_tokenizer(s.cfg.data.tokenizer)
        # The pipeline's tokenizer has no length limit (documents are packed later); the export's
        # tokenizer should tell users the model's context length.
        tokenizer.model_max_length = s.model_config.n_positions
        save_hf(full, s.out / "hf", tokenizer=tokenizer)
    s.accelerator.wait_for_everyone()


# ---------------------------------------------------------------------------------------------
# Progress on the console


class _NoProgress:
    n = 0

    def update(self, n: int) -> None: ...
    def set_postfix(self, **kwargs: Any) -> None: ...
    def close(self) -> None: ...


class _ProgressLines:
    """Where no terminal redraws a bar (a log file, a notebook running `!accelerate launch`): one line per log."""

    def __init__(self, total: int, initial: int) -> None:
        self.total, self.n = total, initial  # `n`: steps done, as tqdm names it

    def update(self, n: int) -> None:
        self.n += n

    def set_postfix(self, **kwargs: Any) -> None:
        print(f"step {self.n}/{self.total} " + " ".join(f"{k}={v}" for k, v in kwargs.items()), flush=True)

    def close(self) -> None: ...


def _progress_bar(enabled: bool, total: int, initial: int) -> Any:
    if not enabled:
        return _NoProgress()
    if not sys.stderr.isatty():
        return _ProgressLines(total, initial)
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, file=sys.stderr)
