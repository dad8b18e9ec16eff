"""The metrics table: every metric a run records, declared once.

Each entry names a metrics.jsonl or summary.json key and says what it is: its unit, where it is
recorded (a train line, an eval line, an epoch of summary.json, the whole run), whether warm-up steps
are left out, the W&B key its lines are logged under, and the comparison-table column it fills. The
W&B sink (training/sinks.py), the comparison table (analysis/table.py), the W&B report's panels
(analysis/wandb_report.py) and the W&B fetch (analysis/wandb_fetch.py) all read their names from
here, so a metric is renamed or added in one place. Torch-free: the report tools import it.

Declaring a metric here does not make training record it: the keys are those training/metrics.py and
training/loop.py write, and tests/test_metric_table.py checks the table against real run directories.
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


LINE_SCOPES = frozenset({Scope.TRAIN, Scope.EVAL})
# metrics.jsonl says which kind of line it is under this key; it is the line's type, not a metric.
LINE_KIND_KEY = "kind"
# summary.json's whole-run figures go to the W&B run summary under this prefix.
WANDB_SUMMARY_PREFIX = "total/"


@dataclass(frozen=True)
class Column:
    """How a whole-run figure is shown in the comparison table; the header's unit is the metric's."""

    label: str  # the header without its unit
    decimals: int  # in the markdown and HTML table; the CSV keeps every digit
    percent: bool = False  # a fraction shown times 100, with "%" as its unit


@dataclass(frozen=True)
class Metric:
    key: str  # as metrics.jsonl / summary.json spell it
    scopes: tuple[Scope, ...]  # several only where the key means the same thing in each
    unit: str  # "" for a pure number (a count of nothing in particular, a norm, a ratio)
    description: str
    wandb_key: str | None = None  # the W&B history key of a line metric; None: not logged to the history
    column: Column | None = None  # whole-run figures only: its comparison-table column
    excludes_warmup: bool = False  # the first --perf_warmup_steps steps are left out
    # An epoch figure that is the epoch's last value of this line key: the W&B fetch rebuilds it so.
    epoch_last_of: str | None = None

    def __post_init__(self) -> None:
        # Caught at import, so a wrong declaration never reaches a run or a report.
        if self.epoch_last_of is not None and self.scopes != (Scope.EPOCH,):
            raise ValueError(f"{self.key}: only an epoch figure is the last value of a line key")
        if self.wandb_key is not None and not LINE_SCOPES & set(self.scopes):
            raise ValueError(f"{self.key}: only metrics.jsonl lines are logged to the W&B history")
        if self.column is not None and self.scopes != (Scope.TOTAL,):
            raise ValueError(f"{self.key}: the comparison table shows whole-run figures only")

    @property
    def wandb_summary_key(self) -> str:
        """The W&B run-summary key of a whole-run figure."""
        if Scope.TOTAL not in self.scopes:
            raise ValueError(f"{self.key} is not a whole-run figure")
        return wandb_summary_key(self.key)

    @property
    def header(self) -> str:
        """The comparison-table header: the column's label followed by its unit."""
        if self.column is None:
            raise ValueError(f"{self.key} has no comparison-table column")
        unit = "%" if self.column.percent else self.unit
        return f"{self.column.label} ({unit})" if unit else self.column.label


def wandb_summary_key(total_key: str) -> str:
    """The W&B run-summary key of a summary.json "total" figure."""
    return WANDB_SUMMARY_PREFIX + total_key


_T, _E, _EP, _TOT = Scope.TRAIN, Scope.EVAL, Scope.EPOCH, Scope.TOTAL
_PER_RANK = "max over ranks of torch.cuda.max_memory_"

