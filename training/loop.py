"""The training run: set up, train (step, log, evaluate, checkpoint), finish."""

from __future__ import annotations

import json
import math
import sys
import time
from typing import Any

from training.batching import chunks
from training.checkpoint import save_checkpoint
from training.errors import RunError
from training.hardware import reset_peak_memory, synchronize
from training.metrics import epoch_summary, total_summary
from training.rundir import write_atomic
from training.session import Session, set_up
from training.sinks import wandb_summary_key
from training.step import evaluate, train_step
from training.stopping import RunStopped, StepHealth, diverged, preempted, step_health

__all__ = ["RunError", "run_training"]


def run_training(cfg: Any) -> dict[str, Any]:
    """Train as configured (a training.config.TrainConfig); returns the summary, also in summary.json.

    A run stopped early on purpose (a signal, a non-finite streak) still finishes: its summary's "stop"
    says why and with which exit status train.py ends.
    """
    session = set_up(cfg)
    try:
        train(session)
    except RunStopped as stop:
        return finish(session, stop)
    return finish(session)


# ---------------------------------------------------------------------------------------------
# Training


def train(s: Session) -> None:
    """Optimizer steps until the schedule ends or --stop_after_steps, an epoch at a time."""
    progress = _progress_bar(s.is_main, total=s.schedule.stop_at, initial=s.state.step)
    s.model.train()
    while s.state.step < s.schedule.stop_at:
        _train_epoch(s, progress)
    progress.close()


def _train_epoch(s: Session, progress: Any) -> None:
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
        paused = _after_step(s, progress, health)
        if state.steps_in_epoch == 0 or state.step >= s.schedule.stop_at:  # the epoch closed, or we stop
            return
        if paused:
            clock.restart()  # evaluation and checkpointing are not training time


class _StepClock:
    """Wall time of each optimizer step: perf_counter differences after the device finished its work."""

    def __init__(self, s: Session) -> None:
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


def _optimizer_step(s: Session, micro_batches: list[Any], clock: _StepClock) -> StepHealth:
    state = s.state
    lr = s.scheduler.get_last_lr()[0]
    with s.memory.around(state.step + 1) as after_backward:
        result = train_step(s.accelerator, s.model, s.optimizer, s.scheduler, micro_batches, s.tracker,
                            s.cfg.optim.grad_clip, after_backward)
    health = step_health(s.accelerator, s.signals, s.tracker.step_loss_sum, result.grad_norm, result.skipped)
    seconds = clock.lap()
    s.times.train_s += seconds
    state.step += 1
    state.steps_in_epoch += 1
    s.tracker.end_step(state.step, state.epoch, state.step * s.geometry.tokens_per_step, result.grad_norm, lr,
                       seconds, result.skipped)
    return health


def _after_step(s: Session, progress: Any, health: StepHealth) -> bool:
    """Log, validate, close the epoch and checkpoint as due, or stop; True when any of them paused training.

    On a signal the step in flight is finished, logged and checkpointed, and the run stops (RunStopped).
    During a streak of non-finite steps nothing is checkpointed, so the newest checkpoint stays a good one.
    """
    state, run_cfg = s.state, s.cfg.run
    _track_nonfinite(s, health)
    epoch_done = state.steps_in_epoch == s.schedule.steps_per_epoch
    stopping = state.step >= s.schedule.stop_at or health.signal != 0
    if state.step % run_cfg.log_interval == 0 or epoch_done or stopping or health.nonfinite:
        _log_interval(s, progress)
    paused = False
    final_eval_follows = stopping and state.step >= s.schedule.total_steps  # the end validates anyway
    if (run_cfg.eval_interval and state.step % run_cfg.eval_interval == 0 and not epoch_done
            and not final_eval_follows and not health.signal):
        evaluate_now(s)
        paused = True
    if epoch_done:
        _close_epoch(s, partial=False)
        paused = True
    due = (run_cfg.checkpoint_interval and state.step % run_cfg.checkpoint_interval == 0) or stopping
    if due and s.nonfinite_since is None:
        checkpoint_now(s)
        paused = True
    if epoch_done or stopping:
        _write_summary(s, complete=False)
    if s.nonfinite_since is not None and run_cfg.max_nonfinite_steps and \
            state.step - s.nonfinite_since + 1 >= run_cfg.max_nonfinite_steps:
        raise diverged(s.nonfinite_since, state.step, s.last_checkpoint)
    if health.signal:
        raise preempted(health.signal, state.step)
    return paused


