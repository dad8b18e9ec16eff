"""Figures with their uncertainty, and verdicts that are stated only outside the noise (docs/statistics.md).

Two sources of noise, two methods:
- across repeated runs of one strategy (the unit is a run, usually 2 to 5 of them): Student's t-interval
  of the mean logarithm, i.e. of the geometric mean, for figures that are positive (all the report's are:
  a throughput's interval cannot reach below zero), of the plain mean otherwise; for a pair of strategies
  Welch's t-interval of the difference of mean logarithms, i.e. the ratio of geometric means;
- within one run (its optimizer step times, dozens to thousands of them): a bootstrap of the median step
  time with a fixed seed, which a rare slow step (a pause, the memory probe) cannot drag.

A verdict (`higher`, `lower`) is stated only when the ratio's 95% interval excludes 1; otherwise it is
`no detectable difference`. With one run and no within-run distribution there is no interval: equal values
are `no detectable difference`, different ones `not enough runs`. Pure numpy, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from functools import lru_cache
from typing import Any

import numpy as np

from analysis.runs import Run, number, recorded
from analysis.scaling import ranked_throughput, throughput, throughput_name
from analysis.survival import Observation, log_rank, median_time
from training import run_schema as schema
from training.config import RunConfig

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 1993  # fixed, so the same records give the same interval (Efron & Tibshirani, 1993)
_BOOTSTRAP_CHUNK = 250  # resamples drawn at once: bounds memory for runs of many thousand steps

HIGHER, LOWER, SAME, TOO_FEW = "higher", "lower", "no detectable difference", "not enough runs"
# One run per side: its step times cannot see drift between runs, and the step-time bootstrap's false
# "higher"/"lower" rate is far above 5% once runs drift (`python -m analysis.calibration`).
NO_VERDICT = "one run each: no verdict"

# Run-to-run coefficient of variation of a throughput assumed when counting the repeats a verdict needs:
# docs/statistics.md's measured T4 jitter (about +-10%, sigma 5%).
RUN_SIGMA = 0.05
POWER = 0.80
MAX_REPEATS = 1000

T_INTERVAL = "t-interval of the mean over runs"
LOG_T_INTERVAL = "t-interval of the geometric mean over runs (log scale)"
WELCH_LOG_RATIO = "Welch t-interval of the ratio of geometric means over runs (log scale)"
STEP_BOOTSTRAP = "bootstrap of the median step time of one run"
ONE_RUN_EACH = "none (one run each: step times cannot see drift between runs)"
EXACT = "exact (a count with no run-to-run noise)"
SINGLE = "none (one run)"


@dataclass(frozen=True)
class Summary:
    """One figure of one strategy over its runs."""

    n: int  # runs
    median: float
    minimum: float
    maximum: float
    mean: float
    ci95: tuple[float, float] | None  # None: no interval can be computed (one run, no within-run samples)
    method: str
    geometric_mean: float | None = None  # the centre of a log-scale interval; None for a figure not all positive

    def to_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "median": self.median,
            "min": self.minimum,
            "max": self.maximum,
            "mean": self.mean,
            "geometric_mean": self.geometric_mean,
            "ci95": list(self.ci95) if self.ci95 is not None else None,
            "method": self.method,
        }


@dataclass(frozen=True)
class Ratio:
    """a / b with its 95% interval and the verdict it allows."""

    ratio: float
    ci95: tuple[float, float] | None
    verdict: str
    method: str


# ---------------------------------------------------------------------------------------------
# Student's t quantile (numpy has none, and scipy is not a dependency)


def t_quantile(probability: float, df: float) -> float:
    """The `probability` quantile (above 0.5) of Student's t with `df` degrees of freedom (may be fractional)."""
    # Rounded so that Welch's fractional degrees of freedom still hit the cache.
    return _t_quantile(probability, round(df, 3))


