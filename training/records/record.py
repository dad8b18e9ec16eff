"""What a run records, as types: the launch layout (config.json's "launch") and the summary (summary.json).

train.py writes both files from these dataclasses and analysis/ reads summary.json back into them, so a
key is spelled once, here. The field order is the files' key order (see docs/run_directory.md). The
figures themselves (metrics.jsonl's lines, summary.json's "epochs" and "total") are records built from
the run schema (training/records/schema.py), where each figure is declared.

Reading is tolerant, because run folders outlive the code that wrote them: a key the file lacks reads as
None, a key no field has is ignored. Sub-records that other modules own and describe (the model config,
the data statistics, the levers, the memory probe's result, the sharding observer's result) stay plain
JSON objects here.

Pure Python (no torch), so the analysis and notebook side can import it cheaply.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, make_dataclass
from typing import Any, ClassVar, TypeVar

from training.records.schema import LINE_KIND_KEY, Scope, in_scope

R = TypeVar("R", bound="Record")


class Record:
    """A dataclass that is one JSON object of a run's files; subclasses say which fields hold records."""

    # field name -> the Record class of its value (or of each item, when the value is a list)
    _nested: ClassVar[dict[str, type[Record]]] = {}
    # fields that are tuples in memory and JSON arrays in the file
    _tuples: ClassVar[frozenset[str]] = frozenset()
    # fields left out of the file when they are None (rather than written as null)
    _omitted_when_none: ClassVar[frozenset[str]] = frozenset()

    def to_dict(self) -> dict[str, Any]:
        """The JSON object, keys in field order; non-finite numbers become None (null), as JSON has none."""
        return {
            f.name: _to_json(getattr(self, f.name))
            for f in fields(self)  # type: ignore[arg-type]
            if not (f.name in self._omitted_when_none and getattr(self, f.name) is None)
        }

    @classmethod
    def from_dict(cls: type[R], data: Mapping[str, Any]) -> R:
        """Read a JSON object: missing keys are None, unknown keys are ignored."""
        return cls(**{f.name: cls._read(f.name, data.get(f.name)) for f in fields(cls)})  # type: ignore[arg-type]

    @classmethod
    def _read(cls, name: str, value: Any) -> Any:
        nested = cls._nested.get(name)
        if nested is not None:
            if isinstance(value, Mapping):
                return nested.from_dict(value)
            if isinstance(value, list):
                return [nested.from_dict(v) for v in value if isinstance(v, Mapping)]
            return None
        if name in cls._tuples and isinstance(value, list):
            return tuple(value)
        return value


