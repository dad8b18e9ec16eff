"""Figures over repeated runs and the verdicts they allow: report.json (docs/statistics.md gives the rules).

The unit of replication is a run for what a repeat measures (time, throughput, memory) and a seed for the
losses: repeats of one seed train the same model, so they are averaged into one value per seed first.

A pair of strategies, a / b, on one figure:
- **values**: where every run of each side gives one value and the figure is a count (the step peak's bytes;
  on a CPU in fp32, the losses and the tokens to a target), the two values are compared as they are, at any
  number of runs: the ratio is exact. Repeats that all agree to the bit count as such too.
- **Welch**: otherwise, with two units or more a side, Welch's t-test of the mean logarithms (scipy.stats
  ttest_ind, unequal variances) with its 95% interval of the ratio of geometric means; p is Holm-adjusted
  over the figure's pairs.
- one unit on a side and nothing exact: the ratio only.

Status: **established** (the figure is higher or lower) when the adjusted p is below 5% and the ratio lies
outside the figure's practical margin (training/records/schema.py), or the exact ratio does; **equivalent** when
the whole 95% interval (or the exact ratio) lies inside the margin; **not established** otherwise, with the
units per strategy that would give 80% power at the spread these runs measured (or an assumed one, said so).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
from scipy import stats

from analysis.runs import Run, number, recorded
from analysis.scaling import ranked_throughput, throughput, throughput_name
from training.config import RunConfig
from training.records import schema as schema

CONFIDENCE = 0.95
SIGNIFICANCE = 0.05
POWER = 0.80
# Run-to-run spread (standard deviation of the logarithm) assumed where no strategy has two units to measure
# it: about what repeated T4 runs vary by (docs/statistics.md); the answer says when it is assumed.
ASSUMED_SPREAD = 0.05
MAX_UNITS = 100  # beyond this many runs per strategy the answer says "more than 100"

ESTABLISHED, EQUIVALENT, NOT_ESTABLISHED = "established", "equivalent", "not established"
HIGHER, LOWER = "higher", "lower"
EXACT, WELCH, ONE_UNIT = "exact values", "Welch t-test of the mean logarithms", "one unit on a side"
RUN, SEED = "run", "seed"
# A time to a target depends on the seed's loss curve and on the machine: one seed's repeats are runs, several
# seeds' repeats are averaged per seed, so the seeds' differences are never counted as many runs.
SEEDS_IF_SEVERAL = "seed, where a strategy has several"
POWER_TRIALS, POWER_SEED = 2000, 80

MIB = 2**20
# report.json's names of the figures; those that are a summary.json key are spelled by the run schema.
THROUGHPUT, STEP_PEAK, RESIDENT, RESERVED = (
    schema.THROUGHPUT.key,
    "step_peak_bytes",
    "peak_rss_mib",
    "peak_reserved_mib",
)
TRAIN_TIME, FINAL_VAL_LOSS, AVG_LOSS = schema.TRAIN_TIME.key, schema.FINAL_VAL_LOSS.key, "avg_loss"
TARGET_SECONDS, TARGET_TOKENS = "time_to_target_s", "tokens_to_target"


@dataclass(frozen=True)
class Figure:
    """A whole-run figure the report summarizes and compares across strategies."""

    name: str  # report.json's key
    title: str
    unit: str
    value: Callable[[Run], float | None]
    higher_is_better: bool
    margin: float  # the smallest relative difference that matters
    exact: bool = False  # a count: a run that repeats gives it to the bit
    replication: str = RUN  # RUN, SEED (a seed's repeats are one unit: a loss), or SEEDS_IF_SEVERAL
    every_run: bool = False  # a run without a value (never reached a target) leaves the strategy undecided
    timed: bool = False  # a time: where no strategy has two runs, ASSUMED_SPREAD stands in for its spread


@dataclass(frozen=True)
class Summary:
    """One figure of one strategy over its units."""

    runs: int
    units: int  # runs, or seeds for a per-seed figure
    centre: float  # the geometric mean over units (the plain mean where a value is not positive)
    minimum: float
    maximum: float
    ci95: tuple[float, float] | None  # the t-interval of the mean logarithm; None below two units
    exact: bool  # every unit gave one value of a count
    missing: int = 0  # runs without a value

    def to_dict(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "units": self.units,
            "centre": self.centre,
            "min": self.minimum,
            "max": self.maximum,
            "ci95": list(self.ci95) if self.ci95 else None,
            "exact": self.exact,
            "missing": self.missing,
        }


@dataclass(frozen=True)
class Comparison:
    """figure of strategy a / figure of strategy b, and what it establishes."""

    figure: str
    a: str
    b: str
    units_a: int
    units_b: int
    ratio: float
    ci95: tuple[float, float] | None
    method: str
    p_value: float | None = None
    p_adjusted: float | None = None
    status: str = NOT_ESTABLISHED
    direction: str | None = None  # higher / lower: a's figure against b's, when established
    units_needed: int | None = None  # per strategy for 80% power, when not established and outside the margin
    spread: float | None = None  # the run-to-run spread units_needed assumes (sd of the logarithm)
    spread_measured: bool = False
    reason: str = ""  # why nothing could be tested, when that is so

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["ci95"] = list(self.ci95) if self.ci95 else None
        return out


# ---------------------------------------------------------------------------------------------
# Units of one strategy


def group_by_strategy(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """Runs by Run.arm (the strategy, or its label in an A/A experiment), in the order of their first run."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.arm, []).append(run)
    return groups