@lru_cache(maxsize=256)
def _t_quantile(probability: float, df: float) -> float:
    """Integrates the density numerically; accurate to about 1e-4 for df >= 1, enough for an interval.

    With x = sqrt(df) tan(theta) the t density becomes c cos(theta)^(df - 1) on [0, pi/2): smooth and bounded
    for df >= 1, so a few thousand points integrate it (a calibration asks for thousands of Welch quantiles).
    """
    if df <= 0 or not 0.5 < probability < 1:
        raise ValueError(f"t_quantile needs df > 0 and 0.5 < p < 1, got df={df}, p={probability}")
    if df > 1e4:
        df = 1e4  # the t is a normal by then; larger df only costs precision in the constant
    if df < 1:
        return _t_quantile_heavy(probability, df)
    log_constant = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(math.pi)
    theta = np.linspace(0.0, math.pi / 2, 8_001)
    with np.errstate(divide="ignore"):  # cos(pi / 2) rounds to about 6e-17, never 0; the guard is for safety
        density = np.exp(log_constant + (df - 1) * np.log(np.cos(theta)))
    cumulative = 0.5 + np.concatenate(([0.0], np.cumsum((density[1:] + density[:-1]) / 2 * np.diff(theta))))
    return float(math.sqrt(df) * math.tan(float(np.interp(probability, cumulative, theta))))


def _t_quantile_heavy(probability: float, df: float) -> float:
    """df < 1, where the transformed density is unbounded at pi/2: the density on a wide grid instead."""
    log_constant = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    grid = np.linspace(0.0, 400.0, 100_001)
    density = np.exp(log_constant - (df + 1) / 2 * np.log1p(grid**2 / df))
    cumulative = 0.5 + np.concatenate(([0.0], np.cumsum((density[1:] + density[:-1]) / 2 * np.diff(grid))))
    return float(np.interp(probability, cumulative, grid))


# ---------------------------------------------------------------------------------------------
# One strategy's figure


def _finite(values: Sequence[float]) -> np.ndarray:
    array = np.asarray([float(v) for v in values], dtype=float)
    return array[np.isfinite(array)]


def summarize(values: Sequence[float], exact: bool = False) -> Summary | None:
    """n, median, min, max and the 95% t-interval of one strategy's runs; None without values.

    Positive figures get the interval of the mean logarithm, taken back with exp: the geometric mean's, the
    scale on which strategies are compared (ratio_over_runs), and never below zero however widely a few
    runs spread. `exact`: the figure is a count with no run-to-run noise, so one run's interval is its value.
    """
    data = _finite(values)
    if data.size == 0:
        return None
    positive = bool((data > 0).all())
    logs = np.log(data) if positive else None
    geometric = math.exp(float(logs.mean())) if logs is not None else None
    if data.size == 1:
        value = float(data[0])
        return Summary(
            1,
            value,
            value,
            value,
            value,
            (value, value) if exact else None,
            EXACT if exact else SINGLE,
            value if positive else None,
        )
    spread = logs if logs is not None else data
    half = t_quantile((1 + CONFIDENCE) / 2, data.size - 1) * float(spread.std(ddof=1)) / math.sqrt(data.size)
    mean = float(data.mean())
    if np.ptp(data) == 0:  # identical runs: a point, free of the logarithm's rounding
        interval = (float(data[0]), float(data[0]))
    elif geometric is not None:
        interval = (geometric * math.exp(-half), geometric * math.exp(half))
    else:
        interval = (mean - half, mean + half)
    return Summary(
        int(data.size),
        float(np.median(data)),
        float(data.min()),
        float(data.max()),
        mean,
        interval,
        LOG_T_INTERVAL if positive else T_INTERVAL,
        geometric,
    )


def mlperf_mean(values: Sequence[float]) -> float | None:
    """MLPerf Training's score: the mean of the runs after dropping the fastest and the slowest (n >= 3)."""
    data = np.sort(_finite(values))
    return float(data[1:-1].mean()) if data.size >= 3 else None


def verdict(ci95: tuple[float, float] | None) -> str:
    """`higher` / `lower` only when the ratio's interval excludes 1."""
    if ci95 is None:
        return TOO_FEW
    low, high = ci95
    return HIGHER if low > 1 else LOWER if high < 1 else SAME


# ---------------------------------------------------------------------------------------------
# Two strategies: the ratio a / b


