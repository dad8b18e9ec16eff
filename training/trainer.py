"""The run's set-up: `Trainer.__init__` builds the parts of a run once, in order (the processes, the output
folder claimed, the data and its schedule, the model and optimizer prepared for the strategy and checked against
the request, the loaders, the launch record and the sinks, the resume, config.json, the probe of the memory
peak), and holds the state the training loop (training/loop.py) advances.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from accelerate import Accelerator
from accelerate.utils import (
    GradientAccumulationPlugin,
    InitProcessGroupKwargs,
    broadcast_object_list,
    gather_object,
    set_seed,
)
from torch.utils.data import DataLoader

from data.errors import DataError
from training.batching import EpochOrderSampler
from training.checkpoints.init_from import (
    InitSource,
    can_read_weights,
    earlier_launch,
    earlier_source,
    init_source,
    unreadable_error,
)
from training.checkpoints.resume import (
    Optimisation,
    ResumeIdentity,
    finish_rollback,
    follow_schedule,
    pending_rollback,
    record_rollback,
    refusal,
    resume_warnings,
    resumed_from,
    rolled_back_names,
    rolled_back_warning,
)
from training.checkpoints.store import (
    UNPICKLING_ERRORS,
    PendingSave,
    TrainState,
    checkpoint_step,
    load_model_weights,
    load_states,
    pickled_problem,
    read_train_state,
)
from training.config import RunError, TrainConfig
from training.distributed import registry
from training.distributed.faults import fresh_store_on_restart, restart_count
from training.distributed.speed_levers import DeviceInfo, Levers, apply_tf32, compile_blocks, decide_levers
from training.distributed.strategy import (
    RequestedLaunch,
    ShardingObserver,
    check_strategy,
    create_accelerator,
    effective_strategy,
    precision_name,
    requested_from_env,
)
from training.geometry import BatchGeometry, batch_geometry
from training.records.memory import MemoryProbe
from training.records.metrics import MetricsTracker, RunTimes, StepRecord, ThroughputFacts
from training.records.peaks import PeakFlops, cpu_model_name, peak_flops
from training.records.record import (
    BatchRecord,
    CheckpointSave,
    EvalLine,
    LaunchRecord,
    LinkRecord,
    RequestedRecord,
    ResumedFromRecord,
    ScheduleRecord,
)
from training.records.sinks import JsonlSink, WandbSink, resolve_wandb_mode, wandb_finish_settings
from training.run_folder import (
    acquire_run_lock,
    claim_output_dir,
    metrics_cut,
    own_sighting,
    remove_probe,
    stale_lock_warning,
    truncate_metrics,
    unshared_error,
    wandb_run_id,
    write_atomic,
    write_probe,
)
from training.step import SignalFlag, eval_subset, lr_factor, make_optimizer


@dataclass(frozen=True)
class Schedule:
    steps_per_epoch: int
    total_steps: int  # the learning-rate schedule's length
    stop_at: int  # where this launch stops: total_steps, or earlier with --stop_after_steps
    epochs: int


@dataclass(frozen=True)
class _Claim:
    """What the output folder's claim decided, agreed by every process."""

    resume_from: Path | None  # the checkpoint --resume continues from
    init_from: InitSource | None  # the checkpoint whose weights --init_from starts a new run from
    # --resume_step renames the newer checkpoints aside: in the job's first launch only. A restart reruns the
    # same command and continues its own newest checkpoint (_claim_as_main); renaming aside what the job
    # saved since the roll-back would throw that work away.
    roll_back: bool