def units(figure: Figure, runs: Sequence[Run]) -> np.ndarray:
    """The figure's finite values, one per run, or one per seed (the mean of its repeats) for a per-seed figure."""
    seeds = {run.fact("seed") for run in runs}
    per_seed = figure.replication == SEED or (figure.replication == SEEDS_IF_SEVERAL and len(seeds) > 1)
    by_unit: dict[Any, list[float]] = {}
    for index, run in enumerate(runs):
        value = figure.value(run)
        if value is not None and math.isfinite(value):
            by_unit.setdefault(run.fact("seed") if per_seed else index, []).append(value)
    # Sorted: the same runs give the same figures to the bit, whatever their folders' names or order.
    return np.sort(np.asarray([math.fsum(v) / len(v) for v in by_unit.values()], dtype=float))


def _log_centre(values: np.ndarray) -> tuple[float, np.ndarray | None]:
    if (values > 0).all():
        logs = np.log(values)
        return math.exp(float(logs.mean())), logs
    return float(values.mean()), None


def summarize(figure: Figure, runs: Sequence[Run]) -> Summary | None:
    values = units(figure, runs)
    if values.size == 0:
        return None
    centre, logs = _log_centre(values)
    constant = bool(np.ptp(values) == 0)
    missing = sum(figure.value(run) is None for run in runs)
    if constant:
        centre = float(values[0])
    interval = None
    if constant and (figure.exact or values.size > 1):
        interval = (centre, centre)
    elif values.size > 1:
        spread = logs if logs is not None else values
        half = float(stats.t.ppf((1 + CONFIDENCE) / 2, spread.size - 1) * stats.sem(spread))
        interval = (
            (centre * math.exp(-half), centre * math.exp(half)) if logs is not None else (centre - half, centre + half)
        )
    exact = constant and figure.exact
    return Summary(
        len(runs), int(values.size), centre, float(values.min()), float(values.max()), interval, exact, missing
    )


# ---------------------------------------------------------------------------------------------
# Two strategies


def inside(ratio: float, margin: float) -> bool:
    """Whether `ratio` lies within the practical margin of 1 either way round (1.02 and 1 / 1.02)."""
    return ratio > 0 and abs(math.log(ratio)) <= math.log1p(margin) * (1 + 1e-12)