def ratio_over_runs(a: Sequence[float], b: Sequence[float], exact: bool = False) -> Ratio | None:
    """Ratio of geometric means of positive per-run values with Welch's 95% interval on the log scale.

    With fewer than two runs on a side there is no variance to use: the rule for one run applies
    (`single_run_ratio`), unless the figure is `exact`.
    """
    x, y = _finite(a), _finite(b)
    x, y = x[x > 0], y[y > 0]
    if x.size == 0 or y.size == 0:
        return None
    constant = np.ptp(x) == 0 and np.ptp(y) == 0
    # Equal repeats: the plain quotient, free of the logarithms' rounding.
    ratio = float(x[0] / y[0]) if constant else math.exp(float(np.log(x).mean() - np.log(y).mean()))
    if exact and (x.size < 2 or y.size < 2):
        # A count repeats exactly; several runs that disagree fall through to the t-interval below.
        if constant:
            return Ratio(ratio, (ratio, ratio), verdict((ratio, ratio)), EXACT)
    if x.size < 2 or y.size < 2:
        return single_run_ratio(x, y, ratio)
    return _welch_log_ratio(np.log(x), np.log(y), ratio)


def single_run_ratio(x: np.ndarray, y: np.ndarray, ratio: float) -> Ratio:
    """One run on a side and no within-run samples: identical values are no detectable difference,
    anything else cannot be judged."""
    if np.ptp(np.concatenate([x, y])) == 0:
        return Ratio(1.0, (1.0, 1.0), SAME, SINGLE)
    return Ratio(ratio, None, TOO_FEW, SINGLE)


def _welch_log_ratio(log_x: np.ndarray, log_y: np.ndarray, ratio: float) -> Ratio:
    var_x, var_y = log_x.var(ddof=1) / log_x.size, log_y.var(ddof=1) / log_y.size
    se = math.sqrt(var_x + var_y)
    # Identical repeats on both sides: a point, not the rounding residue of a variance of equal numbers.
    if se == 0 or (np.ptp(log_x) == 0 and np.ptp(log_y) == 0):
        return Ratio(ratio, (ratio, ratio), verdict((ratio, ratio)), WELCH_LOG_RATIO)
    # Welch-Satterthwaite degrees of freedom: unequal variances and unequal numbers of runs.
    df = (var_x + var_y) ** 2 / (var_x**2 / (log_x.size - 1) + var_y**2 / (log_y.size - 1))
    half = t_quantile((1 + CONFIDENCE) / 2, df) * se
    ci = (ratio * math.exp(-half), ratio * math.exp(half))
    return Ratio(ratio, ci, verdict(ci), WELCH_LOG_RATIO)