class Trainer:
    """A run: `__init__` builds its parts once, in the order below, and the loop (training/loop.py) advances
    the state it holds.

    The order matters: the seed is set before anything draws from the random state, the model is built after
    the data (as every earlier run did), and a resume comes last. Every check that can fail on bad input fails
    alike in every process after the process group is up (the model's size, the batch), or is agreed through a
    collective (the output folder, the data), so all processes stop with the same one-line error, none is left
    waiting in a collective for one that has gone, and they leave together. A resume decides before anything is
    written (the checkpoint fits, its metrics.jsonl can be cut back) and writes only once its checkpoint has
    loaded.
    """

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.out = Path(cfg.run.output_dir)
        self.wall_start = time.perf_counter()
        self._start_processes()
        self._build_data()
        # Before anything is loaded or written: a launch that cannot continue the checkpoint exactly leaves it be.
        resumed = None if self.claim.resume_from is None else self._agree_on_resume()
        self._build_model()
        self._build_loaders()
        self._build_records(resumed)
        self._start_loop_state()
        if resumed is not None:
            _resume(self, self.claim.resume_from, resumed)  # last: nothing after it draws from the state it restores
        # After the resume: one that fails to load leaves the run's config.json as it was.
        if self.is_main:
            write_atomic(self.out / "config.json", json.dumps(self.resolved, indent=2, default=str))
        self.memory = MemoryProbe(
            self.accelerator.device,
            _probe_step(cfg, self.state.step, self.schedule),
            self.model,
            getattr(self.optimizer, "optimizer", self.optimizer),
        )

    def _start_processes(self) -> None:
        """The accelerator for the launch's strategy, the output folder claimed, the seed set, the levers applied."""
        cfg = self.cfg
        self.requested = requested_from_env(os.environ, cfg.run.strategy)
        self.wandb_mode = resolve_wandb_mode(cfg.run.wandb_mode)
        self.signals = SignalFlag()
        self.signals.install()  # from here on a signal waits for a step boundary
        self.accelerator = _start_accelerator(self.requested, self.wandb_mode, self.out, cfg.run.collective_timeout_s)
        self.model_config = _model_config(cfg)  # fails alike in every process, which then leave together (train.py)
        _check_folder_shared(self.accelerator, self.out)  # before the claim: a refused job touches no run of the folder
        self.claim = _claim_and_source(self.accelerator, cfg, self.out, self.model_config)
        set_seed(cfg.run.seed)
        self.levers = _levers(cfg, self.accelerator, self.requested.strategy)
        self.log(_levers_line(self.levers))

    def _build_data(self) -> None:
        """The packed datasets, how they are cut into steps and epochs, and what a resume of this run must match."""
        from data import build_datasets

        cfg, accelerator = self.cfg, self.accelerator
        # First: it fails alike in every process, before the data's collectives, so none waits for another.
        self.geometry = batch_geometry(cfg.optim, cfg.data.block_size, accelerator.num_processes)
        self.packed = build_datasets(
            cfg.data,
            main_process_first=functools.partial(_main_process_first, accelerator),
            log=functools.partial(log_on_main, accelerator),
        )
        accelerator.gradient_accumulation_steps = self.geometry.grad_accum_steps
        self.schedule = _schedule(cfg, len(self.packed.train), self.geometry)
        # What a resume of this run's checkpoints must match (saved in each one's origin.json).
        self.identity = ResumeIdentity(
            model_config=self.model_config.to_dict(),
            global_batch_tokens=self.geometry.tokens_per_step,
            seed=cfg.run.seed,
            data_key=self.packed.stats.cache_key,
            block_size=cfg.data.block_size,
            tokenizer=cfg.data.tokenizer,
            precision=precision_name(accelerator.mixed_precision),
            optimisation=Optimisation.of(cfg.optim, self.schedule.total_steps),
        )

    def _agree_on_resume(self) -> ResumedFromRecord:
        """The main process decides whether this launch continues the checkpoint exactly; every process learns
        the outcome and fails alike (one `error:` line, nothing touched). Returns the run record's note of it."""
        checkpoint, roll_back = self.claim.resume_from, self.claim.roll_back
        record = _decided_by_main(self.accelerator, lambda: _resume_origin(checkpoint, self.identity, roll_back))
        exact = record["num_processes"] == self.accelerator.num_processes
        return dataclasses.replace(ResumedFromRecord.from_dict(record), random_states_exact=exact)

    def _build_model(self) -> None:
        """Model, optimizer and schedule, prepared for the strategy, which is then checked against the request."""
        from model import GPT2

        cfg, levers = self.cfg, self.levers
        model = GPT2(self.model_config)  # same seed on every rank: identical initial weights
        model.activation_checkpointing = levers.activation_checkpointing == registry.CHECKPOINT_IN_MODEL
        if levers.compile:
            compile_blocks(model.transformer.h)
        optimizer = make_optimizer(model, cfg.optim, fused=levers.fused_adamw)
        # The schedule is stepped once per optimizer step by the loop; handing it to prepare() would make
        # accelerate step it once per process, which changes the schedule with the world size.
        total = self.schedule.total_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: lr_factor(s, cfg.optim.warmup_steps, total, cfg.optim.min_lr_ratio)
        )
        self.n_params = model.num_parameters()
        self.n_params_non_embedding = model.num_parameters(exclude_position_embeddings=True)
        self.flops_per_token = model.flops_per_token(cfg.data.block_size)
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)  # FSDP2 needs both in one call
        self.effective = effective_strategy(self.accelerator, self.model)
        check_strategy(self.requested, self.effective)
        # What is sharded when, read from the live tensors in the first step (summary.json's "sharding_observed").
        self.sharding_observed = ShardingObserver(
            self.model, getattr(self.optimizer, "optimizer", self.optimizer)
        ).result
        if self.claim.init_from is not None:  # the weights only, into the model as prepared for this launch
            load_model_weights(self.model, self.claim.init_from.checkpoint)
            self.log(self.claim.init_from.line())

    def _build_loaders(self) -> None:
        cfg, geometry = self.cfg, self.geometry
        self.sampler = EpochOrderSampler(
            len(self.packed.train), self.schedule.steps_per_epoch * geometry.samples_per_step, cfg.run.seed
        )
        self.train_loader = self.accelerator.prepare_data_loader(
            DataLoader(
                self.packed.train,
                batch_size=geometry.micro_batch_size,
                sampler=self.sampler,
                drop_last=True,
                num_workers=cfg.run.dataloader_workers,
                pin_memory=self.levers.pin_memory,
                # Its own generator: starting an iterator (every epoch, and after a resume) would otherwise draw
                # from the global RNG that dropout uses, and a resumed run would draw at a step the
                # uninterrupted one did not.
                generator=torch.Generator().manual_seed(cfg.run.seed),
            )
        )
        self.val_loader = self.accelerator.prepare_data_loader(
            DataLoader(
                eval_subset(self.packed.val, cfg.run.eval_blocks),
                batch_size=geometry.micro_batch_size,
                shuffle=False,
                num_workers=cfg.run.dataloader_workers,
                pin_memory=self.levers.pin_memory,
                # Its own generator too: every validation starts an iterator, which would otherwise draw a seed
                # from the global RNG, so a validation that a pre-empted run skipped would shift every later
                # dropout mask.
                generator=torch.Generator().manual_seed(cfg.run.seed),
            )
        )

    def _build_records(self, resumed: ResumedFromRecord | None) -> None:
        """config.json's "launch", the metrics tracker and the sinks (metrics.jsonl, W&B, started)."""
        cfg, accelerator = self.cfg, self.accelerator
        # Read, never measured here: a GPU's datasheet figure, or the CPU figure `python -m planner measure` cached
        # (none: MFU is not computed). Read before a resume restores the RNG.
        peak = peak_flops(accelerator.device, self.effective.precision, cfg.data.resolved_cache_dir())
        self.launch = self._launch_record(peak, resumed)
        self.resolved = {**cfg.to_dict(), "launch": self.launch.to_dict()}  # config.json's content
        self.log(_start_line(self.launch, self.geometry))
        facts = ThroughputFacts(
            self.geometry.tokens_per_step,
            self.geometry.samples_per_step,
            accelerator.num_processes,
            self.flops_per_token,
            peak.flops_per_s,
        )
        self.state = TrainState()
        self.tracker = MetricsTracker(accelerator, facts, cfg.run.perf_warmup_steps)
        self.times = RunTimes()
        self.jsonl = JsonlSink(self.out / "metrics.jsonl")
        # Only the main process has a W&B run: on other ranks accelerate's tracker is an empty stand-in
        # (no .dir, no .summary), so using it there would fail with a misleading warning.
        self.wandb = WandbSink(accelerator, enabled=self.wandb_mode != "disabled" and self.is_main)
        _start_wandb(self)

    def _launch_record(self, peak: PeakFlops, resumed: ResumedFromRecord | None) -> LaunchRecord:
        """config.json's "launch": what was requested and is in effect, and the run's sizes and settings."""
        cfg, requested, effective, geometry, schedule = (
            self.cfg,
            self.requested,
            self.effective,
            self.geometry,
            self.schedule,
        )
        init_from = self.claim.init_from
        return LaunchRecord(
            requested=RequestedRecord(requested.strategy, requested.world_size, requested.mixed_precision),
            effective=effective,
            run_name=cfg.run.run_name or f"{effective.strategy}-{effective.world_size}x-{effective.precision}",
            device_name=_device_name(self.accelerator.device),
            threads_per_process=torch.get_num_threads(),
            batch=BatchRecord(
                geometry.micro_batch_size,
                geometry.grad_accum_steps,
                geometry.world_size,
                geometry.tokens_per_step,
                geometry.samples_per_step,
            ),
            schedule=ScheduleRecord(schedule.total_steps, schedule.steps_per_epoch, schedule.epochs),
            eval_blocks=len(self.val_loader.dataset),
            model_config=self.model_config.to_dict(),
            n_params=self.n_params,
            n_params_non_embedding=self.n_params_non_embedding,
            flops_per_token=self.flops_per_token,
            **peak.launch_fields(),
            data_stats=self.packed.stats.to_dict(),
            wandb_mode=self.wandb_mode,
            levers=self.levers.to_dict(),
            repeat=cfg.run.repeat,
            # A run from before the machine profile measured its link at its first launch; a resume keeps it.
            link=_earlier_link(self.out) if self.claim.resume_from else None,
            cpu_model=cpu_model_name(),
            resumed_from=resumed,
            # A resumed run keeps the source of the weights its first launch started from.
            initialised_from=(
                init_from.record() if init_from else (earlier_source(self.out) if self.claim.resume_from else None)
            ),
        )

    def _start_loop_state(self) -> None:
        """What the loop advances, besides `state`: at the start of a launch, before any resume restores it."""
        self.last_val: EvalLine | None = None  # the latest validation
        self.nonfinite_since: int | None = None  # first step of the current streak of non-finite steps
        self.last_checkpoint: int | None = None  # step of the newest checkpoint this run wrote or resumed from
        self.pending_save: PendingSave | None = None  # a checkpoint being written in the background
        self.save_groups: tuple[Any, Any] | None = None  # the process groups of background saves, made at the first
        self.checkpoint_saves: list[CheckpointSave] = []  # this launch's saves, as settled

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    def log(self, message: str) -> None:
        log_on_main(self.accelerator, message)

    def emit(self, record: dict[str, Any]) -> None:
        """One metrics record to every sink (the main process writes for all)."""
        if self.is_main:
            self.jsonl.write(record)
            self.wandb.log(record, record["step"])