def compare_units(figure: Figure, a: str, x: np.ndarray, b: str, y: np.ndarray) -> Comparison | None:
    """a / b on one figure, before the correction over the figure's pairs. None without a positive value."""
    x, y = x[x > 0], y[y > 0]
    if x.size == 0 or y.size == 0:
        return None
    constant = np.ptp(x) == 0 and np.ptp(y) == 0
    if constant and figure.exact:
        return _exact(figure, a, x, b, y)
    ratio = math.exp(float(np.log(x).mean() - np.log(y).mean()))
    if min(x.size, y.size) < 2:
        return Comparison(figure.name, a, b, x.size, y.size, ratio, None, ONE_UNIT)
    if constant:  # two runs that agree by chance (a rounded figure) are no evidence of no spread
        why = "every run gave one value of a figure that is not a count: no spread to test"
        return Comparison(figure.name, a, b, x.size, y.size, ratio, None, ONE_UNIT, reason=why)
    welch = stats.ttest_ind(np.log(x), np.log(y), equal_var=False)
    low, high = welch.confidence_interval(CONFIDENCE)
    ci = (math.exp(float(low)), math.exp(float(high)))
    p = float(welch.pvalue)
    return Comparison(figure.name, a, b, x.size, y.size, ratio, ci, WELCH, p, p)