def _to_json(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# ---------------------------------------------------------------------------------------------
# The launch layout: config.json's "launch"


@dataclass(frozen=True)
class RequestedRecord(Record):
    """What the launch asked for (training.distributed.strategy.RequestedLaunch, as recorded)."""

    strategy: str | None
    world_size: int | None  # None: the config asked for several processes, how many is not visible
    mixed_precision: str | None  # no | fp16 | bf16


@dataclass(frozen=True)
class EffectiveRecord(Record):
    """What is really running, read off the process group and the prepared model
    (training.distributed.strategy.effective_strategy), as the guard checks it and config.json records it. Read back
    from an older run folder, a field it did not record is None."""

    strategy: str | None  # a training.distributed.registry name, or what is running when no entry fits
    world_size: int | None
    num_machines: int | None
    backend: str | None
    distributed_type: str | None
    wrapper: str | None
    params_sharded: bool | None
    local_param_numel: int | None
    global_param_numel: int | None
    precision: str | None  # fp32 | fp16 | bf16
    device_type: str | None
    block_shard_fractions: tuple[float, ...] | None = ()  # local/global parameter share of each FSDP-wrapped block
    # Read from the blocks' FSDP units (None when not FSDP): their reshard-after-forward setting, whether
    # their offload policy is CPUOffloadPolicy, and the device types the parameter shards live on.
    fsdp_reshard_after_forward: bool | None = None
    fsdp_offload_params: bool | None = None
    param_devices: tuple[str, ...] | None = ()
    checkpoint_wrapped_blocks: int | None = 0  # blocks wrapped by accelerate's FSDP activation checkpointing
    # Read from the blocks' FSDP units under hybrid sharding (None otherwise): the mesh's replicate and
    # shard sizes, the ranks of every shard group (the mesh's rows), and whether each group is on one machine.
    dp_replicate_size: int | None = None
    dp_shard_size: int | None = None
    shard_groups: tuple[tuple[int, ...], ...] | None = None
    shard_groups_within_machines: bool | None = None
    # The test-only switch that kept fp16 on a CPU (training.distributed.strategy.CPU_FP16_SWITCH); None otherwise.
    precision_switch: str | None = None

    _tuples: ClassVar[frozenset[str]] = frozenset({"block_shard_fractions", "param_devices"})
    _omitted_when_none: ClassVar[frozenset[str]] = frozenset(
        {"dp_replicate_size", "dp_shard_size", "shard_groups", "shard_groups_within_machines", "precision_switch"}
    )


@dataclass(frozen=True)
class BatchRecord(Record):
    micro_batch_size: int | None
    grad_accum_steps: int | None
    world_size: int | None
    global_batch_tokens: int | None
    global_batch_samples: int | None


@dataclass(frozen=True)
class ScheduleRecord(Record):
    total_steps: int | None  # the learning-rate schedule's length
    steps_per_epoch: int | None
    epochs: int | None


@dataclass(frozen=True)
class ResumedFromRecord(Record):
    """The checkpoint a resumed launch continued from (training/checkpoints/resume.py): its step and who wrote it."""

    step: int | None
    strategy: str | None  # the strategy in effect when it was written
    num_processes: int | None
    precision: str | None
    # Whether every rank took back the random states its own rank saved (same process count); otherwise
    # every rank took the main process's, and dropout's masks differ from an uninterrupted run's.
    random_states_exact: bool | None = None
    # A longer schedule than the checkpoint's (a larger --max_steps): its length, and the first step whose
    # learning rate differs from the saved schedule's (training/checkpoints/resume.py); both left out when it is the same.
    saved_total_steps: int | None = None
    schedule_changed_from_step: int | None = None
    # --resume_step: the newer checkpoint folders it renamed aside (step_N.rolled_back), oldest first; left out
    # when none was renamed.
    rolled_back: tuple[str, ...] | None = None

    _tuples: ClassVar[frozenset[str]] = frozenset({"rolled_back"})
    _omitted_when_none: ClassVar[frozenset[str]] = frozenset(
        {"saved_total_steps", "schedule_changed_from_step", "rolled_back"}
    )


@dataclass(frozen=True)
class InitialisedFromRecord(Record):
    """The checkpoint whose model weights a new run started from (--init_from, training/checkpoints/init_from.py)."""

    path: str | None  # the checkpoint folder, absolute
    step: int | None  # the step it was written at, in the run that wrote it
    strategy: str | None  # the strategy in effect when it was written
    num_processes: int | None


@dataclass(frozen=True)
class LinkRecord(Record):
    """The all-reduce bus bandwidth and per-call latency a multi-process run measured at start (planner/link.py).

    `bus_gb_s` is NCCL's bus bandwidth, 2(n-1)/n x bytes / seconds, the figure `planner.plan --link_gb_s`
    takes; `algorithm_gb_s` is bytes / seconds. Single-process runs record none.
    """

    backend: str | None  # nccl | gloo
    world_size: int | None
    message_bytes: int | None  # one all-reduce's buffer: a DDP bucket, or all the gradients when smaller
    dtype: str | None  # the gradients' dtype
    iterations: int | None  # timed all-reduces, after the warm-up
    seconds_per_all_reduce: float | None
    algorithm_gb_s: float | None
    bus_gb_s: float | None
    # An all-reduce of one element: the per-call cost (latency) of a collective, whatever its size; None in
    # runs from before it was measured.
    latency_s: float | None = None
    # A sharding run's own collectives (planner/link.py `sharded_calls`), left out for DDP and in runs from
    # before they were measured: the all-gather and reduce-scatter of `message_bytes` and of one element per
    # rank, each the mean seconds per call as `seconds_per_all_reduce` is; FSDP2's all-gather and
    # reduce-scatter of one unit per call (copy-in, copy-out, hooks and the call), None where noise hid it.
    shard_group_size: int | None = None  # the processes they span: world_size, or one machine's (hybrid)
    seconds_per_all_gather: float | None = None
    all_gather_latency_s: float | None = None
    seconds_per_reduce_scatter: float | None = None
    reduce_scatter_latency_s: float | None = None
    fsdp_all_gather_call_s: float | None = None
    fsdp_kept_all_gather_call_s: float | None = None  # units kept gathered after forward (fsdp_zero2)
    fsdp_reduce_scatter_call_s: float | None = None

    _omitted_when_none: ClassVar[frozenset[str]] = frozenset(
        {
            "shard_group_size",
            "seconds_per_all_gather",
            "all_gather_latency_s",
            "seconds_per_reduce_scatter",
            "reduce_scatter_latency_s",
            "fsdp_all_gather_call_s",
            "fsdp_kept_all_gather_call_s",
            "fsdp_reduce_scatter_call_s",
        }
    )


@dataclass(frozen=True)
class LaunchRecord(Record):
    """How the run was laid out, as config.json's "launch" holds it."""

    requested: RequestedRecord | None
    effective: EffectiveRecord | None
    run_name: str | None
    device_name: str | None
    # On CPU a process stands in for a device; `accelerate launch` gives each process one thread
    # unless OMP_NUM_THREADS says otherwise, while plain `python train.py` uses every core.
    threads_per_process: int | None
    batch: BatchRecord | None
    schedule: ScheduleRecord | None
    eval_blocks: int | None
    model_config: dict[str, Any] | None  # model.GPT2Config.to_dict()
    n_params: int | None
    n_params_non_embedding: int | None
    flops_per_token: float | None
    peak_flops_per_device: float | None
    peak_flops_source: str | None
    data_stats: dict[str, Any] | None  # data.DataStats.to_dict()
    wandb_mode: str | None
    levers: dict[str, Any] | None  # training.distributed.speed_levers.Levers.to_dict()
    # A measured (CPU) peak's kept measurement: when it was taken (UTC, ISO 8601) and its trials'
    # (fastest - slowest) / median; absent for a table figure and in launch records written before them.
    peak_flops_measured_at: str | None = None
    peak_flops_relative_spread: float | None = None
    # An experiment's repeat of the same strategy and seed (train.py --repeat); None outside repeats.
    repeat: int | None = None
    # The link runs measured at start until the machine profile held it (planner/profile.py); None since.
    link: LinkRecord | None = None
    # The CPU model the run ran on (what the machine profile a prediction reads must have been measured on);
    # absent in runs written before it.
    cpu_model: str | None = None
    resumed_from: ResumedFromRecord | None = None  # the checkpoint --resume continued; None for a fresh start
    # The checkpoint whose weights --init_from started this run from; None otherwise.
    initialised_from: InitialisedFromRecord | None = None

    _nested: ClassVar[dict[str, type[Record]]] = {
        "requested": RequestedRecord,
        "effective": EffectiveRecord,
        "batch": BatchRecord,
        "schedule": ScheduleRecord,
        "link": LinkRecord,
        "resumed_from": ResumedFromRecord,
        "initialised_from": InitialisedFromRecord,
    }
    # Absent rather than null when None, so a run folder written before them reads back as it was written.
    _omitted_when_none: ClassVar[frozenset[str]] = frozenset(
        {
            "peak_flops_measured_at",
            "peak_flops_relative_spread",
            "repeat",
            "link",
            "cpu_model",
            "resumed_from",
            "initialised_from",
        }
    )

    @property
    def data_key(self) -> str | None:
        """Content hash of the packed data (corpus bytes, tokenizer, block size, split)."""
        return (self.data_stats or {}).get("cache_key")


# ---------------------------------------------------------------------------------------------
# The summary: summary.json


def _schema_record(name: str, scope: Scope, doc: str, base: type[Record] = Record) -> type[Record]:
    """A frozen Record with one field per metric the schema declares for `scope`, in its order (the
    files' key order): a figure is declared once, in training/records/schema.py, and every record has it."""
    return make_dataclass(
        name,
        [(m.key, m.value_type | None) for m in in_scope(scope)],
        bases=(base,),
        namespace={"__doc__": doc, "__module__": __name__, "scope": scope},
        frozen=True,
    )


class Line(Record):
    """A metrics.jsonl line; `scope` says its kind."""

    scope: ClassVar[Scope]

    def line(self) -> dict[str, Any]:
        """The line for the sinks: its kind first, then the figures as measured (the sinks make them JSON-safe)."""
        return {LINE_KIND_KEY: self.scope.value, **{f.name: getattr(self, f.name) for f in fields(self)}}  # type: ignore[arg-type]


TrainLine = _schema_record(
    "TrainLine", Scope.TRAIN, "A train line: an interval of logged steps (training.records.metrics).", Line
)
EvalLine = _schema_record(
    "EvalLine", Scope.EVAL, "An eval line: one validation (training.records.metrics.eval_line).", Line
)
EpochFigures = _schema_record(
    "EpochFigures",
    Scope.EPOCH,
    "One epoch's figures (training.records.metrics.epoch_summary); `partial`: the budget ended in it.",
)
RunTotals = _schema_record("RunTotals", Scope.TOTAL, "Whole-run figures (training.records.metrics.total_summary).")


@dataclass(frozen=True)
class StopRecord(Record):
    """Why a run stopped early on purpose, and the exit status train.py ends with."""

    reason: str | None  # training.step.RunStopped.reason
    exit_status: int | None
    message: str | None


@dataclass(frozen=True)
class CheckpointSave(Record):
    """One checkpoint a launch wrote: how long training paused for it and how long it took to be complete."""

    step: int | None
    asynchronous: bool | None  # written beside training (DCP's async_save), or while training waited
    # Seconds training was paused for it: the copy to host memory (asynchronous) or the whole save, plus any
    # wait for it to be complete at the next save or the end.
    blocked_s: float | None
    total_s: float | None  # seconds from its start to its complete.json (written, synced, older ones pruned)


@dataclass(frozen=True)
class RunSummary(Record):
    """summary.json: who the run was (strategy, devices, model, data, batch), then how far it got and its figures."""

    run_name: str | None
    experiment: str | None
    strategy: str | None
    requested_strategy: str | None
    world_size: int | None
    num_machines: int | None
    precision: str | None
    requested_precision: str | None
    precision_switch: str | None  # the test-only switch that kept fp16 on a CPU; left out otherwise
    device_type: str | None
    device_name: str | None
    threads_per_process: int | None
    backend: str | None
    wrapper: str | None
    params_sharded: bool | None
    local_param_numel: int | None
    block_shard_fractions: tuple[float, ...] | None
    fsdp_reshard_after_forward: bool | None
    fsdp_offload_params: bool | None
    param_devices: tuple[str, ...] | None
    checkpoint_wrapped_blocks: int | None
    # Hybrid sharding's live mesh: replicas x shard group size and the ranks of each shard group (HSDP only).
    dp_replicate_size: int | None
    dp_shard_size: int | None
    shard_groups: list[list[int]] | None
    sharding_observed: dict[str, Any] | None  # training.distributed.strategy.ShardingObserver's result
    memory: dict[str, Any] | None  # training.records.memory.MemoryProbe's result
    levers: dict[str, Any] | None
    peak_flops_per_device: float | None
    peak_flops_source: str | None
    # When the measured peak was taken and how widely its trials spread (as LaunchRecord); written only
    # for a measured peak, so two runs with equal figures and times divided by the same measurement.
    peak_flops_measured_at: str | None
    peak_flops_relative_spread: float | None
    preset: str | None
    n_params: int | None
    n_params_non_embedding: int | None
    seed: int | None
    repeat: int | None  # which repeat of the same strategy and seed (None: not one of several)
    link: LinkRecord | None  # the all-reduce bus bandwidth measured at start; None for one process
    # Content hash of the packed data (corpus bytes, tokenizer, block size, split): equal keys and
    # seeds mean the runs saw the same tokens in the same order.
    data_key: str | None
    eval_blocks: int | None
    block_size: int | None
    micro_batch_size: int | None
    grad_accum_steps: int | None
    global_batch_tokens: int | None
    steps: int | None
    tokens_trained: int | None
    complete: bool | None
    epochs: list[EpochFigures] | None
    total: RunTotals | None
    step_times_s: list[float] | None
    skipped_step_numbers: list[int] | None
    checkpoint_saves: list[CheckpointSave] | None = None  # this launch's saves, oldest first
    stop: StopRecord | None = None  # only when the run stopped early on purpose

    _nested: ClassVar[dict[str, type[Record]]] = {
        "epochs": EpochFigures,
        "total": RunTotals,
        "stop": StopRecord,
        "link": LinkRecord,
        "checkpoint_saves": CheckpointSave,
    }
    _tuples: ClassVar[frozenset[str]] = frozenset({"block_shard_fractions", "param_devices"})
    # Absent rather than null when None: older run folders read back as they were written.
    _omitted_when_none: ClassVar[frozenset[str]] = frozenset(
        {
            "precision_switch",
            "stop",
            "peak_flops_measured_at",
            "peak_flops_relative_spread",
            "repeat",
            "link",
            "dp_replicate_size",
            "dp_shard_size",
            "shard_groups",
            "checkpoint_saves",
        }
    )


@dataclass(frozen=True)
class RunFacts:
    """What the summary holds besides the launch layout: the run's settings and how far it got."""

    experiment: str | None
    preset: str | None
    seed: int | None
    block_size: int | None
    sharding_observed: dict[str, Any] | None  # None: not known (a run fetched back from W&B)
    memory: dict[str, Any] | None
    steps: int
    tokens_trained: int
    complete: bool
    epochs: list[EpochFigures]
    total: RunTotals
    step_times_s: list[float]
    skipped_step_numbers: list[int] | None  # None: not known (a run fetched back from W&B)
    stop: StopRecord | None = None
    checkpoint_saves: list[CheckpointSave] | None = None  # None: not known (a run fetched back from W&B)


def recorded_precision(mixed_precision: str | None) -> str | None:
    """accelerate's "no" is fp32 in the summary; fp16 and bf16 are themselves."""
    return {"no": "fp32"}.get(mixed_precision or "", mixed_precision)


def run_summary(launch: LaunchRecord, facts: RunFacts) -> RunSummary:
    """The summary of a run laid out as `launch` that got as far as `facts` say."""
    effective = launch.effective or EffectiveRecord.from_dict({})
    requested = launch.requested or RequestedRecord.from_dict({})
    batch = launch.batch or BatchRecord.from_dict({})
    return RunSummary(
        run_name=launch.run_name,
        experiment=facts.experiment,
        strategy=effective.strategy,
        requested_strategy=requested.strategy,
        world_size=effective.world_size,
        num_machines=effective.num_machines,
        precision=effective.precision,
        requested_precision=recorded_precision(requested.mixed_precision),
        precision_switch=effective.precision_switch,
        device_type=effective.device_type,
        device_name=launch.device_name,
        threads_per_process=launch.threads_per_process,
        backend=effective.backend,
        wrapper=effective.wrapper,
        params_sharded=effective.params_sharded,
        local_param_numel=effective.local_param_numel,
        block_shard_fractions=effective.block_shard_fractions,
        fsdp_reshard_after_forward=effective.fsdp_reshard_after_forward,
        fsdp_offload_params=effective.fsdp_offload_params,
        param_devices=effective.param_devices,
        checkpoint_wrapped_blocks=effective.checkpoint_wrapped_blocks,
        dp_replicate_size=effective.dp_replicate_size,
        dp_shard_size=effective.dp_shard_size,
        shard_groups=[list(g) for g in effective.shard_groups] if effective.shard_groups else None,
        sharding_observed=facts.sharding_observed,
        memory=facts.memory,
        levers=launch.levers,
        peak_flops_per_device=launch.peak_flops_per_device,
        peak_flops_source=launch.peak_flops_source,
        peak_flops_measured_at=launch.peak_flops_measured_at,
        peak_flops_relative_spread=launch.peak_flops_relative_spread,
        preset=facts.preset,
        n_params=launch.n_params,
        n_params_non_embedding=launch.n_params_non_embedding,
        seed=facts.seed,
        repeat=launch.repeat,
        link=launch.link,
        data_key=launch.data_key,
        eval_blocks=launch.eval_blocks,
        block_size=facts.block_size,
        micro_batch_size=batch.micro_batch_size,
        grad_accum_steps=batch.grad_accum_steps,
        global_batch_tokens=batch.global_batch_tokens,
        steps=facts.steps,
        tokens_trained=facts.tokens_trained,
        complete=facts.complete,
        epochs=facts.epochs,
        total=facts.total,
        step_times_s=facts.step_times_s,
        skipped_step_numbers=facts.skipped_step_numbers,
        checkpoint_saves=facts.checkpoint_saves,
        stop=facts.stop,
    )