# ---------------------------------------------------------------------------------------------
# What the trainer's builders call, in their order


def _model_config(cfg: TrainConfig) -> Any:
    from model import GPT2Config

    model_config = GPT2Config.from_preset(
        cfg.model.model_preset,
        embd_pdrop=cfg.model.dropout,
        attn_pdrop=cfg.model.dropout,
        resid_pdrop=cfg.model.dropout,
        attn_impl=cfg.model.attn_impl,
        **({} if cfg.model.n_layer is None else {"n_layer": cfg.model.n_layer}),
    )
    if cfg.data.block_size > model_config.n_positions:
        raise RunError(f"--block_size {cfg.data.block_size} exceeds the model's {model_config.n_positions} positions")
    return model_config


def _start_accelerator(requested: RequestedLaunch, wandb_mode: str, out: Path, timeout_s: int) -> Accelerator:
    import datetime

    fresh_store_on_restart(os.environ, timeout_s)
    accelerator, precision_warning = create_accelerator(
        requested,
        log_with="wandb" if wandb_mode != "disabled" else None,
        project_dir=str(out),
        # A rank that died or hangs makes the others fail after this long instead of waiting for ever.
        kwargs_handlers=[InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=timeout_s))],
        # Steps are whole groups of micro-batches (every epoch is cut to whole steps), and a step's
        # micro-batches are fetched before it runs; syncing "at the end of the dataloader" would then
        # fire on the last step's first micro-batch and step the optimizer twice.
        gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=1, sync_with_dataloader=False),
    )
    if precision_warning:
        log_on_main(accelerator, f"warning: {precision_warning}")
    return accelerator