def _exact(figure: Figure, a: str, x: np.ndarray, b: str, y: np.ndarray) -> Comparison:
    """A count every unit of each side repeats, compared on its values. A loss of one seed a side says what
    that seed did: equal within the margin is equivalent, a gap is not yet the strategy's."""
    ratio = float(x[0] / y[0])
    c = Comparison(figure.name, a, b, x.size, y.size, ratio, (ratio, ratio), EXACT)
    if inside(ratio, figure.margin):
        return replace(c, status=EQUIVALENT)
    if figure.replication != RUN and min(x.size, y.size) < 2:
        return replace(c, reason="one seed a side: a gap at one seed is not yet the strategy's (`--seeds`)")
    return replace(c, status=ESTABLISHED, direction=HIGHER if ratio > 1 else LOWER)


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of the p-values present (None stays None): the family's chance of any false
    verdict stays at most the level, whichever pairs really differ."""
    present = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    adjusted: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(present):
        running = max(running, min(1.0, (len(present) - rank) * p))
        adjusted[i] = running
    return adjusted


def decided(
    comparison: Comparison, p_adjusted: float | None, figure: Figure, spread: tuple[float, bool] | None, pairs: int
) -> Comparison:
    """The comparison's status from its adjusted p, interval and margin; when not established, the units per
    strategy that would establish a ratio this far from 1 (`spread` None: nothing to work it out from)."""
    if comparison.method == EXACT or comparison.reason:
        return comparison
    ci = comparison.ci95
    if ci is not None and inside(ci[0], figure.margin) and inside(ci[1], figure.margin):
        return replace(comparison, p_adjusted=p_adjusted, status=EQUIVALENT)
    if p_adjusted is not None and p_adjusted < SIGNIFICANCE and not inside(comparison.ratio, figure.margin):
        direction = HIGHER if comparison.ratio > 1 else LOWER
        return replace(comparison, p_adjusted=p_adjusted, status=ESTABLISHED, direction=direction)
    if spread is None or inside(comparison.ratio, figure.margin):
        return replace(comparison, p_adjusted=p_adjusted)
    sigma, measured = spread
    needed = units_for_power(comparison.ratio, sigma, pairs, figure.margin)
    return replace(comparison, p_adjusted=p_adjusted, units_needed=needed, spread=sigma, spread_measured=measured)


def run_spread(figure: Figure, groups: dict[str, list[Run]]) -> tuple[float, bool] | None:
    """The pooled standard deviation of the logarithm over every strategy with two units or more, and whether
    it was measured (False: none had two and ASSUMED_SPREAD stands in, for a time only; None otherwise)."""
    squares, dof = 0.0, 0
    for runs in groups.values():
        values = units(figure, runs)
        values = values[values > 0]
        if values.size > 1:
            logs = np.log(values)
            squares += float(((logs - logs.mean()) ** 2).sum())
            dof += values.size - 1
    if dof:
        return math.sqrt(squares / dof), True
    return (ASSUMED_SPREAD, False) if figure.timed else None


def units_for_power(ratio: float, spread: float, pairs: int = 1, margin: float = 0.0) -> int | None:
    """Units per strategy at which the report establishes a true `ratio` in POWER of experiments, when units
    vary by `spread` (sd of the logarithm): simulated, Welch's test at 5% / `pairs` (the first step of Holm's
    correction over the figure's pairs, so Holm does at least as well) and the estimate outside the margin.
    None beyond MAX_UNITS or for a ratio inside the margin."""
    gap = abs(math.log(ratio))
    if gap <= math.log1p(margin):
        return None
    if spread == 0:
        return 2
    alpha = SIGNIFICANCE / pairs
    # The normal approximation needs fewer units than Welch's t (z < t) and no margin: a floor. Power grows
    # with n, so gallop up from it and halve back to the fewest units that reach POWER.
    normal = 2 * ((stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(POWER)) * spread / gap) ** 2
    low = max(2, math.floor(normal))
    if low > MAX_UNITS:
        return None
    high = low
    while simulated_power(high, gap, spread, alpha, margin) < POWER:
        if high == MAX_UNITS:
            return None
        low, high = high + 1, min(MAX_UNITS, 2 * high)
    while low < high:
        middle = (low + high) // 2
        low, high = (
            (low, middle) if simulated_power(middle, gap, spread, alpha, margin) >= POWER else (middle + 1, high)
        )
    return high


def simulated_power(n: int, gap: float, spread: float, alpha: float, margin: float) -> float:
    """The share of POWER_TRIALS experiments of n normal log-units a side, `gap` apart, that Welch's test at
    `alpha` with the estimate outside the margin calls different (a fixed seed per n: the same answer always)."""
    rng = np.random.default_rng([POWER_SEED, n])
    x = rng.normal(gap, spread, (POWER_TRIALS, n))
    y = rng.normal(0.0, spread, (POWER_TRIALS, n))
    p = stats.ttest_ind(x, y, axis=1, equal_var=False).pvalue
    return float(((p < alpha) & (np.abs(x.mean(axis=1) - y.mean(axis=1)) > math.log1p(margin))).mean())


def compare_figure(figure: Figure, groups: dict[str, list[Run]], advise: bool = True) -> list[Comparison]:
    """Every pair of strategies (a before b in table order) on one figure, Holm-adjusted over the pairs;
    `advise`: work out the units that would establish each pair not established."""
    values = {name: units(figure, runs) for name, runs in groups.items()}
    names = [name for name in groups if values[name].size]
    raw = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if figure.every_run and (reason := _unreached(figure, groups, a, b)):
                ratio = math.exp(float(np.log(values[a]).mean() - np.log(values[b]).mean()))
                raw.append(
                    Comparison(figure.name, a, b, values[a].size, values[b].size, ratio, None, ONE_UNIT, reason=reason)
                )
            elif (c := compare_units(figure, a, values[a], b, values[b])) is not None:
                raw.append(c)
    spread = run_spread(figure, groups) if advise else None
    return [decided(c, p, figure, spread, len(raw)) for c, p in zip(raw, holm([c.p_value for c in raw]))]


def _unreached(figure: Figure, groups: dict[str, list[Run]], a: str, b: str) -> str:
    missing = {name: sum(figure.value(run) is None for run in groups[name]) for name in (a, b)}
    return "; ".join(
        f"{count} of {len(groups[name])} runs of {name} never reached it" for name, count in missing.items() if count
    )


# ---------------------------------------------------------------------------------------------
# The figures of runs


def step_peak_bytes(run: Run) -> float | None:
    """The live-tensor peak of the probe step, max over ranks (summary.json memory.step_peak_bytes); on a GPU
    without that record, the epochs' torch.cuda max allocated, which is the same quantity."""
    memory = run.fact("memory") or {}
    ranks = [v for v in (number(x) for x in memory.get("step_peak_bytes") or []) if v is not None]
    if ranks:
        return max(ranks)
    allocated = recorded(run.total, schema.PEAK_ALLOCATED)
    return allocated * MIB if allocated is not None and run.fact("device_type") != "cpu" else None


def reproducible(runs: Sequence[Run]) -> bool:
    """Whether a run's losses repeat to the bit: fp32 on a CPU (GPU kernels and reduced precision need not)."""
    return bool(runs) and all(run.fact("device_type") == "cpu" and run.fact("precision") == "fp32" for run in runs)