def bootstrap_medians(samples: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """The medians of `resamples` resamples (with replacement) of `samples`."""
    out = []
    for start in range(0, resamples, _BOOTSTRAP_CHUNK):
        count = min(_BOOTSTRAP_CHUNK, resamples - start)
        out.append(np.median(samples[rng.integers(0, samples.size, (count, samples.size))], axis=1))
    return np.concatenate(out)


def bootstrap_median_interval(samples: Sequence[float], seed: int = BOOTSTRAP_SEED) -> tuple[float, float, float]:
    """Median of `samples` and its 95% percentile-bootstrap interval (fixed seed: deterministic)."""
    data = _finite(samples)
    rng = np.random.default_rng(seed)
    medians = bootstrap_medians(data, BOOTSTRAP_RESAMPLES, rng)
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(medians, [tail, 100 - tail])
    return float(np.median(data)), float(low), float(high)


def step_ratio(
    a_rates: Sequence[float], b_rates: Sequence[float], seed: int = BOOTSTRAP_SEED
) -> tuple[float, tuple[float, float]]:
    """Ratio of the median per-step rates of two runs and its 95% bootstrap interval (each run resampled
    on its own, with one fixed seed)."""
    x, y = _finite(a_rates), _finite(b_rates)
    rng = np.random.default_rng(seed)
    ratios = bootstrap_medians(x, BOOTSTRAP_RESAMPLES, rng) / bootstrap_medians(y, BOOTSTRAP_RESAMPLES, rng)
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return float(np.median(x) / np.median(y)), (float(low), float(high))


# ---------------------------------------------------------------------------------------------
# The figures of runs, grouped by strategy: several runs of one strategy are repeats

MIB = 2**20
MIN_STEPS = 5  # fewer steps after warm-up than this give no within-run interval
# report.json's names of the figures; those that are a summary.json key are spelled by the run schema.
THROUGHPUT, STEP_PEAK, RESIDENT, RESERVED = (
    schema.THROUGHPUT.key,
    "step_peak_bytes",
    "peak_rss_mib",
    "peak_reserved_mib",
)
TRAIN_TIME, FINAL_VAL_LOSS, AVG_LOSS = schema.TRAIN_TIME.key, schema.FINAL_VAL_LOSS.key, "avg_loss"


@dataclass(frozen=True)
class Figure:
    """A whole-run figure the report summarizes and compares across strategies."""

    name: str  # report.json's key
    title: str  # how the reading names it
    unit: str
    exact: bool  # a count that repeats exactly; a timing or a loss does not
    value: Callable[[Run], float | None]


@dataclass(frozen=True)
class Comparison:
    """figure of strategy a / figure of strategy b."""

    figure: str
    a: str
    b: str
    ratio: float
    ci95: tuple[float, float] | None
    verdict: str
    method: str
    # One run each: the repeats per strategy that would show a difference of this size (None otherwise).
    repeats_needed: int | None = None

    def inverted(self) -> Comparison:
        """b / a: the same evidence read the other way round."""
        ci = None if self.ci95 is None else (1 / self.ci95[1], 1 / self.ci95[0])
        flipped = {HIGHER: LOWER, LOWER: HIGHER}.get(self.verdict, self.verdict)
        return Comparison(self.figure, self.b, self.a, 1 / self.ratio, ci, flipped, self.method, self.repeats_needed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "figure": self.figure,
            "a": self.a,
            "b": self.b,
            "ratio": self.ratio,
            "ci95": list(self.ci95) if self.ci95 is not None else None,
            "verdict": self.verdict,
            "method": self.method,
            "repeats_needed": self.repeats_needed,
        }


def best_first(summaries: dict[str, Summary], better: schema.Better | None) -> list[str]:
    """Strategies by their median, the better first as the run schema says which direction is (ties keep
    the table's order)."""
    return sorted(summaries, key=lambda name: summaries[name].median, reverse=better is schema.Better.HIGHER)


def group_by_strategy(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """Runs by Run.strategy, strategies in the order of their first run (the table's order)."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.strategy, []).append(run)
    return groups


def _total(metric: schema.Metric) -> Callable[[Run], float | None]:
    return lambda run: _finite_or_none(recorded(run.total, metric))


def _finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def step_peak_bytes(run: Run) -> float | None:
    """The live-tensor peak of the probe step, max over ranks (summary.json memory.step_peak_bytes); on a GPU
    without that record, the epochs' torch.cuda max allocated, which is the same quantity."""
    memory = run.fact("memory") or {}
    ranks = [v for v in (number(x) for x in memory.get("step_peak_bytes") or []) if v is not None]
    if ranks:
        return max(ranks)
    allocated = recorded(run.total, schema.PEAK_ALLOCATED)
    return allocated * MIB if allocated is not None and run.fact("device_type") != "cpu" else None


def run_figures(runs: Sequence[Run]) -> list[Figure]:
    """The figures of report.json; the memory beside the step peak is the process's resident set on CPU."""
    key = ranked_throughput(list(runs))
    cpu = bool(runs) and all(run.fact("device_type") == "cpu" for run in runs)
    beside = (
        Figure(
            RESIDENT,
            "peak resident set size (per process, max over processes)",
            "MiB",
            False,
            _total(schema.PEAK_ALLOCATED),
        )
        if cpu
        else Figure(
            RESERVED,
            "peak memory reserved (per device, max over devices)",
            "MiB",
            False,
            _total(schema.PEAK_RESERVED),
        )
    )
    return [
        Figure(THROUGHPUT, f"throughput ({throughput_name(key)})", "tokens/s", False, lambda run: throughput(run, key)),
        Figure(STEP_PEAK, "live-tensor step peak (per device, max over devices)", "bytes", True, step_peak_bytes),
        beside,
        Figure(TRAIN_TIME, "training time", "s", False, _total(schema.TRAIN_TIME)),
        Figure(FINAL_VAL_LOSS, "final validation loss", "nats", False, _total(schema.FINAL_VAL_LOSS)),
        Figure(AVG_LOSS, "mean training loss", "nats", False, _total(schema.LOSS_MEAN)),
    ]


def warmup_steps(run: Run) -> int:
    """The run's --perf_warmup_steps as config.json records it, train.py's default otherwise."""
    recorded = ((run.config or {}).get("run") or {}).get("perf_warmup_steps")
    if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded >= 0:
        return recorded
    return next(f.default for f in fields(RunConfig) if f.name == "perf_warmup_steps")


def step_rates(run: Run) -> np.ndarray:
    """Tokens per second of each optimizer step after warm-up: the global batch / the step's time."""
    tokens = number(run.fact("global_batch_tokens"))
    times = _finite(run.step_times_s[warmup_steps(run) :])
    if tokens is None or tokens <= 0:
        return np.empty(0)
    return tokens / times[times > 0]


def summarize_figure(figure: Figure, runs: Sequence[Run]) -> Summary | None:
    """One strategy's figure; one run's throughput takes its interval from its own step times."""
    summary = summarize(_values(figure, runs), figure.exact)
    if summary is None or summary.n != 1 or figure.name != THROUGHPUT:
        return summary
    rates = step_rates(runs[0])
    if rates.size < MIN_STEPS:
        return summary
    middle, low, high = bootstrap_median_interval(rates)
    value = summary.median
    # The interval's relative width is the median step's; it is placed around the recorded figure.
    return Summary(
        1,
        value,
        value,
        value,
        value,
        (value * low / middle, value * high / middle),
        STEP_BOOTSTRAP,
        summary.geometric_mean,
    )


def compare_figure(figure: Figure, a: str, runs_a: Sequence[Run], b: str, runs_b: Sequence[Run]) -> Comparison | None:
    """a / b for one figure over runs. One throughput run each gives no verdict, only the repeats it would take:
    the step-time bootstrap (`step_bootstrap_comparison`) fails calibration at n = 1 (docs/statistics.md)."""
    values_a, values_b = _values(figure, runs_a), _values(figure, runs_b)
    if figure.name == THROUGHPUT and len(values_a) == 1 and len(values_b) == 1 and values_a != values_b:
        ratio = values_a[0] / values_b[0]
        return Comparison(figure.name, a, b, ratio, None, NO_VERDICT, ONE_RUN_EACH, repeats_needed(ratio))
    result = ratio_over_runs(values_a, values_b, figure.exact)
    if result is None:
        return None
    return Comparison(figure.name, a, b, result.ratio, result.ci95, result.verdict, result.method)


def step_bootstrap_comparison(
    figure: Figure, a: str, runs_a: Sequence[Run], b: str, runs_b: Sequence[Run]
) -> Comparison | None:
    """One run each: the recorded throughputs' ratio with the bootstrap interval of the ratio of median step
    rates. Kept to be calibrated (analysis/calibration.py), not to decide: it cannot see drift between runs."""
    values_a, values_b = _values(figure, runs_a), _values(figure, runs_b)
    rates_a, rates_b = step_rates(runs_a[0]), step_rates(runs_b[0])
    if rates_a.size < MIN_STEPS or rates_b.size < MIN_STEPS or not values_a or not values_b or values_b[0] <= 0:
        return None
    middle, (low, high) = step_ratio(rates_a, rates_b)
    ratio = values_a[0] / values_b[0]
    ci = (ratio * low / middle, ratio * high / middle)
    return Comparison(figure.name, a, b, ratio, ci, verdict(ci), STEP_BOOTSTRAP)


def repeats_needed(ratio: float, sigma: float = RUN_SIGMA, power: float = POWER) -> int | None:
    """Runs per strategy for Welch's 95% interval to exclude 1 in `power` of experiments when the true ratio is
    `ratio` and runs vary by `sigma` (log scale): (t(0.975) + t(power)) x sigma x sqrt(2 / n) <= |ln ratio|,
    docs/statistics.md's arithmetic. None for a ratio of 1 or beyond MAX_REPEATS."""
    gap = abs(math.log(ratio)) if ratio > 0 else 0.0
    if gap == 0:
        return None
    # The normal approximation is a lower bound (t > z): start there and step up to where the t's allow it.
    start = max(2, math.floor(2 * ((1.96 + 0.84) * sigma / gap) ** 2))
    for n in range(start, MAX_REPEATS + 1):
        df = 2 * n - 2
        if (t_quantile((1 + CONFIDENCE) / 2, df) + t_quantile(power, df)) * sigma * math.sqrt(2 / n) <= gap:
            return n
    return None


# ---------------------------------------------------------------------------------------------
# Time, tokens and cost to a target validation loss


@dataclass(frozen=True)
class TargetPoint:
    """Where one run first reached the target validation loss."""

    seconds: float  # training time (steps only) up to that point
    tokens: float
    cost: float | None  # at --gpu_hour_price per device-hour; None without a price


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


def _cost(run: Run, seconds: float, price: float | None) -> float | None:
    devices = run.fact("world_size") if isinstance(run.fact("world_size"), int) else 1
    return None if price is None else price * devices * seconds / 3600


def time_to_target(run: Run, target: float, price: float | None = None) -> TargetPoint | None:
    """The first point where the validation loss reaches `target`, linear between the two evaluations
    around it; at the first evaluation when it already reaches it. None when it never does."""
    elapsed = _elapsed_at(run)
    previous: tuple[float, float, float] | None = None
    for step, tokens, loss in _eval_points(run):
        if loss <= target:
            fraction = 1.0 if previous is None or previous[2] == loss else (previous[2] - target) / (previous[2] - loss)
            start_step, start_tokens = (step, tokens) if previous is None else previous[:2]
            at_step = start_step + fraction * (step - start_step)
            seconds = elapsed(at_step)
            return TargetPoint(seconds, start_tokens + fraction * (tokens - start_tokens), _cost(run, seconds, price))
        previous = (step, tokens, loss)
    return None


def censored_at(run: Run, price: float | None = None) -> TargetPoint | None:
    """Where a run that never reached the target was last seen above it: its last evaluation (None: no
    evaluation). All it says is "not before this"."""
    points = _eval_points(run)
    if not points:
        return None
    step, tokens, _ = points[-1]
    seconds = _elapsed_at(run)(step)
    return TargetPoint(seconds, tokens, _cost(run, seconds, price))


TARGET_KEYS = ("seconds", "tokens", "cost")
KM_MEDIAN = "Kaplan-Meier median (a run that never reached the target counts as not before its last evaluation)"
LOG_RANK = "log-rank test at 5% (runs that never reached the target censored at their last evaluation)"


def target_observations(runs: Sequence[Run], target: float, price: float | None) -> list[tuple[TargetPoint, bool]]:
    """Each run's point at the target (reached) or at its last evaluation (not reached); runs never evaluated
    say nothing and are left out."""
    observed = []
    for run in runs:
        point = time_to_target(run, target, price)
        if point is not None:
            observed.append((point, True))
        elif (last := censored_at(run, price)) is not None:
            observed.append((last, False))
    return observed


def _survival(observed: list[tuple[TargetPoint, bool]], key: str) -> list[Observation]:
    return [Observation(getattr(p, key), reached) for p, reached in observed if getattr(p, key) is not None]


def target_summary(runs: Sequence[Run], target: float, price: float | None) -> dict[str, Any]:
    """report.json's time_to_target entry of one strategy: the Kaplan-Meier medians over its runs (null when
    fewer than half reached the target), the last evaluation of those that did not, and the spread of those
    that did; `reached` counts those runs out of `runs`."""
    observed = target_observations(runs, target, price)
    points = [p for p, reached in observed if reached]
    spread = {key: summarize([getattr(p, key) for p in points if getattr(p, key) is not None]) for key in TARGET_KEYS}
    return {
        "target_loss": target,
        "runs": len(runs),
        "reached": len(points),
        **{key: median_time(_survival(observed, key)) for key in TARGET_KEYS},
        "median_method": KM_MEDIAN,
        "not_reached_before": [{"seconds": p.seconds, "tokens": p.tokens} for p, reached in observed if not reached],
        "spread": {key: (s.to_dict() if s is not None else None) for key, s in spread.items()},
    }


def target_comparisons(groups: dict[str, list[Run]], target: float, price: float | None = None) -> list[dict[str, Any]]:
    """Every pair of strategies (a before b), on the time and the tokens to the target: the log-rank test."""
    observed = {name: target_observations(members, target, price) for name, members in groups.items()}
    names = [name for name in groups if observed[name]]
    out = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            for key in ("seconds", "tokens"):
                test = log_rank(_survival(observed[a], key), _survival(observed[b], key))
                out.append(
                    {
                        "figure": key,
                        "a": a,
                        "b": b,
                        "median_a": median_time(_survival(observed[a], key)),
                        "median_b": median_time(_survival(observed[b], key)),
                        "chi2": test.chi2,
                        "p_value": test.p_value,
                        "verdict": test.verdict,
                        "method": LOG_RANK,
                    }
                )
    return out


# ---------------------------------------------------------------------------------------------
# Everything report.json holds


@dataclass(frozen=True)
class Statistics:
    figures: dict[str, dict[str, Summary]]  # figure -> strategy -> summary
    comparisons: list[Comparison]  # every pair of strategies (a before b in table order), every figure
    time_to_target: dict[str, dict[str, Any]]  # strategy -> target_summary; empty without a target
    titles: dict[str, str]  # figure -> how the reading names it
    # figure -> strategy -> MLPerf's mean of the runs less the fastest and the slowest; None: not asked for
    mlperf: dict[str, dict[str, float | None]] | None = None
    # every pair of strategies on the time and tokens to the target (target_comparisons); empty without one
    target_comparisons: list[dict[str, Any]] = field(default_factory=list)

    def comparison(self, figure: str, a: str, b: str) -> Comparison | None:
        """a / b, read off the stored pair in whichever order it was stored."""
        for item in self.comparisons:
            if item.figure == figure and (item.a, item.b) == (a, b):
                return item
            if item.figure == figure and (item.a, item.b) == (b, a):
                return item.inverted()
        return None

    def to_dict(self) -> dict[str, Any]:
        """report.json (docs/statistics.md describes its shape)."""
        figures = {
            name: {strategy: summary.to_dict() for strategy, summary in by_strategy.items()}
            for name, by_strategy in self.figures.items()
        }
        for name, by_strategy in (self.mlperf or {}).items():
            for strategy, value in by_strategy.items():
                figures[name][strategy]["mlperf_mean"] = value
        return json_ready(
            {
                "figures": figures,
                "comparisons": [c.to_dict() for c in self.comparisons],
                "time_to_target": self.time_to_target,
                "time_to_target_comparisons": self.target_comparisons,
            }
        )


def json_ready(value: Any) -> Any:
    """`value` with every non-finite float as None: JSON has no nan or inf, and a reader must not meet them."""
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def build_statistics(
    runs: Sequence[Run], target_loss: float | None = None, price: float | None = None, mlperf: bool = False
) -> Statistics:
    """Every figure of every strategy, every pair's comparisons and, with a target, the time to it."""
    groups = group_by_strategy(runs)
    figures: dict[str, dict[str, Summary]] = {}
    comparisons: list[Comparison] = []
    mlperf_means: dict[str, dict[str, float | None]] = {}
    for figure in run_figures(runs):
        summaries = {name: s for name, members in groups.items() if (s := summarize_figure(figure, members))}
        if not summaries:
            continue
        figures[figure.name] = summaries
        names = list(summaries)
        comparisons += [
            c
            for i, a in enumerate(names)
            for b in names[i + 1 :]
            if (c := compare_figure(figure, a, groups[a], b, groups[b])) is not None
        ]
        mlperf_means[figure.name] = {name: mlperf_mean(_values(figure, groups[name])) for name in names}
    targets = (
        {}
        if target_loss is None
        else {name: target_summary(members, target_loss, price) for name, members in groups.items()}
    )
    titles = {figure.name: figure.title for figure in run_figures(runs)}
    pairs = [] if target_loss is None else target_comparisons(groups, target_loss, price)
    return Statistics(figures, comparisons, targets, titles, mlperf_means if mlperf else None, pairs)


def _values(figure: Figure, runs: Sequence[Run]) -> list[float]:
    return [v for v in (figure.value(run) for run in runs) if v is not None]