def _check_folder_shared(accelerator: Accelerator, out: Path) -> None:
    """Every process sees the output folder rank 0 writes (training/run_folder.py), or every process fails
    alike with the one line that names the machines that do not."""
    if accelerator.num_processes == 1:
        return
    probe_name, created = _decided_by_main(accelerator, lambda: _probe_as_main(out))
    # Each process looks in its own --output_dir: machines given different folders must not pass.
    sightings = gather_object([own_sighting(accelerator.process_index, out / probe_name)])
    failure = unshared_error(out, sightings)
    if accelerator.is_main_process:
        remove_probe(out / probe_name, created, shared=failure is None)
    if failure is not None:
        raise RunError(failure)


def _probe_as_main(out: Path) -> tuple[str, bool]:
    probe, created = write_probe(out)
    return probe.name, created


def _claim_and_source(accelerator: Accelerator, cfg: TrainConfig, out: Path, model_config: Any) -> _Claim:
    """The checkpoint this launch continues, if any, and --init_from's source when its weights are to be loaded.

    A restart of an --init_from job (torchrun reruns the same command) continues its own newest checkpoint
    like any restart: the source is then neither looked at nor loaded (it may have been pruned or moved
    since), and config.json keeps the source the first launch recorded. Only a restart that finds no
    checkpoint of its own starts from the source's weights again.
    """
    restart = _job_restart(accelerator)
    roll_back = cfg.run.resume_step is not None and restart == 0
    if cfg.run.init_from is None:
        return _Claim(_claim_output_dir(accelerator, cfg, out, restart), None, roll_back)
    if restart == 0:
        # Before the claim, which may clear the folder: a source that does not fit leaves everything as it was.
        init_from = _agree_on_init(accelerator, cfg, out, model_config)
        return _Claim(_claim_output_dir(accelerator, cfg, out, restart), init_from, roll_back)
    resume_from = _claim_output_dir(accelerator, cfg, out, restart)
    init_from = _agree_on_init(accelerator, cfg, out, model_config) if resume_from is None else None
    return _Claim(resume_from, init_from, roll_back)