def _total(metric: schema.Metric) -> Callable[[Run], float | None]:
    return lambda run: recorded(run.total, metric)


def run_figures(runs: Sequence[Run], target: float | None = None) -> list[Figure]:
    """The figures of report.json; the memory beside the step peak is the process's resident set on CPU."""
    key = ranked_throughput(list(runs))
    cpu = bool(runs) and all(run.fact("device_type") == "cpu" for run in runs)
    losses_exact = reproducible(runs)
    beside = schema.PEAK_ALLOCATED if cpu else schema.PEAK_RESERVED
    figures = [
        Figure(
            THROUGHPUT,
            f"throughput ({throughput_name(key)})",
            "tokens/s",
            lambda run: throughput(run, key),
            True,
            key.margin or 0.0,
            timed=True,
        ),
        Figure(
            STEP_PEAK,
            "live-tensor step peak (per device, max over devices)",
            "bytes",
            step_peak_bytes,
            False,
            schema.STEP_PEAK_MARGIN,
            exact=True,
        ),
        Figure(
            RESIDENT if cpu else RESERVED,
            "peak resident set size (per process)" if cpu else "peak memory reserved (per device)",
            "MiB",
            _total(beside),
            False,
            beside.margin or 0.0,
        ),
        Figure(TRAIN_TIME, "training time", "s", _total(schema.TRAIN_TIME), False, schema.TIME_MARGIN, timed=True),
        Figure(
            FINAL_VAL_LOSS,
            "final validation loss",
            "nats",
            _total(schema.FINAL_VAL_LOSS),
            False,
            schema.LOSS_MARGIN,
            losses_exact,
            replication=SEED,
        ),
        Figure(
            AVG_LOSS,
            "mean training loss",
            "nats",
            _total(schema.LOSS_MEAN),
            False,
            schema.LOSS_MARGIN,
            losses_exact,
            replication=SEED,
        ),
    ]
    return figures + ([] if target is None else target_figures(target, losses_exact))


def target_figures(target: float, exact: bool) -> list[Figure]:
    """The training time and the tokens to a validation loss: a run that never reached it leaves its strategy
    undecided (every_run); the tokens are a count where the losses are."""
    return [
        Figure(
            TARGET_SECONDS,
            f"training time to validation loss {target:g}",
            "s",
            lambda run: _at_target(run, target, 0),
            False,
            schema.TARGET_MARGIN,
            replication=SEEDS_IF_SEVERAL,
            every_run=True,
            timed=True,
        ),
        Figure(
            TARGET_TOKENS,
            f"tokens to validation loss {target:g}",
            "tokens",
            lambda run: _at_target(run, target, 1),
            False,
            schema.TARGET_MARGIN,
            exact,
            replication=SEED,
            every_run=True,
        ),
    ]


def warmup_steps(run: Run) -> int:
    """The run's --perf_warmup_steps as config.json records it, train.py's default otherwise."""
    recorded_steps = ((run.config or {}).get("run") or {}).get("perf_warmup_steps")
    if isinstance(recorded_steps, int) and not isinstance(recorded_steps, bool) and recorded_steps >= 0:
        return recorded_steps
    return next(f.default for f in fields(RunConfig) if f.name == "perf_warmup_steps")


# ---------------------------------------------------------------------------------------------
# Time and tokens to a target validation loss


def _elapsed_at(run: Run) -> Callable[[float], float]:
    """Training time at a (fractional) step, linear between the logged train lines' elapsed_s."""
    points = sorted(
        {
            int(s): e
            for line in run.train
            if (s := number(line.step)) is not None and (e := number(line.elapsed_s)) is not None
        }.items()
    )
    steps, elapsed = [0.0, *(float(s) for s, _ in points)], [0.0, *(e for _, e in points)]
    return lambda step: float(np.interp(step, steps, elapsed))


def _eval_points(run: Run) -> list[tuple[float, float, float]]:
    """(step, tokens, val_loss) of each evaluation, in step order; a resumed run's repeat keeps the later line."""
    points: dict[float, tuple[float, float]] = {}
    for line in run.evals:
        step, tokens, loss = number(line.step), number(line.tokens), number(line.val_loss)
        if step is not None and tokens is not None and loss is not None and math.isfinite(loss):
            points[step] = (tokens, loss)
    return [(step, *points[step]) for step in sorted(points)]