# The order within a scope is the order the consumers show them in: eval lines rebuilt from W&B keep
# the eval keys in this order, and the comparison table's metric columns follow the "total" order.
# W&B panels group by the prefix before "/"; skipped_steps* were first logged without one and keep
# their names so that W&B history stays comparable.
METRICS: tuple[Metric, ...] = (
    # metrics.jsonl, both kinds of line
    Metric("step", (_T, _E), "steps", "optimizer steps completed (1-based); W&B's own step axis"),
    Metric("epoch", (_T, _E, _EP), "", "epoch of this step, validation or summary entry (1-based)", "train/epoch"),
    Metric("tokens", (_T, _E), "tokens", "tokens trained so far, whole job (cumulative)", "train/tokens"),
    # metrics.jsonl, train lines
    Metric(
        "loss", (_T,), "nats", "mean next-token cross-entropy of this step, all ranks and micro-steps", "train/loss"
    ),
    Metric("loss_interval", (_T,), "nats", "the step loss averaged over the interval's steps", "train/loss_interval"),
    Metric("grad_norm", (_T,), "", "global L2 norm of all gradients of this step, before clipping", "train/grad_norm"),
    Metric("lr", (_T,), "", "learning rate used for this step", "train/lr"),
    Metric("step_time_s", (_T,), "s", "mean wall time of one optimizer step over the interval", "time/step_time_s"),
    Metric(
        "tokens_per_s", (_T,), "tokens/s", "tokens of the interval / its measured time, whole job", "perf/tokens_per_s"
    ),
    Metric("tokens_per_s_per_device", (_T,), "tokens/s", "tokens_per_s / world size", "perf/tokens_per_s_per_device"),
    Metric("samples_per_s", (_T,), "samples/s", "sequences of the interval / its measured time", "perf/samples_per_s"),
    Metric("mfu", (_T,), "fraction", "model FLOPs utilisation of the interval, per device", "perf/mfu"),
    Metric(
        "peak_mem_allocated_mib",
        (_T,),
        "MiB",
        _PER_RANK + "allocated since the epoch started",
        "mem/peak_allocated_mib",
    ),
    Metric(
        "peak_mem_reserved_mib", (_T,), "MiB", _PER_RANK + "reserved since the epoch started", "mem/peak_reserved_mib"
    ),
    Metric(
        "peak_mem_allocated_mib_mean",
        (_T,),
        "MiB",
        "mean over ranks of the peak allocated",
        "mem/peak_allocated_mib_mean",
    ),
    Metric(
        "peak_mem_reserved_mib_mean", (_T,), "MiB", "mean over ranks of the peak reserved", "mem/peak_reserved_mib_mean"
    ),
    Metric("elapsed_s", (_T,), "s", "training time so far (steps only)", "time/elapsed_s"),
    Metric("skipped_steps", (_T,), "steps", "steps the fp16 grad scaler skipped so far", "skipped_steps"),
    Metric("skipped_steps_interval", (_T,), "steps", "the same, within the interval", "skipped_steps_interval"),
    # a flag, and W&B is given numbers only
    Metric("warmup", (_T,), "", "the interval lies within the first --perf_warmup_steps steps"),
    # metrics.jsonl, eval lines
    Metric("val_loss", (_E,), "nats", "cross-entropy over the --eval_blocks validation blocks", "val/loss"),
    Metric("val_ppl", (_E,), "", "exp(val_loss)", "val/ppl"),
    Metric("eval_time_s", (_E,), "s", "wall time of this validation", "time/eval_time_s"),
    # summary.json "epochs"; memory lines hold the peak since the epoch started, so the epoch's peak is
    # its last line's
    Metric("partial", (_EP,), "", "the step budget ended inside this epoch"),
    Metric("steps", (_EP,), "steps", "optimizer steps of the epoch"),
    Metric("tokens", (_EP,), "tokens", "tokens trained in the epoch, whole job"),
    Metric("loss_mean", (_EP,), "nats", "mean step loss of the epoch, finite steps", excludes_warmup=True),
    Metric("loss_nonfinite_steps", (_EP,), "steps", "steps left out of loss_mean: loss not finite"),
    Metric("grad_norm_mean", (_EP,), "", "mean gradient norm of the epoch, finite steps", excludes_warmup=True),
    Metric("grad_norm_nonfinite_steps", (_EP,), "steps", "steps left out of grad_norm_mean: norm not finite"),
    Metric("skipped_steps", (_EP,), "steps", "steps the fp16 grad scaler skipped in the epoch"),
    Metric("time_s", (_EP,), "s", "training time of the epoch (steps only)"),
    Metric("tokens_per_s", (_EP,), "tokens/s", "tokens of the epoch / its training time, whole job"),
    Metric("tokens_per_s_per_device", (_EP,), "tokens/s", "the same / world size"),
    Metric("samples_per_s", (_EP,), "samples/s", "sequences of the epoch / its training time"),
    Metric(
        "peak_mem_allocated_mib_max",
        (_EP,),
        "MiB",
        "peak allocated in the epoch, max over ranks",
        epoch_last_of="peak_mem_allocated_mib",
    ),
    Metric(
        "peak_mem_allocated_mib_mean",
        (_EP,),
        "MiB",
        "peak allocated in the epoch, mean over ranks",
        epoch_last_of="peak_mem_allocated_mib_mean",
    ),
    Metric(
        "peak_mem_reserved_mib_max",
        (_EP,),
        "MiB",
        "peak reserved in the epoch, max over ranks",
        epoch_last_of="peak_mem_reserved_mib",
    ),
    Metric(
        "peak_mem_reserved_mib_mean",
        (_EP,),
        "MiB",
        "peak reserved in the epoch, mean over ranks",
        epoch_last_of="peak_mem_reserved_mib_mean",
    ),
    Metric("val_loss", (_EP,), "nats", "the epoch's last validation loss", epoch_last_of="val_loss"),
    Metric("val_ppl", (_EP,), "", "the epoch's last validation perplexity", epoch_last_of="val_ppl"),
    # summary.json "total", with the comparison table's columns first, in its order
    Metric(
        "loss_mean", (_TOT,), "nats", "mean step loss, finite steps", column=Column("avg loss", 4), excludes_warmup=True
    ),
    Metric("final_val_loss", (_TOT,), "nats", "the last validation loss", column=Column("final val loss", 4)),
    Metric(
        "grad_norm_mean",
        (_TOT,),
        "",
        "mean gradient norm, finite steps",
        column=Column("avg grad norm", 3),
        excludes_warmup=True,
    ),
    Metric(
        "train_time_s", (_TOT,), "s", "training time, optimizer steps only", column=Column("total training time", 1)
    ),
    Metric(
        "peak_mem_allocated_mib_max",
        (_TOT,),
        "MiB",
        "peak allocated, max over epochs and ranks",
        column=Column("peak allocated, max over devices", 0),
    ),
    Metric(
        "peak_mem_reserved_mib_max",
        (_TOT,),
        "MiB",
        "peak reserved, max over epochs and ranks",
        column=Column("peak reserved, max over devices", 0),
    ),
    Metric(
        "peak_mem_allocated_mib_mean",
        (_TOT,),
        "MiB",
        "peak allocated, mean over epochs of the rank mean",
        column=Column("peak allocated, mean over devices", 0),
    ),
    Metric(
        "tokens_per_s",
        (_TOT,),
        "tokens/s",
        "tokens trained / training time, whole job",
        column=Column("throughput, total", 0),
    ),
    Metric(
        "tokens_per_s_per_device",
        (_TOT,),
        "tokens/s",
        "the same / world size",
        column=Column("throughput, per device", 0),
    ),
    Metric(
        "tokens_per_s_excl_warmup",
        (_TOT,),
        "tokens/s",
        "tokens / time of the steps after the warm-up",
        column=Column("throughput excl. warm-up, total", 0),
        excludes_warmup=True,
    ),
    Metric(
        "mfu",
        (_TOT,),
        "fraction",
        "model FLOPs utilisation per device, of the device's peak FLOP/s",
        column=Column("MFU", 2, percent=True),
        excludes_warmup=True,
    ),
    Metric("eval_time_s", (_TOT,), "s", "time spent validating"),
    Metric("checkpoint_time_s", (_TOT,), "s", "time spent saving checkpoints"),
    Metric("wall_time_s", (_TOT,), "s", "wall time of the whole run"),
    Metric("warmup_time_s", (_TOT,), "s", "time of the warm-up steps"),
    Metric(
        "tokens_per_s_per_device_excl_warmup",
        (_TOT,),
        "tokens/s",
        "tokens_per_s_excl_warmup / world size",
        excludes_warmup=True,
    ),
    Metric("samples_per_s", (_TOT,), "samples/s", "sequences trained / training time"),
    Metric("step_time_s_mean", (_TOT,), "s", "mean wall time of one optimizer step"),
    Metric("step_time_s_p50", (_TOT,), "s", "median step time"),
    Metric("step_time_s_p90", (_TOT,), "s", "90th percentile of the step time"),
    Metric("loss_nonfinite_steps", (_TOT,), "steps", "steps left out of loss_mean: loss not finite"),
    Metric("final_loss", (_TOT,), "nats", "the loss of the last step"),
    Metric("grad_norm_nonfinite_steps", (_TOT,), "steps", "steps left out of grad_norm_mean: norm not finite"),
    Metric("skipped_steps", (_TOT,), "steps", "steps the fp16 grad scaler skipped"),
    Metric("peak_mem_reserved_mib_mean", (_TOT,), "MiB", "peak reserved, mean over epochs of the rank mean"),
    Metric("final_val_ppl", (_TOT,), "", "the last validation perplexity"),
)