def _job_restart(accelerator: Accelerator) -> int:
    """Which restart of the job this is, agreed by every process: the highest of their machines' counts.

    torchrun counts restarts per machine: a machine whose processes did not fail restarts them for the new
    round of the rendezvous without counting, so the main process may be on a machine that says 0 while
    another machine's processes continue a failed attempt (pytorch issue 108158).
    """
    own = restart_count(os.environ)
    return own if accelerator.num_processes == 1 else max(gather_object([own]))


def _claim_output_dir(accelerator: Accelerator, cfg: TrainConfig, out: Path, restart: int) -> Path | None:
    """The main process locks and checks the output folder; every process learns the outcome and fails alike.

    One lock holder per job: the other processes would otherwise see the folder locked by their own
    main process. `restart`: which restart of the job this is (_job_restart). Returns the checkpoint to resume
    from, if any.
    """
    resume_from = _decided_by_main(accelerator, lambda: _claim_as_main(cfg, out, restart))
    return Path(resume_from) if resume_from is not None else None


def _claim_as_main(cfg: TrainConfig, out: Path, restart: int) -> str | None:
    """Lock first, then check and clear: a second launch must not touch the files of a run in progress."""
    _lock, left = acquire_run_lock(out)  # held until this process exits (released at exit)
    if left is not None:
        print(stale_lock_warning(out, left), file=sys.stderr, flush=True)
    resume_from = claim_output_dir(out, cfg.run, restart)
    if restart:
        print(f"restart {restart} of the job: {_continuing(resume_from)}", file=sys.stderr, flush=True)
    return str(resume_from) if resume_from is not None else None


def _continuing(checkpoint: Path | None) -> str:
    return "no complete checkpoint yet, starting afresh" if checkpoint is None else f"continuing from {checkpoint}"


