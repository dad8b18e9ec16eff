"""The training run: set up, train, evaluate, checkpoint, summarise, export."""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin, set_seed
from torch.utils.data import DataLoader, Sampler

from training.checkpoint import checkpoint_step, newest_checkpoint, save_checkpoint
from training.config import OptimConfig, TrainConfig
from training.hardware import peak_flops, reset_peak_memory, synchronize
from training.metrics import MetricsTracker, RunTimes, StepRecord, ThroughputFacts, epoch_summary, total_summary
from training.sinks import JsonlSink, WandbSink, resolve_wandb_mode
from training.strategy import check_strategy, create_accelerator, effective_strategy, requested_from_env


class RunError(Exception):
    """A problem with the run's settings or output directory; the message is one line."""


# ---------------------------------------------------------------------------------------------
# Batch geometry and data order


@dataclass(frozen=True)
class BatchGeometry:
    micro_batch_size: int  # sequences per process per micro-step
    grad_accum_steps: int
    world_size: int
    block_size: int

    @property
    def samples_per_step(self) -> int:
        return self.micro_batch_size * self.grad_accum_steps * self.world_size

    @property
    def tokens_per_step(self) -> int:
        return self.samples_per_step * self.block_size


def batch_geometry(optim: OptimConfig, block_size: int, world_size: int) -> BatchGeometry:
    """Derive gradient accumulation from the global batch in tokens; it must divide exactly."""
    per_micro_step = optim.micro_batch_size * block_size * world_size
    global_tokens = optim.global_batch_tokens or per_micro_step
    if global_tokens % per_micro_step:
        raise RunError(
            f"--global_batch_tokens {global_tokens} is not a multiple of micro_batch_size x block_size x processes "
            f"= {optim.micro_batch_size} x {block_size} x {world_size} = {per_micro_step}; "
            f"use a multiple of {per_micro_step}"
        )
    return BatchGeometry(optim.micro_batch_size, global_tokens // per_micro_step, world_size, block_size)


class EpochOrderSampler(Sampler[int]):
    """A permutation of the training blocks fixed by (seed, epoch), cut to whole optimizer steps.

    The order depends on nothing else, so every strategy sees the same blocks in the same optimizer
    step: accelerate hands rank r every world_size-th micro-batch, and one process taking
    world_size x accumulation consecutive micro-batches per step takes the same set.
    """

    def __init__(self, num_blocks: int, usable: int, seed: int) -> None:
        self.num_blocks = num_blocks
        self.usable = usable
        self.seed = seed
        self.epoch = 1

    # Not named set_epoch on purpose: accelerate's DataLoaderShard calls `sampler.set_epoch` with its own
    # iteration count, which differs between a single process and a sharded loader, and after a resume.
    def use_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        yield from torch.randperm(self.num_blocks, generator=generator)[: self.usable].tolist()

    def __len__(self) -> int:
        return self.usable


def _chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []


# ---------------------------------------------------------------------------------------------
# Optimisation


def make_optimizer(model: nn.Module, optim: OptimConfig) -> torch.optim.AdamW:
    """AdamW with decoupled weight decay on matrices (dim >= 2) only; biases and LayerNorms are not decayed."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": optim.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=optim.lr, betas=(optim.beta1, optim.beta2), eps=optim.eps)


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

    local_sq = torch.zeros((), dtype=torch.float64)
    sharded_sq = torch.zeros((), dtype=torch.float64)
    mesh = None
    for p in parameters:
        if p.grad is None:
            continue
        grad = p.grad
        if isinstance(grad, DTensor):
            if any(not placement.is_shard() for placement in grad.placements):
                raise RuntimeError(f"unexpected gradient placement {grad.placements}: only sharded DTensors are summed")
            mesh = grad.device_mesh
            sharded_sq = sharded_sq.to(grad.device) + torch.linalg.vector_norm(grad.to_local(), dtype=torch.float64) ** 2
        else:
            local_sq = local_sq.to(grad.device) + torch.linalg.vector_norm(grad, dtype=torch.float64) ** 2
    if mesh is not None:
        # Every element lives in exactly one shard: the sum of the ranks' local squares is the global one.
        torch.distributed.all_reduce(sharded_sq, group=mesh.get_group())
    return torch.sqrt(local_sq.to(sharded_sq.device) + sharded_sq)


def clip_gradients(accelerator: Accelerator, parameters: list[nn.Parameter], max_norm: float) -> torch.Tensor:
    """Unscale (fp16), measure the global grad norm before clipping, clip to `max_norm` (0 = no clipping)."""
    from torch.nn.utils import clip_grads_with_norm_

    accelerator.unscale_gradients()
    norm = global_grad_norm(parameters)
    if max_norm > 0:
        clip_grads_with_norm_(parameters, max_norm, norm.float())
    return norm


def train_step(accelerator: Accelerator, model: nn.Module, optimizer: torch.optim.Optimizer,
               micro_batches: list[dict[str, torch.Tensor]], tracker: MetricsTracker | None,
               grad_clip: float) -> torch.Tensor:
    """One optimizer step over `micro_batches` (one per accumulation micro-step); returns the grad norm.

    The norm is the global L2 norm of all gradients before clipping, measured even when clipping is
    off, and the same number under every strategy.
    """
    grad_norm = torch.zeros((), device=accelerator.device)
    for batch in micro_batches:
        with accelerator.accumulate(model):
            _, loss = model(batch["input_ids"], batch["labels"])
            accelerator.backward(loss)
            if tracker is not None:
                tracker.add_micro_batch(loss, batch["labels"].numel())
            if accelerator.sync_gradients:
                grad_norm = clip_gradients(accelerator, list(model.parameters()), grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return grad_norm


@torch.no_grad()
def evaluate(accelerator: Accelerator, model: nn.Module, loader: DataLoader, max_batches: int) -> dict[str, float]:
    """Mean validation loss (token-weighted; blocks are equal-length) and perplexity over all ranks."""
    model.eval()
    losses = []
    for i, batch in enumerate(loader):
        if max_batches and i >= max_batches:
            break
        logits, _ = model(batch["input_ids"])
        per_block = F.cross_entropy(logits.float().transpose(1, 2), batch["labels"], reduction="none").mean(dim=1)
        # gather_for_metrics drops the samples accelerate repeats to even out the last batch.
        losses.append(accelerator.gather_for_metrics(per_block))
    model.train()
    if not losses:
        return {"val_loss": float("nan"), "val_ppl": float("nan")}
    val_loss = torch.cat(losses).double().mean().item()
    return {"val_loss": val_loss, "val_ppl": math.exp(min(val_loss, 700.0))}


# ---------------------------------------------------------------------------------------------
# State that checkpoints carry besides model/optimizer/scheduler


@dataclass
class TrainState:
    """Position in the data and what has been measured so far; saved in every checkpoint."""

    step: int = 0
    epoch: int = 1
    steps_in_epoch: int = 0
    records: list[dict[str, Any]] = field(default_factory=list)
    epochs: list[dict[str, Any]] = field(default_factory=list)
    times: dict[str, float] = field(default_factory=dict)

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "epoch": self.epoch, "steps_in_epoch": self.steps_in_epoch,
                "records": self.records, "epochs": self.epochs, "times": self.times}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, value)


# ---------------------------------------------------------------------------------------------
# Output directory


_RUN_FILES = ("metrics.jsonl", "summary.json", "config.json", "wandb_run_id")
_RUN_DIRS = ("checkpoints", "hf", "wandb")


def check_output_dir(out: Path, resume: bool, overwrite: bool) -> Path | None:
    """Refuse to mix two runs in one directory; return the checkpoint to resume from, if any."""
    holds_run = any((out / f).exists() for f in _RUN_FILES + _RUN_DIRS)
    if resume:
        ckpt = newest_checkpoint(out)
        if ckpt is None:
            raise RunError(f"--resume: no complete checkpoint in {out / 'checkpoints'}; run without --resume")
        return ckpt
    if holds_run and not overwrite:
        raise RunError(f"{out} already holds a run; pass --resume to continue it or --overwrite to replace it")
    return None


def clear_run_files(out: Path) -> None:
    for name in _RUN_FILES:
        (out / name).unlink(missing_ok=True)
    for name in _RUN_DIRS:
        shutil.rmtree(out / name, ignore_errors=True)


def truncate_metrics(path: Path, last_step: int) -> None:
    """After a resume, drop metric lines of steps that will be trained again."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines()
            if line.strip() and json.loads(line).get("step", 0) <= last_step]
    write_atomic(path, "".join(line + "\n" for line in kept))


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------
# The run


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
        "id": _wandb_run_id(out, accelerator) if is_main else None, "resume": "allow",
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
        for micro_batches in _chunks(loader, geometry.grad_accum_steps):
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
        wandb.summary({f"total/{k}": v for k, v in summary["total"].items() if v is not None})
        t = summary["total"]
        val = "n/a" if t["final_val_loss"] is None else f"{t['final_val_loss']:.4f}"
        log(f"{'done' if complete else 'stopped'}: {state.step} of {total_steps} steps, loss {t['final_loss']:.4f}, "
            f"val loss {val}, "
            f"{t['tokens_per_s']:,.0f} tokens/s, peak allocated {t['peak_mem_allocated_mib_max']:.0f} MiB, "
            f"train time {t['train_time_s']:.1f} s -> {out}")
    wandb.finish()
    accelerator.wait_for_everyone()
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


def _wandb_run_id(out: Path, accelerator: Accelerator) -> str:
    """A W&B run id kept in the run directory, so a resumed run continues the same W&B run."""
    path = out / "wandb_run_id"
    if path.exists():
        return path.read_text().strip()
    import uuid

    run_id = uuid.uuid4().hex[:12]
    path.write_text(run_id)
    return run_id


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