def time_to_target(run: Run, target: float) -> tuple[float, float] | None:
    """(training seconds, tokens) where the validation loss first reaches `target`, linear between the two
    evaluations around it; at the first evaluation when that already reaches it. None when it never does."""
    previous: tuple[float, float, float] | None = None
    for step, tokens, loss in _eval_points(run):
        if loss <= target:
            fraction = 1.0 if previous is None or previous[2] == loss else (previous[2] - target) / (previous[2] - loss)
            start_step, start_tokens = (step, tokens) if previous is None else previous[:2]
            return _elapsed_at(run)(start_step + fraction * (step - start_step)), start_tokens + fraction * (
                tokens - start_tokens
            )
        previous = (step, tokens, loss)
    return None


def _at_target(run: Run, target: float, index: int) -> float | None:
    point = time_to_target(run, target)
    return None if point is None else point[index]


# ---------------------------------------------------------------------------------------------
# Everything report.json holds


@dataclass(frozen=True)
class Statistics:
    figures: list[Figure]
    summaries: dict[str, dict[str, Summary]]  # figure -> strategy -> summary
    comparisons: list[Comparison]  # every pair of strategies (a before b in table order), every figure
    target_loss: float | None = None
    devices: dict[str, int] | None = None  # strategy -> devices per run, for the cost to the target
    price: float | None = None

    def comparison(self, figure: str, a: str, b: str) -> Comparison | None:
        """a / b, read off the stored pair in whichever order it was stored."""
        for item in self.comparisons:
            if item.figure == figure and (item.a, item.b) == (a, b):
                return item
            if item.figure == figure and (item.a, item.b) == (b, a):
                return inverted(item)
        return None

    def to_dict(self) -> dict[str, Any]:
        """report.json (docs/statistics.md describes its shape)."""
        figures = {
            f.name: {
                "title": f.title,
                "unit": f.unit,
                "higher_is_better": f.higher_is_better,
                "margin": f.margin,
                "unit_of_replication": f.replication,
                "strategies": {name: s.to_dict() for name, s in self.summaries.get(f.name, {}).items()},
            }
            for f in self.figures
            if self.summaries.get(f.name)
        }
        out = {"version": 2, "figures": figures, "comparisons": [c.to_dict() for c in self.comparisons]}
        if self.target_loss is not None:
            out["target_loss"] = self.target_loss
            out["price_per_device_hour"] = self.price
            out["devices"] = self.devices
        return json_ready(out)


def inverted(c: Comparison) -> Comparison:
    """b / a: the same evidence read the other way round."""
    ci = None if c.ci95 is None else (1 / c.ci95[1], 1 / c.ci95[0])
    flipped = {HIGHER: LOWER, LOWER: HIGHER}.get(c.direction or "", c.direction)
    return replace(c, a=c.b, b=c.a, units_a=c.units_b, units_b=c.units_a, ratio=1 / c.ratio, ci95=ci, direction=flipped)


def json_ready(value: Any) -> Any:
    """`value` with every non-finite float as None: JSON has no nan or inf, and a reader must not meet them."""
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def build_statistics(runs: Sequence[Run], target_loss: float | None = None, price: float | None = None) -> Statistics:
    """Every figure of every strategy and every pair's comparison; with a target, the time and tokens to it."""
    groups = group_by_strategy(runs)
    figures = run_figures(runs, target_loss)
    summaries: dict[str, dict[str, Summary]] = {}
    comparisons: list[Comparison] = []
    for figure in figures:
        by_strategy = {name: s for name, members in groups.items() if (s := summarize(figure, members)) is not None}
        if by_strategy:
            summaries[figure.name] = by_strategy
            comparisons += compare_figure(figure, groups)
    devices = {name: int(members[0].fact("world_size") or 1) for name, members in groups.items()}
    return Statistics(figures, summaries, comparisons, target_loss, devices, price)