def _agree_on_init(accelerator: Accelerator, cfg: TrainConfig, out: Path, model_config: Any) -> InitSource:
    """The main process finds and checks --init_from's checkpoint; every process learns it, or fails alike,
    also when some process cannot read it (a source on a machine's own disk)."""
    source = _decided_by_main(accelerator, lambda: init_source(cfg.run.init_from, out, model_config.to_dict()))
    if accelerator.num_processes > 1:
        own = (accelerator.process_index, socket.gethostname(), can_read_weights(source.checkpoint))
        failure = unreadable_error(source.checkpoint, gather_object([own]))
        if failure is not None:
            raise RunError(failure)
    return source


def _levers(cfg: TrainConfig, accelerator: Accelerator, strategy: str) -> Levers:
    """Resolve the speed flags for this device and put the process-wide ones (TF32, FSDP's checkpointing) in effect."""
    try:
        levers = decide_levers(cfg.speed, cfg.run.dataloader_workers, DeviceInfo.of(accelerator.device), strategy)
    except ValueError as exc:
        raise RunError(str(exc)) from None
    if levers.activation_checkpointing == registry.CHECKPOINT_IN_FSDP:
        if cfg.model.dropout > 0:
            # accelerate's FSDP checkpoint wrapper does not restore the RNG state for the recompute, so the
            # recomputed dropout masks would differ from the forward's and the gradients would be wrong.
            raise RunError(
                "--activation_checkpointing under FSDP needs --dropout 0: accelerate's FSDP checkpoint "
                "wrapper recomputes with other dropout masks"
            )
        accelerator.state.fsdp_plugin.activation_checkpointing = True
    apply_tf32(levers.tf32)
    return levers


def _levers_line(levers: Levers) -> str:
    return (
        f"levers: compile {'on' if levers.compile else 'off'} ({levers.compile_reason}); activation "
        f"checkpointing {levers.activation_checkpointing}; fused AdamW {'on' if levers.fused_adamw else 'off'}; "
        f"TF32 {'on' if levers.tf32 else 'off'}; pinned memory {'on' if levers.pin_memory else 'off'}; "
        f"{levers.dataloader_workers} DataLoader worker(s)"
    )


@contextlib.contextmanager
def _main_process_first(accelerator: Accelerator) -> Iterator[None]:
    """accelerate's main_process_first, where a bad-input failure of the main process fails every process.

    With accelerate's own, the others wait in a barrier while the main process builds; if it raises, it
    exits and leaves them in that collective, which then dies with a gloo/NCCL traceback per process.
    """
    if not accelerator.is_main_process:
        failure = _share_outcome(None)
        if failure is not None:
            raise RunError(failure)
        yield
        return
    try:
        yield
    except _BAD_INPUT as exc:
        _share_outcome(str(exc))
        raise
    _share_outcome(None)


def _schedule(cfg: TrainConfig, train_blocks: int, geometry: BatchGeometry) -> Schedule:
    steps_per_epoch = train_blocks // geometry.samples_per_step
    if steps_per_epoch == 0:
        raise RunError(
            f"the training split has {train_blocks} blocks of {geometry.block_size} tokens, fewer than one global "
            f"batch ({geometry.samples_per_step} blocks): use more data or a smaller --global_batch_tokens/--block_size"
        )
    total_steps = cfg.optim.max_steps or (cfg.optim.epochs or 1) * steps_per_epoch
    return Schedule(
        steps_per_epoch,
        total_steps,
        min(total_steps, cfg.run.stop_after_steps or total_steps),
        math.ceil(total_steps / steps_per_epoch),
    )


def _start_line(record: LaunchRecord, geometry: BatchGeometry) -> str:
    effective = record.effective
    return (
        f"run {record.run_name}: strategy {effective.strategy} ({effective.wrapper}, "
        f"{effective.world_size} process(es), {effective.backend}), precision {effective.precision}, global batch "
        f"{geometry.tokens_per_step} tokens = {geometry.micro_batch_size} x {geometry.block_size} x "
        f"{geometry.world_size} x {geometry.grad_accum_steps} accumulation, {record.schedule.total_steps} steps, "
        f"{record.n_params:,} parameters, validation on {record.eval_blocks} blocks; MFU peak: "
        f"{record.peak_flops_source}"
    )


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _start_wandb(s: Trainer) -> None:
    record = s.launch
    effective = record.effective
    s.wandb.start(
        s.cfg.run.wandb_project,
        s.resolved,
        {
            "name": record.run_name,
            "group": s.cfg.run.experiment,
            # The arm, not the strategy: an A/A experiment's ddp and ddp#2 are two groups in the W&B report.
            "job_type": s.cfg.run.arm or effective.strategy,
            "mode": record.wandb_mode,
            "dir": str(s.out),
            "entity": s.cfg.run.wandb_entity,
            "tags": [effective.strategy, effective.precision],
            "id": wandb_run_id(s.out) if s.is_main else None,
            "resume": "allow",
            # W&B's console summary at the end would bury the run's own closing lines; W&B still gets
            # everything, and the closing line says where the offline run is.
            "settings": {"quiet": True, **wandb_finish_settings(s.cfg.run.wandb_finish_timeout_s)},
        },
    )


