"""The training run: set up, train, evaluate, checkpoint, summarise, export."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin, set_seed
from torch.utils.data import DataLoader

from training.batching import BatchGeometry, EpochOrderSampler, batch_geometry, chunks
from training.checkpoint import TrainState, checkpoint_step, save_checkpoint
from training.config import TrainConfig
from training.errors import RunError
from training.hardware import peak_flops, reset_peak_memory, synchronize
from training.metrics import (
    MetricsTracker,
    RunTimes,
    StepRecord,
    ThroughputFacts,
    epoch_summary,
    total_summary,
)
from training.rundir import (
    check_output_dir,
    clear_run_files,
    truncate_metrics,
    wandb_run_id,
    write_atomic,
)
from training.sinks import JsonlSink, WandbSink, resolve_wandb_mode, wandb_summary_key
from training.step import evaluate, lr_factor, make_optimizer, train_step
from training.strategy import (
    check_strategy,
    create_accelerator,
    effective_strategy,
    requested_from_env,
)

__all__ = ["RunError", "run_training"]


def run_training(cfg: TrainConfig) -> dict[str, Any]:
    """Train as configured; returns the summary (also written to OUTPUT_DIR/summary.json)."""
    from data import build_datasets, load_tokenizer
    from model import GPT2, GPT2Config

    wall_start = time.perf_counter()
    out = Path(cfg.run.output_dir)
    model_config = GPT2Config.from_preset(
        cfg.model.model_preset, embd_pdrop=cfg.model.dropout, attn_pdrop=cfg.model.dropout,
        resid_pdrop=cfg.model.dropout, attn_impl=cfg.model.attn_impl,
    )
    if cfg.data.block_size > model_config.n_positions:
        raise RunError(f"--block_size {cfg.data.block_size} exceeds the model's {model_config.n_positions} positions")
    resume_from = check_output_dir(out, cfg.run.resume, cfg.run.overwrite)

    requested = requested_from_env(os.environ, cfg.run.strategy)
    wandb_mode = resolve_wandb_mode(cfg.run.wandb_mode)
    accelerator, precision_warning = create_accelerator(
        requested, log_with="wandb" if wandb_mode != "disabled" else None, project_dir=str(out),
        # Steps are whole groups of micro-batches (every epoch is cut to whole steps), and a step's
        # micro-batches are fetched before it runs; syncing "at the end of the dataloader" would then
        # fire on the last step's first micro-batch and step the optimizer twice.
        gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=1, sync_with_dataloader=False),
    )
    is_main = accelerator.is_main_process

    def log(message: str) -> None:
        if is_main:
            print(message, flush=True)

    if precision_warning:
        log(f"warning: {precision_warning}")
    if is_main:
        out.mkdir(parents=True, exist_ok=True)
        if cfg.run.overwrite:
            clear_run_files(out)
    accelerator.wait_for_everyone()
    set_seed(cfg.run.seed)

    data = build_datasets(cfg.data, main_process_first=accelerator.main_process_first, log=log)
    block_size = cfg.data.block_size
    geometry = batch_geometry(cfg.optim, block_size, accelerator.num_processes)
    accelerator.gradient_accumulation_steps = geometry.grad_accum_steps
    steps_per_epoch = len(data.train) // geometry.samples_per_step
    if steps_per_epoch == 0:
        raise RunError(
            f"the training split has {len(data.train)} blocks of {block_size} tokens, fewer than one global batch "
            f"({geometry.samples_per_step} blocks): use more data or a smaller --global_batch_tokens/--block_size"
        )
    total_steps = cfg.optim.max_steps or (cfg.optim.epochs or 1) * steps_per_epoch
    num_epochs = math.ceil(total_steps / steps_per_epoch)

    model = GPT2(model_config)  # same seed on every rank: identical initial weights
    n_params = model.num_parameters()
    n_params_non_embedding = model.num_parameters(exclude_position_embeddings=True)
    flops_per_token = model.flops_per_token(block_size)
    optimizer = make_optimizer(model, cfg.optim)
    # The schedule is stepped once per optimizer step by this loop; handing it to prepare() would make
    # accelerate step it once per process, which changes the schedule with the world size.
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, cfg.optim.warmup_steps, total_steps, cfg.optim.min_lr_ratio)
    )
    model, optimizer = accelerator.prepare(model, optimizer)  # FSDP2 needs both in one call
    effective = effective_strategy(accelerator, model)
    check_strategy(requested, effective)

    sampler = EpochOrderSampler(len(data.train), steps_per_epoch * geometry.samples_per_step, cfg.run.seed)
    train_loader = accelerator.prepare_data_loader(DataLoader(
        data.train, batch_size=geometry.micro_batch_size, sampler=sampler, drop_last=True,
        num_workers=cfg.run.dataloader_workers,
    ))
    val_loader = accelerator.prepare_data_loader(DataLoader(
        data.val, batch_size=geometry.micro_batch_size, shuffle=False, num_workers=cfg.run.dataloader_workers,
    ))
    state = TrainState()
    accelerator.register_for_checkpointing(scheduler, state)
    if resume_from is not None:
        accelerator.load_state(str(resume_from))
        if is_main:
            truncate_metrics(out / "metrics.jsonl", checkpoint_step(resume_from))
        log(f"resumed from {resume_from} at step {state.step}")

    peak = peak_flops(accelerator.device, effective.precision)
    facts = ThroughputFacts(geometry.tokens_per_step, geometry.samples_per_step, accelerator.num_processes,
                            flops_per_token, peak.flops_per_s)
    tracker = MetricsTracker(accelerator, facts, cfg.run.perf_warmup_steps)
    tracker.records = [StepRecord(**r) for r in state.records]
    times = RunTimes(**{k: v for k, v in state.times.items() if k in ("train_s", "eval_s", "checkpoint_s")})

    strategy_name = effective.strategy
    run_name = cfg.run.run_name or f"{strategy_name}-{effective.world_size}x-{effective.precision}"
    device_name = torch.cuda.get_device_name(accelerator.device) if accelerator.device.type == "cuda" else "cpu"
    layout = {
        "requested": {"strategy": requested.strategy, "world_size": requested.world_size,
                      "mixed_precision": requested.mixed_precision},
        "effective": effective.to_dict(),
        "run_name": run_name,
        "device_name": device_name,
        "batch": {"micro_batch_size": geometry.micro_batch_size, "grad_accum_steps": geometry.grad_accum_steps,
                  "world_size": geometry.world_size, "global_batch_tokens": geometry.tokens_per_step,
                  "global_batch_samples": geometry.samples_per_step},
        "schedule": {"total_steps": total_steps, "steps_per_epoch": steps_per_epoch, "epochs": num_epochs},
        "model_config": model_config.to_dict(),
        "n_params": n_params,
        "n_params_non_embedding": n_params_non_embedding,
        "flops_per_token": flops_per_token,
        "peak_flops_per_device": peak.flops_per_s,
        "peak_flops_source": peak.source,
        "data_stats": data.stats.to_dict(),
        "wandb_mode": wandb_mode,
    }
    resolved = {**cfg.to_dict(), "launch": layout}
    if is_main:
        write_atomic(out / "config.json", json.dumps(resolved, indent=2, default=str))
        log(f"run {run_name}: strategy {strategy_name} ({effective.wrapper}, {effective.world_size} process(es), "
            f"{effective.backend}), precision {effective.precision}, global batch {geometry.tokens_per_step} tokens "
            f"= {geometry.micro_batch_size} x {block_size} x {geometry.world_size} x {geometry.grad_accum_steps} "
            f"accumulation, {total_steps} steps, {n_params:,} parameters; MFU peak: {peak.source}")

    jsonl = JsonlSink(out / "metrics.jsonl")
    wandb = WandbSink(accelerator, enabled=wandb_mode != "disabled")
    wandb.start(cfg.run.wandb_project, resolved, {
        "name": run_name, "group": cfg.run.experiment, "job_type": strategy_name, "mode": wandb_mode,
        "dir": str(out), "entity": cfg.run.wandb_entity, "tags": [strategy_name, effective.precision],
        "id": wandb_run_id(out) if is_main else None, "resume": "allow",
    })

    def emit(record: dict[str, Any]) -> None:
        if is_main:
            jsonl.write(record)
            wandb.log(record, record["step"])

    def run_eval() -> dict[str, float]:
        synchronize(accelerator.device)
        t = time.perf_counter()
        result = evaluate(accelerator, model, val_loader, cfg.run.eval_max_batches)
        synchronize(accelerator.device)
        seconds = time.perf_counter() - t
        times.eval_s += seconds
        emit({"kind": "eval", "step": state.step, "epoch": state.epoch, "tokens": state.step * geometry.tokens_per_step,
              **result, "eval_time_s": seconds})
        return result

    def checkpoint() -> None:
        t = time.perf_counter()
        state.records = [vars(r) for r in tracker.records]
        state.times = {"train_s": times.train_s, "eval_s": times.eval_s, "checkpoint_s": times.checkpoint_s}
        save_checkpoint(accelerator, out, state.step, model_config.to_dict(), cfg.run.keep_checkpoints)
        times.checkpoint_s += time.perf_counter() - t

    stop_at = min(total_steps, cfg.run.stop_after_steps or total_steps)
    progress = _progress_bar(is_main, total=stop_at, initial=state.step)
    last_val: dict[str, float] | None = None
    model.train()
    while state.step < stop_at:
        sampler.use_epoch(state.epoch)
        if state.steps_in_epoch == 0:
            reset_peak_memory(accelerator.device)
        skip = state.steps_in_epoch * geometry.grad_accum_steps
        loader = accelerator.skip_first_batches(train_loader, skip) if skip else train_loader
        synchronize(accelerator.device)
        step_start = time.perf_counter()
        for micro_batches in chunks(loader, geometry.grad_accum_steps):
            lr = scheduler.get_last_lr()[0]
            grad_norm = train_step(accelerator, model, optimizer, micro_batches, tracker, cfg.optim.grad_clip)
            scheduler.step()
            synchronize(accelerator.device)
            now = time.perf_counter()
            step_time, step_start = now - step_start, now
            times.train_s += step_time
            state.step += 1
            state.steps_in_epoch += 1
            tracker.end_step(state.step, state.epoch, state.step * geometry.tokens_per_step, grad_norm, lr, step_time)
            epoch_done = state.steps_in_epoch == steps_per_epoch
            finishing = state.step >= stop_at
            if state.step % cfg.run.log_interval == 0 or epoch_done or finishing:
                new = tracker.flush()
                line = tracker.interval_line(new, times.train_s)
                emit(line)
                progress.update(len(new))
                progress.set_postfix(loss=f"{line['loss']:.3f}", tok_s=f"{line['tokens_per_s']:,.0f}")
            paused = False
            final_eval_follows = finishing and state.step >= total_steps  # the end validates anyway
            if (cfg.run.eval_interval and state.step % cfg.run.eval_interval == 0 and not epoch_done
                    and not final_eval_follows):
                last_val = run_eval()
                paused = True
            if epoch_done:
                last_val = run_eval()
                state.epochs.append(epoch_summary(tracker, state.epoch, last_val))
                state.epoch += 1
                state.steps_in_epoch = 0
                paused = True
            if (cfg.run.checkpoint_interval and state.step % cfg.run.checkpoint_interval == 0) or finishing:
                checkpoint()
                paused = True
            if is_main and (epoch_done or finishing):
                write_atomic(out / "summary.json", json.dumps(_summary(
                    cfg, layout, geometry, state, tracker, times, wall_start, last_val, complete=False), indent=2))
            if finishing or epoch_done:
                break
            if paused:
                synchronize(accelerator.device)
                step_start = time.perf_counter()
    progress.close()

    complete = state.step >= total_steps
    if complete and state.steps_in_epoch:
        # The step budget ended inside an epoch: validate and summarise the partial epoch.
        last_val = run_eval()
        state.epochs.append(epoch_summary(tracker, state.epoch, last_val))
    if complete and cfg.run.export_hf:
        _export_hf(accelerator, model, model_config, out / "hf", cfg.data.tokenizer, load_tokenizer, GPT2)
    summary = _summary(cfg, layout, geometry, state, tracker, times, wall_start, last_val, complete=complete)
    if is_main:
        write_atomic(out / "summary.json", json.dumps(summary, indent=2))
        wandb.summary({wandb_summary_key(k): v for k, v in summary["total"].items() if v is not None})
        t = summary["total"]
        val = "n/a" if t["final_val_loss"] is None else f"{t['final_val_loss']:.4f}"
        log(f"{'done' if complete else 'stopped'}: {state.step} of {total_steps} steps, loss {t['final_loss']:.4f}, "
            f"val loss {val}, "
            f"{t['tokens_per_s']:,.0f} tokens/s, peak allocated {t['peak_mem_allocated_mib_max']:.0f} MiB, "
            f"train time {t['train_time_s']:.1f} s -> {out}")
    wandb.finish()
    accelerator.wait_for_everyone()
    # Last: after this no rank may touch a collective.
    accelerator.state.destroy_process_group()
    return summary


def _summary(cfg: TrainConfig, layout: dict[str, Any], geometry: BatchGeometry, state: TrainState,
             tracker: MetricsTracker, times: RunTimes, wall_start: float, last_val: dict[str, float] | None,
             complete: bool) -> dict[str, Any]:
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
        "backend": effective["backend"],
        "wrapper": effective["wrapper"],
        "params_sharded": effective["params_sharded"],
        "local_param_numel": effective["local_param_numel"],
        "block_shard_fractions": list(effective["block_shard_fractions"]),
        "peak_flops_per_device": layout["peak_flops_per_device"],
        "peak_flops_source": layout["peak_flops_source"],
        "preset": cfg.preset,
        "n_params": layout["n_params"],
        "n_params_non_embedding": layout["n_params_non_embedding"],
        "seed": cfg.run.seed,
        # Content hash of the packed data (corpus bytes, tokenizer, block size, split): equal keys and
        # seeds mean the runs saw the same tokens in the same order.
        "data_key": layout["data_stats"]["cache_key"],
        "block_size": geometry.block_size,
        "micro_batch_size": geometry.micro_batch_size,
        "grad_accum_steps": geometry.grad_accum_steps,
        "global_batch_tokens": geometry.tokens_per_step,
        "steps": state.step,
        "tokens_trained": state.step * geometry.tokens_per_step,
        "complete": complete,
        "epochs": _json_ready(state.epochs),
        "total": _json_ready(total_summary(tracker, state.epochs, times, time.perf_counter() - wall_start, last_val,
                                           open_epoch=state.steps_in_epoch > 0)),
        "step_times_s": [r.step_time_s for r in tracker.records],
    }


def _json_ready(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_ready(v) for v in value]
    return value


def _export_hf(accelerator: Accelerator, model: nn.Module, model_config: Any, folder: Path,
               tokenizer_name: str | None, load_tokenizer: Any, gpt2_cls: Any) -> None:
    """Gather the full weights (under FSDP every rank takes part) and write the Hugging Face folder."""
    state = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        full = gpt2_cls(model_config)
        state = dict(state)
        state.setdefault("lm_head.weight", state["transformer.wte.weight"])
        full.load_state_dict(state)
        tokenizer = load_tokenizer(tokenizer_name)
        # The pipeline's tokenizer has no length limit (documents are packed later); the export's
        # tokenizer should tell users the model's context length.
        tokenizer.model_max_length = model_config.n_positions
        full.save_hf(folder, tokenizer=tokenizer)
    accelerator.wait_for_everyone()


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