def _track_nonfinite(s: Session, health: StepHealth) -> None:
    if not health.nonfinite:
        s.nonfinite_since = None
        return
    if s.nonfinite_since is None:
        s.nonfinite_since = s.state.step
    streak = s.state.step - s.nonfinite_since + 1
    limit = s.cfg.run.max_nonfinite_steps
    s.log(f"warning: step {s.state.step}: non-finite loss or grad norm ({streak} in a row"
          f"{f' of {limit} allowed' if limit else ''}); no checkpoint until a finite step")


def _log_interval(s: Session, progress: Any) -> None:
    new = s.tracker.flush()
    line = s.tracker.interval_line(new, s.times.train_s)
    s.emit(line)
    progress.update(len(new))
    progress.set_postfix(loss=f"{line['loss']:.3f}", tok_s=f"{line['tokens_per_s']:,.0f}")


def _close_epoch(s: Session, partial: bool) -> None:
    state = s.state
    state.epochs.append(epoch_summary(s.tracker, state.epoch, evaluate_now(s), partial=partial))
    state.epoch += 1
    state.steps_in_epoch = 0


# ---------------------------------------------------------------------------------------------
# Evaluating and checkpointing


def evaluate_now(s: Session) -> dict[str, float]:
    """Validate on the run's validation blocks; the result is logged and kept as the latest."""
    synchronize(s.accelerator.device)
    start = time.perf_counter()
    result = evaluate(s.accelerator, s.model, s.val_loader)
    synchronize(s.accelerator.device)
    seconds = time.perf_counter() - start
    s.times.eval_s += seconds
    s.emit({"kind": "eval", "step": s.state.step, "epoch": s.state.epoch,
            "tokens": s.state.step * s.geometry.tokens_per_step, **result, "eval_time_s": seconds})
    s.last_val = result
    return result


def checkpoint_now(s: Session) -> None:
    start = time.perf_counter()
    state = s.state
    state.records = [vars(r) for r in s.tracker.records]
    state.times = {"train_s": s.times.train_s, "eval_s": s.times.eval_s, "checkpoint_s": s.times.checkpoint_s}
    train_state = {"state": state.state_dict(), "scheduler": s.scheduler.state_dict()}
    save_checkpoint(s.accelerator, s.out, state.step, s.model_config.to_dict(), s.cfg.run.keep_checkpoints,
                    train_state)
    s.times.checkpoint_s += time.perf_counter() - start
    s.last_checkpoint = state.step


# ---------------------------------------------------------------------------------------------
# Finishing


def finish(s: Session, stop: RunStopped | None = None) -> dict[str, Any]:
    """Close a partial last epoch, export, write the summary, close the sinks, then the process group."""
    complete = s.state.step >= s.schedule.total_steps and stop is None
    if complete and s.state.steps_in_epoch:
        _close_epoch(s, partial=True)  # the step budget ended inside an epoch
    if complete and s.cfg.run.export_hf:
        _export_hf(s)
    summary = _write_summary(s, complete, stop)
    s.wandb.summary({wandb_summary_key(k): v for k, v in summary["total"].items() if v is not None})
    s.wandb.finish()
    s.log(_closing_line(s, summary))
    sync_line = s.wandb.sync_line()
    if sync_line:
        s.log(sync_line)
    s.accelerator.wait_for_everyone()
    # Last: after this no rank may touch a collective.
    s.accelerator.state.destroy_process_group()
    return summary


def _write_summary(s: Session, complete: bool, stop: RunStopped | None = None) -> dict[str, Any]:
    summary = _summary(s, complete)
    if stop is not None:
        summary["stop"] = {"reason": stop.reason, "exit_status": stop.exit_status, "message": str(stop)}
    if s.is_main:
        write_atomic(s.out / "summary.json", json.dumps(summary, indent=2))
    return summary


def _closing_line(s: Session, summary: dict[str, Any]) -> str:
    t = summary["total"]
    skipped = f", {t['skipped_steps']} skipped (fp16 overflow)" if t["skipped_steps"] else ""
    return (f"{'done' if summary['complete'] else 'stopped'}: {s.state.step} of {s.schedule.total_steps} steps"
            f"{skipped}, loss {_shown(t['final_loss'], '.4f')}, val loss {_shown(t['final_val_loss'], '.4f')}, "
            f"{_shown(t['tokens_per_s'], ',.0f')} tokens/s, peak allocated {_shown(t['peak_mem_allocated_mib_max'], '.0f')} "
            f"MiB, train time {t['train_time_s']:.1f} s -> {s.out}")