def _resume_origin(checkpoint: Path, identity: ResumeIdentity, roll_back: bool = False) -> dict[str, Any]:
    """Who wrote `checkpoint`, as the run record notes it; RunError (one line) when this launch cannot continue it
    exactly or its origin.json cannot be read."""
    try:
        failure = refusal(checkpoint, identity) or _prefixed("--resume: ", pickled_problem(checkpoint))
        warnings, change = ([], None) if failure else resume_warnings(checkpoint, identity.optimisation)
        # Read now, written once the checkpoint has loaded: a metrics.jsonl that cannot be cut back refuses.
        if failure is None:
            metrics_cut(checkpoint.parent.parent / "metrics.jsonl", checkpoint_step(checkpoint))
    except (OSError, ValueError, *UNPICKLING_ERRORS) as exc:  # a file of it that cannot be read
        failure = f"--resume: {checkpoint}: cannot be read ({type(exc).__name__}: {exc})"
    if failure is not None:
        if roll_back:  # the roll-back noted when the folder was claimed is refused with it: nothing is left to finish
            record_rollback(checkpoint, [])
        raise RunError(failure)
    for line in warnings:  # a torn metrics line is told once it is dropped (_rewrite_after_load)
        print(line, flush=True)
    record = resumed_from(checkpoint, change)
    pending = not roll_back and pending_rollback(checkpoint.parent.parent) == checkpoint_step(checkpoint)
    aside = rolled_back_names(checkpoint) if roll_back or pending else []
    if roll_back or pending:  # renamed once the checkpoint has loaded (_rewrite_after_load), recorded now
        record_rollback(checkpoint, aside)
    if aside:
        record = dataclasses.replace(record, rolled_back=tuple(aside))
    return record.to_dict()


def _prefixed(prefix: str, problem: str | None) -> str | None:
    return None if problem is None else prefix + problem


def _resume(s: Trainer, checkpoint: Path, origin: ResumedFromRecord) -> None:
    from torch.distributed.checkpoint.api import CheckpointException  # DCP's report of every rank's failures

    failure: BaseException | None = None
    try:
        _restore(s, checkpoint, origin)
    except (Exception, CheckpointException) as exc:  # every rank must hear of it before the main process writes
        failure = exc
    _agree_restored(s.accelerator, checkpoint, failure)
    written = None
    if s.is_main:
        try:
            _rewrite_after_load(s.out, checkpoint, origin)
        except (OSError, RunError) as exc:  # the others must not go on training without the main process
            written = f"--resume: {checkpoint} loaded, but the run folder could not be updated: {_one_line(exc)}"
    written = _share_outcome(written)
    if written is not None:
        raise RunError(written)
    s.log(
        f"resumed from {checkpoint} at step {s.state.step}, written by {origin.strategy} on "
        f"{origin.num_processes} process(es)"
    )


def _agree_restored(accelerator: Accelerator, checkpoint: Path, failure: BaseException | None) -> None:
    """Every rank learns whether every rank restored its part (one gather): a rank whose own files fail after the
    shared load (its random states, the grad scaler) fails the resume on all, before anything is written. Every
    rank stops with the same one line naming the ranks that failed and why (torch's load errors span lines)."""
    own = None if failure is None else f"rank {accelerator.process_index}: {_one_line(failure)}"
    failed = [own] if accelerator.num_processes == 1 else gather_object([own])
    lines = [line for line in failed if line is not None]
    if lines:
        raise RunError(
            f"--resume: {checkpoint} did not load on every process ({'; '.join(lines)}); nothing in the run folder "
            f"was changed"
        ) from failure