def in_scope(scope: Scope) -> tuple[Metric, ...]:
    """The metrics recorded in `scope`, in table order."""
    return tuple(m for m in METRICS if scope in m.scopes)


def metric(key: str, scope: Scope) -> Metric:
    """The declaration of `key` in `scope`; KeyError when the table has none."""
    for candidate in in_scope(scope):
        if candidate.key == key:
            return candidate
    raise KeyError(f"{key!r} is not declared for {scope.value} in training/metric_table.py")


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


def table_columns() -> tuple[Metric, ...]:
    """The whole-run figures the comparison table shows, in column order."""
    return tuple(m for m in in_scope(Scope.TOTAL) if m.column is not None)


def _check_table() -> None:
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


_check_table()


# ---------------------------------------------------------------------------------------------
# The W&B report's panels, in terms of the table (analysis/wandb_report.py lays them out)


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


def _line(key: str) -> Metric:
    """A metric of the train lines, or else of the eval lines (the W&B history holds both)."""
    try:
        return metric(key, Scope.TRAIN)
    except KeyError:
        return metric(key, Scope.EVAL)


def _total(*keys: str) -> tuple[Metric, ...]:
    return tuple(metric(key, Scope.TOTAL) for key in keys)


# Every line plot runs against tokens trained (whole job): runs whose global batches differ line up
# at equal data seen, which steps would not.
X_AXIS, X_TITLE = metric("tokens", Scope.TRAIN), "tokens trained (whole job)"
LOSS_Y, MEMORY_TITLE = "cross-entropy loss (nats)", "Peak memory per device, max over devices"
CURVES: tuple[Curve, ...] = (
    Curve("Training loss", (_line("loss"),), LOSS_Y),
    Curve("Validation loss", (_line("val_loss"),), LOSS_Y),
    Curve("Gradient norm (global L2, before clipping)", (_line("grad_norm"),), "gradient norm"),
    Curve("Throughput, whole job (interval of logged steps)", (_line("tokens_per_s"),), "tokens/s"),
    Curve(MEMORY_TITLE, (_line("peak_mem_allocated_mib"), _line("peak_mem_reserved_mib")), "MiB"),
)
BARS: tuple[Bars, ...] = (
    Bars("Total training time (optimizer steps only)", _total("train_time_s"), "s"),
    Bars("Throughput excluding warm-up steps, whole job", _total("tokens_per_s_excl_warmup"), "tokens/s"),
    Bars("Throughput excluding warm-up steps, per device", _total("tokens_per_s_per_device_excl_warmup"), "tokens/s"),
    Bars(MEMORY_TITLE, _total("peak_mem_allocated_mib_max", "peak_mem_reserved_mib_max"), "MiB"),
    Bars("MFU, warm-up excluded (fraction of the device's peak FLOP/s)", _total("mfu"), "fraction (0.25 = 25%)"),
    Bars("Final loss", _total("final_loss", "final_val_loss"), LOSS_Y),
)
