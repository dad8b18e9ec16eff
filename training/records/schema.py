"""The run schema: every figure a run records, declared once.

Each `Metric` names a metrics.jsonl or summary.json key and says what it is: its unit and Python type,
where it is recorded (a train line, an eval line, an epoch of summary.json, the whole run), how it is
taken over the optimizer steps and the ranks it covers, which direction is better, whether warm-up
steps are left out, and the W&B key its lines are logged under. The order within a scope is the
files' key order: training/records/record.py builds the typed records (`TrainLine`, `EvalLine`,
`EpochFigures`, `RunTotals`) from these declarations, training/records/metrics.py fills them, and the
analysis side reads them back. The comparison table's columns (`TABLE`) and the W&B report's panels
(`CURVES`, `BARS`) are declared here too, by the metrics they show. Torch-free: the report tools import it.

Other modules name a metric by the constants at the end of the table (`THROUGHPUT.key`), not by a
string; tests/test_structure.py holds them to that, and tests/test_run_schema.py checks the table
against real run directories.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum


class Scope(Enum):
    """Where a key is recorded; the value is how the run directory spells that place."""

    TRAIN = "train"  # metrics.jsonl lines of kind "train", one per logged optimizer step
    EVAL = "eval"  # metrics.jsonl lines of kind "eval", one per validation
    EPOCH = "epochs"  # summary.json "epochs", one entry per epoch
    TOTAL = "total"  # summary.json "total", the whole run


class Steps(Enum):
    """How a figure is taken over the optimizer steps it covers (a line's interval, an epoch, the run)."""

    AT = "the value at the step it is recorded at"  # a counter, a setting, one validation
    LAST = "the last step's value"
    MEAN = "mean over the steps"
    SUM = "sum over the steps"
    RATE = "the steps' amount / their measured time"
    QUANTILE = "a quantile of the steps' values"
    PEAK = "the highest since the epoch started"  # torch's peak counters, reset each epoch
    MAX = "max over the epochs"


class Ranks(Enum):
    """How a figure is taken over the ranks (processes) of the job."""

    SAME = "the same on every rank"  # counters, settings, the global gradient norm
    MAIN = "measured by the main process"  # its clock, after a device sync
    JOB = "summed over ranks: the whole job"
    PER_DEVICE = "the whole job / world size"
    MEAN = "mean over ranks"  # the loss: token-weighted over every rank's tokens
    MAX = "max over ranks"


class Better(Enum):
    """Which direction of a figure is the better one, where one is."""

    HIGHER = "higher"
    LOWER = "lower"


LINE_SCOPES = frozenset({Scope.TRAIN, Scope.EVAL})
# metrics.jsonl says which kind of line it is under this key; it is the line's type, not a metric.
LINE_KIND_KEY = "kind"
# summary.json's whole-run figures go to the W&B run summary under this prefix.
WANDB_SUMMARY_PREFIX = "total/"


@dataclass(frozen=True)
class Metric:
    """One figure a run records, in one or more scopes (see the module docstring)."""

    key: str  # as metrics.jsonl / summary.json spell it
    scopes: tuple[Scope, ...]  # several only where the key means the same thing in each
    unit: str  # "" for a pure number (a count of nothing in particular, a norm, a ratio)
    description: str
    steps: Steps
    ranks: Ranks
    better: Better | None = None  # None: neither direction is better (a counter, a setting, a norm)
    wandb_key: str | None = None  # the W&B history key of a line metric; None: not logged to the history
    value_type: type = float  # the value's type in the typed records (None when not recorded, NaN as null)
    excludes_warmup: bool = False  # the first --perf_warmup_steps steps are left out
    # An epoch figure that is the epoch's last value of this line key: the W&B fetch rebuilds it so.
    epoch_last_of: str | None = None
    # The smallest relative difference between strategies that matters (0.02: 2%); the report calls a pair
    # whose whole interval lies inside it "no meaningful difference", never higher or lower
    # (docs/statistics.md, "The practical margin"). None: the report does not compare it.
    margin: float | None = None

    def __post_init__(self) -> None:
        # Caught at import, so a wrong declaration never reaches a run or a report.
        if self.epoch_last_of is not None and self.scopes != (Scope.EPOCH,):
            raise ValueError(f"{self.key}: only an epoch figure is the last value of a line key")
        if self.wandb_key is not None and not LINE_SCOPES & set(self.scopes):
            raise ValueError(f"{self.key}: only metrics.jsonl lines are logged to the W&B history")

    @property
    def wandb_summary_key(self) -> str:
        """The W&B run-summary key of a whole-run figure."""
        if Scope.TOTAL not in self.scopes:
            raise ValueError(f"{self.key} is not a whole-run figure")
        return wandb_summary_key(self.key)


def wandb_summary_key(total_key: str) -> str:
    """The W&B run-summary key of a summary.json "total" figure."""
    return WANDB_SUMMARY_PREFIX + total_key


_T, _E, _EP, _TOT = Scope.TRAIN, Scope.EVAL, Scope.EPOCH, Scope.TOTAL
_AT, _LAST, _MEAN, _SUM, _RATE, _Q, _PEAK, _MAX = Steps
_SAME, _MAIN, _JOB, _PER_DEVICE, _RMEAN, _RMAX = Ranks
_UP, _DOWN = Better.HIGHER, Better.LOWER
_PER_RANK = "max over ranks of torch.cuda.max_memory_"

# The smallest relative differences between strategies that matter (docs/statistics.md, "The practical
# margin", gives the reasons): a time or a throughput 2% apart, memory 1%, a loss 0.5%. The figures the
# report compares that are no metric of this table declare theirs here too.
TIME_MARGIN = 0.02
MEMORY_MARGIN = 0.01
LOSS_MARGIN = 0.005
STEP_PEAK_MARGIN = MEMORY_MARGIN  # summary.json memory.step_peak_bytes: the live tensors at the step peak
TARGET_MARGIN = TIME_MARGIN  # the time and the tokens to a target validation loss

# The order within a scope is the files' key order (metrics.jsonl lines, summary.json "epochs" and
# "total"), and the order eval lines rebuilt from W&B keep. W&B panels group by the prefix before "/";
# skipped_steps* were first logged without one and keep their names so that W&B history stays comparable.
METRICS: tuple[Metric, ...] = (
    # metrics.jsonl, both kinds of line
    Metric(
        "step",
        (_T, _E),
        "steps",
        "optimizer steps completed (1-based); W&B's own step axis",
        _AT,
        _SAME,
        value_type=int,
    ),
    Metric(
        "epoch",
        (_T, _E, _EP),
        "",
        "epoch of this step, validation or summary entry (1-based)",
        _AT,
        _SAME,
        wandb_key="train/epoch",
        value_type=int,
    ),
    Metric(
        "tokens",
        (_T, _E),
        "tokens",
        "tokens trained so far, whole job (cumulative)",
        _AT,
        _JOB,
        wandb_key="train/tokens",
        value_type=int,
    ),
    # metrics.jsonl, train lines
    Metric(
        "loss",
        (_T,),
        "nats",
        "mean next-token cross-entropy of this step, all ranks and micro-steps",
        _LAST,
        _RMEAN,
        _DOWN,
        "train/loss",
    ),
    Metric(
        "loss_interval",
        (_T,),
        "nats",
        "the step loss averaged over the interval's steps",
        _MEAN,
        _RMEAN,
        _DOWN,
        "train/loss_interval",
    ),
    Metric(
        "grad_norm",
        (_T,),
        "",
        "global L2 norm of all gradients of this step, before clipping",
        _LAST,
        _SAME,
        wandb_key="train/grad_norm",
    ),
    Metric("lr", (_T,), "", "learning rate used for this step", _AT, _SAME, wandb_key="train/lr"),
    Metric(
        "step_time_s",
        (_T,),
        "s",
        "mean wall time of one optimizer step over the interval",
        _MEAN,
        _MAIN,
        _DOWN,
        "time/step_time_s",
    ),
    Metric(
        "tokens_per_s",
        (_T,),
        "tokens/s",
        "tokens of the interval / its measured time, whole job",
        _RATE,
        _JOB,
        _UP,
        "perf/tokens_per_s",
    ),
    Metric(
        "tokens_per_s_per_device",
        (_T,),
        "tokens/s",
        "tokens_per_s / world size",
        _RATE,
        _PER_DEVICE,
        _UP,
        "perf/tokens_per_s_per_device",
    ),
    Metric(
        "samples_per_s",
        (_T,),
        "samples/s",
        "sequences of the interval / its measured time",
        _RATE,
        _JOB,
        _UP,
        "perf/samples_per_s",
    ),
    Metric(
        "mfu",
        (_T,),
        "fraction",
        "model FLOPs utilisation of the interval, per device",
        _RATE,
        _PER_DEVICE,
        _UP,
        "perf/mfu",
    ),
    Metric(
        "peak_mem_allocated_mib",
        (_T,),
        "MiB",
        _PER_RANK + "allocated since the epoch started",
        _PEAK,
        _RMAX,
        _DOWN,
        "mem/peak_allocated_mib",
    ),
    Metric(
        "peak_mem_reserved_mib",
        (_T,),
        "MiB",
        _PER_RANK + "reserved since the epoch started",
        _PEAK,
        _RMAX,
        _DOWN,
        "mem/peak_reserved_mib",
    ),
    Metric(
        "peak_mem_allocated_mib_mean",
        (_T,),
        "MiB",
        "mean over ranks of the peak allocated",
        _PEAK,
        _RMEAN,
        _DOWN,
        "mem/peak_allocated_mib_mean",
    ),
    Metric(
        "peak_mem_reserved_mib_mean",
        (_T,),
        "MiB",
        "mean over ranks of the peak reserved",
        _PEAK,
        _RMEAN,
        _DOWN,
        "mem/peak_reserved_mib_mean",
    ),
    Metric("elapsed_s", (_T,), "s", "training time so far (steps only)", _SUM, _MAIN, wandb_key="time/elapsed_s"),
    # a flag, and W&B is given numbers only
    Metric(
        "warmup", (_T,), "", "the interval lies within the first --perf_warmup_steps steps", _AT, _SAME, value_type=bool
    ),
    Metric(
        "skipped_steps_interval",
        (_T,),
        "steps",
        "steps the fp16 grad scaler skipped within the interval",
        _SUM,
        _SAME,
        _DOWN,
        "skipped_steps_interval",
        value_type=int,
    ),
    Metric(
        "skipped_steps",
        (_T,),
        "steps",
        "steps the fp16 grad scaler skipped so far",
        _SUM,
        _SAME,
        _DOWN,
        "skipped_steps",
        value_type=int,
    ),
    # metrics.jsonl, eval lines
    Metric(
        "val_loss",
        (_E,),
        "nats",
        "cross-entropy over the --eval_blocks validation blocks",
        _AT,
        _RMEAN,
        _DOWN,
        "val/loss",
    ),
    Metric("val_ppl", (_E,), "", "exp(val_loss)", _AT, _RMEAN, _DOWN, "val/ppl"),
    Metric("eval_time_s", (_E,), "s", "wall time of this validation", _AT, _MAIN, _DOWN, "time/eval_time_s"),
    # summary.json "epochs"; memory lines hold the peak since the epoch started, so the epoch's peak is
    # its last line's
    Metric("partial", (_EP,), "", "the step budget ended inside this epoch", _AT, _SAME, value_type=bool),
    Metric("steps", (_EP,), "steps", "optimizer steps of the epoch", _SUM, _SAME, value_type=int),
    Metric("tokens", (_EP,), "tokens", "tokens trained in the epoch, whole job", _SUM, _JOB, value_type=int),
    Metric(
        "loss_mean",
        (_EP,),
        "nats",
        "mean step loss of the epoch, finite steps",
        _MEAN,
        _RMEAN,
        _DOWN,
        excludes_warmup=True,
    ),
    Metric(
        "loss_nonfinite_steps",
        (_EP,),
        "steps",
        "steps left out of loss_mean: loss not finite",
        _SUM,
        _SAME,
        _DOWN,
        value_type=int,
    ),
    Metric(
        "grad_norm_mean",
        (_EP,),
        "",
        "mean gradient norm of the epoch, finite steps",
        _MEAN,
        _SAME,
        excludes_warmup=True,
    ),
    Metric(
        "grad_norm_nonfinite_steps",
        (_EP,),
        "steps",
        "steps left out of grad_norm_mean: norm not finite",
        _SUM,
        _SAME,
        _DOWN,
        value_type=int,
    ),
    Metric(
        "skipped_steps",
        (_EP,),
        "steps",
        "steps the fp16 grad scaler skipped in the epoch",
        _SUM,
        _SAME,
        _DOWN,
        value_type=int,
    ),
    Metric("time_s", (_EP,), "s", "training time of the epoch (steps only)", _SUM, _MAIN, _DOWN),
    Metric("tokens_per_s", (_EP,), "tokens/s", "tokens of the epoch / its training time, whole job", _RATE, _JOB, _UP),
    Metric("tokens_per_s_per_device", (_EP,), "tokens/s", "the same / world size", _RATE, _PER_DEVICE, _UP),
    Metric("samples_per_s", (_EP,), "samples/s", "sequences of the epoch / its training time", _RATE, _JOB, _UP),
    Metric(
        "peak_mem_allocated_mib_max",
        (_EP,),
        "MiB",
        "peak allocated in the epoch, max over ranks",
        _PEAK,
        _RMAX,
        _DOWN,
        epoch_last_of="peak_mem_allocated_mib",
    ),
    Metric(
        "peak_mem_allocated_mib_mean",
        (_EP,),
        "MiB",
        "peak allocated in the epoch, mean over ranks",
        _PEAK,
        _RMEAN,
        _DOWN,
        epoch_last_of="peak_mem_allocated_mib_mean",
    ),
    Metric(
        "peak_mem_reserved_mib_max",
        (_EP,),
        "MiB",
        "peak reserved in the epoch, max over ranks",
        _PEAK,
        _RMAX,
        _DOWN,
        epoch_last_of="peak_mem_reserved_mib",
    ),
    Metric(
        "peak_mem_reserved_mib_mean",
        (_EP,),
        "MiB",
        "peak reserved in the epoch, mean over ranks",
        _PEAK,
        _RMEAN,
        _DOWN,
        epoch_last_of="peak_mem_reserved_mib_mean",
    ),
    Metric(
        "val_loss",
        (_EP,),
        "nats",
        "the epoch's last validation loss",
        _LAST,
        _RMEAN,
        _DOWN,
        epoch_last_of="val_loss",
    ),
    Metric(
        "val_ppl",
        (_EP,),
        "",
        "the epoch's last validation perplexity",
        _LAST,
        _RMEAN,
        _DOWN,
        epoch_last_of="val_ppl",
    ),
    # summary.json "total"
    Metric("train_time_s", (_TOT,), "s", "training time, optimizer steps only", _SUM, _MAIN, _DOWN, margin=TIME_MARGIN),
    Metric("eval_time_s", (_TOT,), "s", "time spent validating", _SUM, _MAIN, _DOWN),
    Metric(
        "checkpoint_time_s",
        (_TOT,),
        "s",
        "time training was paused for checkpoints (summary.json checkpoint_saves: blocked_s, per save)",
        _SUM,
        _MAIN,
        _DOWN,
    ),
    Metric("wall_time_s", (_TOT,), "s", "wall time of the whole run", _SUM, _MAIN, _DOWN),
    Metric("warmup_time_s", (_TOT,), "s", "time of the warm-up steps", _SUM, _MAIN),
    Metric(
        "tokens_per_s",
        (_TOT,),
        "tokens/s",
        "tokens trained / training time, whole job",
        _RATE,
        _JOB,
        _UP,
        margin=TIME_MARGIN,
    ),
    Metric("tokens_per_s_per_device", (_TOT,), "tokens/s", "the same / world size", _RATE, _PER_DEVICE, _UP),
    Metric(
        "tokens_per_s_excl_warmup",
        (_TOT,),
        "tokens/s",
        "tokens / time of the steps after the warm-up",
        _RATE,
        _JOB,
        _UP,
        excludes_warmup=True,
        margin=TIME_MARGIN,
    ),
    Metric(
        "tokens_per_s_per_device_excl_warmup",
        (_TOT,),
        "tokens/s",
        "tokens_per_s_excl_warmup / world size",
        _RATE,
        _PER_DEVICE,
        _UP,
        excludes_warmup=True,
    ),
    Metric("samples_per_s", (_TOT,), "samples/s", "sequences trained / training time", _RATE, _JOB, _UP),
    Metric("step_time_s_mean", (_TOT,), "s", "mean wall time of one optimizer step", _MEAN, _MAIN, _DOWN),
    Metric("step_time_s_p50", (_TOT,), "s", "median step time", _Q, _MAIN, _DOWN),
    Metric("step_time_s_p90", (_TOT,), "s", "90th percentile of the step time", _Q, _MAIN, _DOWN),
    Metric(
        "loss_mean",
        (_TOT,),
        "nats",
        "mean step loss, finite steps",
        _MEAN,
        _RMEAN,
        _DOWN,
        excludes_warmup=True,
        margin=LOSS_MARGIN,
    ),
    Metric(
        "loss_nonfinite_steps",
        (_TOT,),
        "steps",
        "steps left out of loss_mean: loss not finite",
        _SUM,
        _SAME,
        _DOWN,
        value_type=int,
    ),
    Metric("grad_norm_mean", (_TOT,), "", "mean gradient norm, finite steps", _MEAN, _SAME, excludes_warmup=True),
    Metric(
        "grad_norm_nonfinite_steps",
        (_TOT,),
        "steps",
        "steps left out of grad_norm_mean: norm not finite",
        _SUM,
        _SAME,
        _DOWN,
        value_type=int,
    ),
    Metric("skipped_steps", (_TOT,), "steps", "steps the fp16 grad scaler skipped", _SUM, _SAME, _DOWN, value_type=int),
    Metric("final_loss", (_TOT,), "nats", "the loss of the last step", _LAST, _RMEAN, _DOWN),
    Metric(
        "mfu",
        (_TOT,),
        "fraction",
        "model FLOPs utilisation per device, of the device's peak FLOP/s",
        _RATE,
        _PER_DEVICE,
        _UP,
        excludes_warmup=True,
    ),
    Metric(
        "peak_mem_allocated_mib_max",
        (_TOT,),
        "MiB",
        "peak allocated, max over epochs and ranks",
        _MAX,
        _RMAX,
        _DOWN,
        margin=MEMORY_MARGIN,
    ),
    Metric(
        "peak_mem_allocated_mib_mean",
        (_TOT,),
        "MiB",
        "peak allocated, mean over epochs of the rank mean",
        _MEAN,
        _RMEAN,
        _DOWN,
    ),
    Metric(
        "peak_mem_reserved_mib_max",
        (_TOT,),
        "MiB",
        "peak reserved, max over epochs and ranks",
        _MAX,
        _RMAX,
        _DOWN,
        margin=MEMORY_MARGIN,
    ),
    Metric(
        "peak_mem_reserved_mib_mean",
        (_TOT,),
        "MiB",
        "peak reserved, mean over epochs of the rank mean",
        _MEAN,
        _RMEAN,
        _DOWN,
    ),
    Metric("final_val_loss", (_TOT,), "nats", "the last validation loss", _LAST, _RMEAN, _DOWN, margin=LOSS_MARGIN),
    Metric("final_val_ppl", (_TOT,), "", "the last validation perplexity", _LAST, _RMEAN, _DOWN),
)


def in_scope(scope: Scope) -> tuple[Metric, ...]:
    """The metrics recorded in `scope`, in the files' order."""
    return tuple(m for m in METRICS if scope in m.scopes)


def metric(key: str, scope: Scope) -> Metric:
    """The declaration of `key` in `scope`; KeyError when the schema has none."""
    for candidate in in_scope(scope):
        if candidate.key == key:
            return candidate
    raise KeyError(f"{key!r} is not declared for {scope.value} in training/records/schema.py")


def wandb_history_keys() -> dict[str, str]:
    """metrics.jsonl key -> W&B history key, for both kinds of line (the sink maps a line by key alone)."""
    keys: dict[str, str] = {}
    for line_metric in METRICS:
        if line_metric.wandb_key is not None:
            keys[line_metric.key] = line_metric.wandb_key
    return keys


def unlogged_line_keys() -> tuple[str, ...]:
    """Keys of metrics.jsonl lines that the W&B history does not get."""
    return tuple(m.key for m in METRICS if LINE_SCOPES & set(m.scopes) and m.wandb_key is None)


def only_in(scope: Scope, others: Iterable[Scope]) -> tuple[str, ...]:
    """Keys of `scope` that none of `others` records, e.g. what only an eval line holds."""
    elsewhere = {m.key for other in others for m in in_scope(other)}
    return tuple(m.key for m in in_scope(scope) if m.key not in elsewhere)


def _check_schema() -> None:
    """A key declared twice in one scope, or two keys sharing a W&B key, would make lookups ambiguous;
    an epoch figure taken from a line key the lines do not hold would be rebuilt empty."""
    seen: set[tuple[str, Scope]] = set()
    for declared in METRICS:
        for scope in declared.scopes:
            if (declared.key, scope) in seen:
                raise ValueError(f"{declared.key!r} is declared twice for {scope.value}")
            seen.add((declared.key, scope))
    line_keys = {m.key for m in METRICS if LINE_SCOPES & set(m.scopes)}
    for declared in METRICS:
        if declared.epoch_last_of is not None and declared.epoch_last_of not in line_keys:
            raise ValueError(f"{declared.key}: {declared.epoch_last_of!r} is not a metrics.jsonl line key")
    wandb_keys = [m.wandb_key for m in METRICS if m.wandb_key is not None]
    if len(wandb_keys) != len(set(wandb_keys)):
        raise ValueError("two metrics share a W&B key")


_check_schema()


# ---------------------------------------------------------------------------------------------
# The figures other modules name. Their keys are spelled as strings here and in the one writer
# (training/records/metrics.py) only; tests/test_structure.py holds every other module to these names.

# train lines
LINE_TOKENS = metric("tokens", _T)
LINE_LOSS = metric("loss", _T)
LINE_GRAD_NORM = metric("grad_norm", _T)
LINE_STEP_TIME = metric("step_time_s", _T)
LINE_THROUGHPUT = metric("tokens_per_s", _T)
LINE_SAMPLES_PER_S = metric("samples_per_s", _T)
LINE_PEAK_ALLOCATED = metric("peak_mem_allocated_mib", _T)
LINE_PEAK_RESERVED = metric("peak_mem_reserved_mib", _T)
ELAPSED = metric("elapsed_s", _T)
# eval lines
VAL_LOSS = metric("val_loss", _E)
# summary.json "epochs"
EPOCH_TIME = metric("time_s", _EP)
EPOCH_LOSS = metric("loss_mean", _EP)
EPOCH_GRAD_NORM = metric("grad_norm_mean", _EP)
EPOCH_THROUGHPUT = metric("tokens_per_s", _EP)
EPOCH_THROUGHPUT_PER_DEVICE = metric("tokens_per_s_per_device", _EP)
EPOCH_PEAK_ALLOCATED = metric("peak_mem_allocated_mib_max", _EP)
EPOCH_PEAK_RESERVED = metric("peak_mem_reserved_mib_max", _EP)
EPOCH_VAL_LOSS = metric("val_loss", _EP)
# summary.json "total"
TRAIN_TIME = metric("train_time_s", _TOT)
THROUGHPUT = metric("tokens_per_s", _TOT)
THROUGHPUT_PER_DEVICE = metric("tokens_per_s_per_device", _TOT)
THROUGHPUT_EXCL_WARMUP = metric("tokens_per_s_excl_warmup", _TOT)
THROUGHPUT_PER_DEVICE_EXCL_WARMUP = metric("tokens_per_s_per_device_excl_warmup", _TOT)
LOSS_MEAN = metric("loss_mean", _TOT)
GRAD_NORM_MEAN = metric("grad_norm_mean", _TOT)
FINAL_LOSS = metric("final_loss", _TOT)
MFU = metric("mfu", _TOT)
PEAK_ALLOCATED = metric("peak_mem_allocated_mib_max", _TOT)
PEAK_ALLOCATED_MEAN = metric("peak_mem_allocated_mib_mean", _TOT)
PEAK_RESERVED = metric("peak_mem_reserved_mib_max", _TOT)
FINAL_VAL_LOSS = metric("final_val_loss", _TOT)


# ---------------------------------------------------------------------------------------------
# The comparison table's columns (analysis/table.py), by the whole-run figures they show


@dataclass(frozen=True)
class TableColumn:
    """A whole-run figure as the comparison table shows it; the header's unit is the metric's."""

    metric: Metric
    label: str  # the header without its unit
    decimals: int  # in the markdown and HTML table; the CSV keeps every digit
    percent: bool = False  # a fraction shown times 100, with "%" as its unit

    def __post_init__(self) -> None:
        if Scope.TOTAL not in self.metric.scopes:
            raise ValueError(f"{self.metric.key}: the comparison table shows whole-run figures only")

    @property
    def header(self) -> str:
        """The label followed by the unit."""
        unit = "%" if self.percent else self.metric.unit
        return f"{self.label} ({unit})" if unit else self.label


# In the table's order, after the run's identity and before the facts that make runs comparable.
TABLE: tuple[TableColumn, ...] = (
    TableColumn(LOSS_MEAN, "avg loss", 4),
    TableColumn(FINAL_VAL_LOSS, "final val loss", 4),
    TableColumn(GRAD_NORM_MEAN, "avg grad norm", 3),
    TableColumn(TRAIN_TIME, "total training time", 1),
    TableColumn(PEAK_ALLOCATED, "peak allocated, max over devices", 0),
    TableColumn(PEAK_RESERVED, "peak reserved, max over devices", 0),
    TableColumn(PEAK_ALLOCATED_MEAN, "peak allocated, mean over devices", 0),
    TableColumn(THROUGHPUT, "throughput, total", 0),
    TableColumn(THROUGHPUT_PER_DEVICE, "throughput, per device", 0),
    TableColumn(THROUGHPUT_EXCL_WARMUP, "throughput excl. warm-up, total", 0),
    TableColumn(MFU, "MFU", 2, percent=True),
)


# ---------------------------------------------------------------------------------------------
# The W&B report's panels, in terms of the schema (analysis/wandb_report.py lays them out)


@dataclass(frozen=True)
class Curve:
    """A line plot of train or eval line metrics against X_AXIS."""

    title: str
    metrics: tuple[Metric, ...]
    y_title: str

    def __post_init__(self) -> None:
        if any(m.wandb_key is None for m in self.metrics):
            raise ValueError(f"{self.title}: a curve plots metrics logged to the W&B history")


@dataclass(frozen=True)
class Bars:
    """A bar chart of whole-run figures, read from the W&B run summary."""

    title: str
    metrics: tuple[Metric, ...]
    y_title: str

    def __post_init__(self) -> None:
        if any(Scope.TOTAL not in m.scopes for m in self.metrics):
            raise ValueError(f"{self.title}: bars show whole-run figures")


# Every line plot runs against tokens trained (whole job): runs whose global batches differ line up
# at equal data seen, which steps would not.
X_AXIS, X_TITLE = LINE_TOKENS, "tokens trained (whole job)"
LOSS_Y, MEMORY_TITLE = "cross-entropy loss (nats)", "Peak memory per device, max over devices"
CURVES: tuple[Curve, ...] = (
    Curve("Training loss", (LINE_LOSS,), LOSS_Y),
    Curve("Validation loss", (VAL_LOSS,), LOSS_Y),
    Curve("Gradient norm (global L2, before clipping)", (LINE_GRAD_NORM,), "gradient norm"),
    Curve("Throughput, whole job (interval of logged steps)", (LINE_THROUGHPUT,), "tokens/s"),
    Curve(MEMORY_TITLE, (LINE_PEAK_ALLOCATED, LINE_PEAK_RESERVED), "MiB"),
)
BARS: tuple[Bars, ...] = (
    Bars("Total training time (optimizer steps only)", (TRAIN_TIME,), "s"),
    Bars("Throughput excluding warm-up steps, whole job", (THROUGHPUT_EXCL_WARMUP,), "tokens/s"),
    Bars("Throughput excluding warm-up steps, per device", (THROUGHPUT_PER_DEVICE_EXCL_WARMUP,), "tokens/s"),
    Bars(MEMORY_TITLE, (PEAK_ALLOCATED, PEAK_RESERVED), "MiB"),
    Bars("MFU, warm-up excluded (fraction of the device's peak FLOP/s)", (MFU,), "fraction (0.25 = 25%)"),
    Bars("Final loss", (FINAL_LOSS, FINAL_VAL_LOSS), LOSS_Y),
)