def _one_line(exc: BaseException) -> str:
    failures = getattr(exc, "failures", None)  # DCP's CheckpointException: each rank's error, not its traceback
    if isinstance(failures, dict):
        return "; ".join(f"DCP rank {rank}: {_one_line(own)}" for rank, (own, _trace) in failures.items())
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def _restore(s: Trainer, checkpoint: Path, origin: ResumedFromRecord) -> None:
    # Weights and optimizer re-sharded to this launch, grad scaler, random states; nothing written before.
    load_states(s.accelerator, s.model, s.optimizer, checkpoint)
    if not origin.random_states_exact and s.cfg.model.dropout > 0:
        s.log(
            f"warning: {checkpoint.name} was written by {origin.num_processes} process(es), this launch has "
            f"{s.accelerator.num_processes}: dropout's per-rank random states cannot follow, so every rank starts "
            f"from the main process's; the steps continue correctly but not as an uninterrupted run's"
        )
    saved = read_train_state(checkpoint)
    s.state.load_state_dict(saved["state"])
    s.scheduler.load_state_dict(saved["scheduler"])
    follow_schedule(s.scheduler)  # a longer schedule than the checkpoint's applies from the next step
    s.tracker.restore([StepRecord(**r) for r in s.state.records], s.state.unlogged)
    s.times = RunTimes(**s.state.times)
    s.last_checkpoint = s.state.step


def _rewrite_after_load(out: Path, checkpoint: Path, origin: ResumedFromRecord) -> None:
    """What a resume changes in the run folder, once its checkpoint has loaded (main process): the newer
    checkpoints a --resume_step sets aside, and metrics.jsonl cut back to the checkpoint's step."""
    if origin.rolled_back:
        print(rolled_back_warning(checkpoint, finish_rollback(checkpoint)), flush=True)
    torn = truncate_metrics(out / "metrics.jsonl", checkpoint_step(checkpoint))
    if torn is not None:
        print(torn, flush=True)


def _earlier_link(out: Path) -> LinkRecord | None:
    """The link the run's config.json recorded at its first launch (runs from before the machine profile)."""
    found = earlier_launch(out, "link")
    return None if found is None else LinkRecord.from_dict(found)


def _probe_step(cfg: TrainConfig, resumed_at: int, schedule: Schedule) -> int:
    """The step whose memory peak is measured: one that the steady throughput figures leave out.

    The second step is the first to start with optimizer state, as every later step does; on the CPU
    its tracking slows it, so it must be a warm-up step: with one warm-up step the first is measured,
    with none, no step (0). A resumed run measures its first step.
    """
    if resumed_at:
        return resumed_at + 1 if cfg.run.perf_warmup_steps > resumed_at else 0
    return min(2, cfg.run.perf_warmup_steps, schedule.stop_at)


def log_on_main(accelerator: Accelerator, message: str) -> None:
    """A console line, printed once for all processes."""
    if accelerator.is_main_process:
        print(message, flush=True)


# Failures that train.py reports as one `error:` line with exit status 2.
# PermissionError: a checkpoint or source whose files this user may not read (checkpoint_problem reads them).
_BAD_INPUT = (RunError, DataError, ValueError, FileNotFoundError, PermissionError)


def _share_outcome(failure: str | None) -> str | None:
    """The main process's outcome (None, or its one-line error) in every process: one collective."""
    return broadcast_object_list([failure], from_process=0)[0]


_Decision = TypeVar("_Decision")


def _decided_by_main(accelerator: Accelerator, decide: Callable[[], _Decision]) -> _Decision:
    """`decide()` run by the main process alone, its value given to every process in one collective; when it
    fails on bad input, every process raises its one-line error alike (RunError)."""
    outcome: tuple[str | None, Any] = (None, None)  # (failure, value)
    if accelerator.is_main_process:
        try:
            outcome = (None, decide())
        except _BAD_INPUT as exc:
            outcome = (str(exc), None)
    failure, value = broadcast_object_list([outcome], from_process=0)[0]
    if failure is not None:
        raise RunError(failure)
    return value