def _shown(value: float | None, spec: str) -> str:
    """A figure of the closing line; a non-finite one (null in summary.json) shows as n/a."""
    return "n/a" if value is None else format(value, spec)


def _summary(s: Session, complete: bool) -> dict[str, Any]:
    layout, geometry, state, cfg = s.layout, s.geometry, s.state, s.cfg
    effective = layout["effective"]
    return {
        "run_name": layout["run_name"],
        "experiment": cfg.run.experiment,
        "strategy": effective["strategy"],
        "requested_strategy": layout["requested"]["strategy"],
        "world_size": effective["world_size"],
        "num_machines": effective["num_machines"],
        "precision": effective["precision"],
        "requested_precision": {"no": "fp32"}.get(layout["requested"]["mixed_precision"],
                                                  layout["requested"]["mixed_precision"]),
        "device_type": effective["device_type"],
        "device_name": layout["device_name"],
        "threads_per_process": layout["threads_per_process"],
        "backend": effective["backend"],
        "wrapper": effective["wrapper"],
        "params_sharded": effective["params_sharded"],
        "local_param_numel": effective["local_param_numel"],
        "block_shard_fractions": list(effective["block_shard_fractions"]),
        "fsdp_reshard_after_forward": effective["fsdp_reshard_after_forward"],
        "fsdp_offload_params": effective["fsdp_offload_params"],
        "param_devices": list(effective["param_devices"]),
        "checkpoint_wrapped_blocks": effective["checkpoint_wrapped_blocks"],
        "sharding_observed": s.sharding_observed,
        "memory": s.memory.result,
        "levers": layout["levers"],
        "peak_flops_per_device": layout["peak_flops_per_device"],
        "peak_flops_source": layout["peak_flops_source"],
        "preset": cfg.preset,
        "n_params": layout["n_params"],
        "n_params_non_embedding": layout["n_params_non_embedding"],
        "seed": cfg.run.seed,
        # Content hash of the packed data (corpus bytes, tokenizer, block size, split): equal keys and
        # seeds mean the runs saw the same tokens in the same order.
        "data_key": layout["data_stats"]["cache_key"],
        "eval_blocks": layout["eval_blocks"],
        "block_size": geometry.block_size,
        "micro_batch_size": geometry.micro_batch_size,
        "grad_accum_steps": geometry.grad_accum_steps,
        "global_batch_tokens": geometry.tokens_per_step,
        "steps": state.step,
        "tokens_trained": state.step * geometry.tokens_per_step,
        "complete": complete,
        "epochs": _json_ready(state.epochs),
        "total": _json_ready(total_summary(s.tracker, state.epochs, s.times, time.perf_counter() - s.wall_start,
                                           s.last_val, open_epoch=state.steps_in_epoch > 0)),
        "step_times_s": [r.step_time_s for r in s.tracker.records],
        "skipped_step_numbers": [r.step for r in s.tracker.records if r.skipped],
    }


def _json_ready(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_ready(v) for v in value]
    return value


def _export_hf(s: Session) -> None:
    """Gather the full weights (under FSDP every rank takes part) and write the Hugging Face folder."""
    from data import load_tokenizer
    from model import GPT2

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
        full.save_hf(s.out / "hf", tokenizer=tokenizer)
    s.accelerator.wait_for_everyone()


# ---------------------------------------------------------------------------------------------
# Progress on the console


class _NoProgress:
    def update(self, n: int) -> None: ...
    def set_postfix(self, **kwargs: Any) -> None: ...
    def close(self) -> None: ...


class _ProgressLines:
    """Where no terminal redraws a bar (a log file, a notebook running `!accelerate launch`): one line per log."""

    def __init__(self, total: int, initial: int) -> None:
        self.total, self.done = total, initial

    def update(self, n: int) -> None:
        self.done += n

    def set_postfix(self, **kwargs: Any) -> None:
        print(f"step {self.done}/{self.total} " + " ".join(f"{k}={v}" for k, v in kwargs.items()), flush=True)

    def close(self) -> None: ...


def _progress_bar(enabled: bool, total: int, initial: int) -> Any:
    if not enabled:
        return _NoProgress()
    if not sys.stderr.isatty():
        return _ProgressLines(total, initial)
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, file=sys.stderr)
