"""Figures with their uncertainty, and verdicts that are stated only outside the noise (docs/statistics.md).

Two sources of noise, two methods:
- across repeated runs of one strategy (the unit is a run, usually 2 to 5 of them): Student's t-interval
  of the mean logarithm, i.e. of the geometric mean, for figures that are positive (all the report's are:
  a throughput's interval cannot reach below zero), of the plain mean otherwise; for a pair of strategies
  Welch's t-interval of the difference of mean logarithms, i.e. the ratio of geometric means, and a test of
  "no difference": exact over every relabelling of the runs where they are few (analysis/permutation.py),
  a Monte Carlo permutation test of Welch's t statistic where they are many;
- within one run (its optimizer step times, dozens to thousands of them): a bootstrap of the median step
  time with a fixed seed, which a rare slow step (a pause, the memory probe) cannot drag.

A verdict (`higher`, `lower`) is stated only when the test's p-value, Holm-adjusted over the pairs of the
figure, is below 5%, the ratio's 95% interval excludes 1 and the ratio lies outside the figure's practical
margin (training/run_schema.py); a pair whose whole interval lies inside the margin is `no meaningful
difference`; otherwise `no detectable difference`. With one run and no within-run distribution there is no
interval: equal values are `no detectable difference`, different ones `not enough runs`. The distributions
and tests are scipy.stats'; no torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np
from scipy import stats

from analysis.permutation import (
    MONTE_CARLO,
    SIGNIFICANCE,
    exact_p,
    holm,
    is_exact,
    mean_difference,
    monte_carlo_p,
    repeats_for_a_verdict,
    smallest_p,
    welch_t,
)
from analysis.runs import Run, number, recorded
from analysis.scaling import ranked_throughput, throughput, throughput_name
from analysis.survival import EXACT_LOG_RANK, Observation, log_rank, median_time
from training import run_schema as schema
from training.config import RunConfig

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 1993  # fixed, so the same records give the same interval (Efron & Tibshirani, 1993)
_BOOTSTRAP_CHUNK = 250  # resamples drawn at once: bounds memory for runs of many thousand steps

HIGHER, LOWER, SAME, TOO_FEW = "higher", "lower", "no detectable difference", "not enough runs"
# The whole 95% interval inside the figure's practical margin: a difference, if any, too small to matter.
NEGLIGIBLE = "no meaningful difference"
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
EXACT_PERMUTATION = "exact permutation test of the difference of mean logarithms (every relabelling of the runs)"
WELCH_TEST = f"{MONTE_CARLO}: Welch's t statistic of the mean logarithms (many runs)"
STEP_BOOTSTRAP = "moving-block bootstrap of the median step time of one run"
TOO_CORRELATED = "none (one run whose step times stay correlated over a quarter of its steps)"
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
    block: int | None = None  # steps per block of a one-run moving-block bootstrap (1: steps uncorrelated)

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
            "block_steps": self.block,
        }


@dataclass(frozen=True)
class Ratio:
    """a / b with its 95% interval and the verdict it allows."""

    ratio: float
    ci95: tuple[float, float] | None
    verdict: str
    method: str
    test: str | None = None  # the test of "no difference" behind p_value; None: no test (a point, one run)
    p_value: float | None = None  # two-sided, for this pair alone
    smallest_p: float | None = None  # the smallest p the exact test can give at these numbers of runs


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
    half = float(stats.t.ppf((1 + CONFIDENCE) / 2, data.size - 1) * stats.sem(spread))
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


def inside(value: float, margin: float) -> bool:
    """Whether the ratio `value` is within the practical margin of 1, either way round (1.02 and 1 / 1.02)."""
    return value > 0 and abs(math.log(value)) <= math.log1p(margin) * (1 + 1e-12)


def verdict(
    ci95: tuple[float, float] | None,
    ratio: float | None = None,
    p_value: float | None = None,
    margin: float = 0.0,
    alpha: float = SIGNIFICANCE,
) -> str:
    """The verdict a ratio's interval and test allow.

    `no meaningful difference` when the whole interval lies inside the margin; `higher` / `lower` only when
    the interval excludes 1, the ratio lies outside the margin and the test's p (None: a point interval,
    exact values with nothing to test) is below `alpha`; `no detectable difference` otherwise."""
    if ci95 is None:
        return TOO_FEW
    low, high = ci95
    ratio = math.sqrt(low * high) if ratio is None else ratio
    if inside(low, margin) and inside(high, margin):
        return NEGLIGIBLE
    if inside(ratio, margin) or (p_value is not None and p_value >= alpha):
        return SAME
    return HIGHER if low > 1 else LOWER if high < 1 else SAME


# ---------------------------------------------------------------------------------------------
# Two strategies: the ratio a / b


def ratio_over_runs(a: Sequence[float], b: Sequence[float], exact: bool = False, margin: float = 0.0) -> Ratio | None:
    """Ratio of geometric means of positive per-run values with Welch's 95% interval on the log scale and
    the test of "no difference" (`_welch_log_ratio`); its verdict is this pair's alone (no correction).

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
            return Ratio(ratio, (ratio, ratio), verdict((ratio, ratio), ratio, None, margin), EXACT)
    if x.size < 2 or y.size < 2:
        return single_run_ratio(x, y, ratio)
    return _welch_log_ratio(np.log(x), np.log(y), ratio, margin)


def single_run_ratio(x: np.ndarray, y: np.ndarray, ratio: float) -> Ratio:
    """One run on a side and no within-run samples: identical values are no detectable difference,
    anything else cannot be judged."""
    if np.ptp(np.concatenate([x, y])) == 0:
        return Ratio(1.0, (1.0, 1.0), SAME, SINGLE)
    return Ratio(ratio, None, TOO_FEW, SINGLE)


def _welch_log_ratio(log_x: np.ndarray, log_y: np.ndarray, ratio: float, margin: float) -> Ratio:
    # Identical repeats on both sides: a point, not the rounding residue of a variance of equal numbers.
    if np.ptp(log_x) == 0 and np.ptp(log_y) == 0:
        return _constant_sides(log_x, log_y, ratio, margin)
    # Welch's interval: unequal variances and numbers of runs (Welch-Satterthwaite degrees of freedom).
    welch = stats.ttest_ind(log_x, log_y, equal_var=False)
    low, high = welch.confidence_interval(CONFIDENCE)
    ci = (math.exp(float(low)), math.exp(float(high)))
    if is_exact(log_x.size, log_y.size):
        p, test, floor = (
            exact_p(log_x, log_y, mean_difference, True),
            EXACT_PERMUTATION,
            smallest_p(log_x.size, log_y.size),
        )
    else:
        p, test, floor = monte_carlo_p(log_x, log_y, welch_t), WELCH_TEST, None
    return Ratio(ratio, ci, verdict(ci, ratio, p, margin), WELCH_LOG_RATIO, test, p, floor)


def _constant_sides(log_x: np.ndarray, log_y: np.ndarray, ratio: float, margin: float) -> Ratio:
    """Each side repeats one value. Equal values on both sides are a point with nothing to test; different
    ones are still a test's to judge: two runs each that happen to agree cannot tell a real difference from
    a lucky split, so the exact p is computed as for any other runs (1/3 at 2 each: no verdict)."""
    point = (ratio, ratio)
    if np.ptp(np.concatenate([log_x, log_y])) == 0:
        return Ratio(ratio, point, verdict(point, ratio, None, margin), WELCH_LOG_RATIO)
    # The observed split is the most extreme relabelling and so is its mirror: beyond the enumeration limit
    # the exact p is that floor without counting.
    floor = smallest_p(log_x.size, log_y.size)
    p = exact_p(log_x, log_y, mean_difference, True) if is_exact(log_x.size, log_y.size) else floor
    return Ratio(ratio, point, verdict(point, ratio, p, margin), WELCH_LOG_RATIO, EXACT_PERMUTATION, p, floor)


def block_length(samples: Sequence[float]) -> int | None:
    """The block of a moving-block bootstrap of consecutive steps: the first lag whose autocorrelation lies
    inside the band white noise would show, +-1.96 / sqrt(n) (steps that far apart are as good as
    independent); 1 for uncorrelated steps. None when the steps stay correlated up to n / 4 steps apart:
    fewer than 4 blocks resample nothing, so no interval."""
    data = _finite(samples)
    centred = data - data.mean()
    variance = float(centred @ centred)
    if variance == 0:
        return 1
    band = 1.96 / math.sqrt(data.size)
    for lag in range(1, data.size // 4 + 1):
        if abs(float(centred[:-lag] @ centred[lag:]) / variance) < band:
            return lag
    return None


def bootstrap_medians(samples: np.ndarray, resamples: int, rng: np.random.Generator, block: int = 1) -> np.ndarray:
    """The medians of `resamples` moving-block resamples of `samples`: runs of `block` consecutive steps from
    random starts, joined and cut to the length of the run (block 1: the ordinary bootstrap). Blocks keep
    the correlation of neighbouring steps, which resampling steps one by one would break into a too narrow
    interval (Kunsch, 1989)."""
    n = samples.size
    blocks = -(-n // block)
    out = []
    for start in range(0, resamples, _BOOTSTRAP_CHUNK):
        count = min(_BOOTSTRAP_CHUNK, resamples - start)
        starts = rng.integers(0, n - block + 1, (count, blocks))
        index = (starts[:, :, None] + np.arange(block)).reshape(count, -1)[:, :n]
        out.append(np.median(samples[index], axis=1))
    return np.concatenate(out)


def bootstrap_median_interval(
    samples: Sequence[float], seed: int = BOOTSTRAP_SEED, block: int = 1
) -> tuple[float, float, float]:
    """Median of `samples` and its 95% percentile moving-block bootstrap interval (fixed seed: deterministic)."""
    data = _finite(samples)
    rng = np.random.default_rng(seed)
    medians = bootstrap_medians(data, BOOTSTRAP_RESAMPLES, rng, block)
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
    margin: float = 0.0  # the smallest relative difference that matters (training/run_schema.py)


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
    # The runs per strategy that would decide: one throughput run each, the runs that would show a difference
    # of this size; an exact test that cannot reach 5% at these runs, the runs at which it can (None otherwise).
    repeats_needed: int | None = None
    margin: float = 0.0
    test: str | None = None  # the test of "no difference"; None: nothing tested (a point, one run)
    p_value: float | None = None  # two-sided, this pair alone
    p_adjusted: float | None = None  # Holm-adjusted over the figure's pairs: the one the verdict uses
    smallest_p: float | None = None  # the smallest p the exact test allows at these runs

    def inverted(self) -> Comparison:
        """b / a: the same evidence read the other way round."""
        ci = None if self.ci95 is None else (1 / self.ci95[1], 1 / self.ci95[0])
        flipped = {HIGHER: LOWER, LOWER: HIGHER}.get(self.verdict, self.verdict)
        return replace(self, a=self.b, b=self.a, ratio=1 / self.ratio, ci95=ci, verdict=flipped)

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
            "margin": self.margin,
            "test": self.test,
            "p_value": self.p_value,
            "p_adjusted": self.p_adjusted,
            "smallest_p": self.smallest_p,
        }


def best_first(summaries: dict[str, Summary], better: schema.Better | None) -> list[str]:
    """Strategies by their median, the better first as the run schema says which direction is (ties keep
    the table's order)."""
    return sorted(summaries, key=lambda name: summaries[name].median, reverse=better is schema.Better.HIGHER)


def group_by_strategy(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """Runs by Run.arm (the strategy, or its label in an A/A experiment), in the order of their first run (the
    table's order)."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.arm, []).append(run)
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
            schema.PEAK_ALLOCATED.margin or 0.0,
        )
        if cpu
        else Figure(
            RESERVED,
            "peak memory reserved (per device, max over devices)",
            "MiB",
            False,
            _total(schema.PEAK_RESERVED),
            schema.PEAK_RESERVED.margin or 0.0,
        )
    )
    return [
        Figure(
            THROUGHPUT,
            f"throughput ({throughput_name(key)})",
            "tokens/s",
            False,
            lambda run: throughput(run, key),
            key.margin or 0.0,
        ),
        Figure(
            STEP_PEAK,
            "live-tensor step peak (per device, max over devices)",
            "bytes",
            True,
            step_peak_bytes,
            schema.STEP_PEAK_MARGIN,
        ),
        beside,
        _total_figure(TRAIN_TIME, "training time", schema.TRAIN_TIME),
        _total_figure(FINAL_VAL_LOSS, "final validation loss", schema.FINAL_VAL_LOSS),
        _total_figure(AVG_LOSS, "mean training loss", schema.LOSS_MEAN),
    ]


def _total_figure(name: str, title: str, metric: schema.Metric) -> Figure:
    return Figure(name, title, metric.unit, False, _total(metric), metric.margin or 0.0)


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
    block = block_length(rates)
    if block is None:
        return replace(summary, method=TOO_CORRELATED)
    middle, low, high = bootstrap_median_interval(rates, block=block)
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
        block,
    )


def compare_figure(figure: Figure, a: str, runs_a: Sequence[Run], b: str, runs_b: Sequence[Run]) -> Comparison | None:
    """a / b for one figure over runs. One throughput run each gives no verdict, only the repeats it would take:
    the step-time bootstrap (`step_bootstrap_comparison`) fails calibration at n = 1 (docs/statistics.md)."""
    values_a, values_b = _values(figure, runs_a), _values(figure, runs_b)
    if figure.name == THROUGHPUT and len(values_a) == 1 and len(values_b) == 1 and values_a != values_b:
        ratio = values_a[0] / values_b[0]
        return Comparison(
            figure.name, a, b, ratio, None, NO_VERDICT, ONE_RUN_EACH, repeats_needed(ratio), margin=figure.margin
        )
    result = ratio_over_runs(values_a, values_b, figure.exact, figure.margin)
    if result is None:
        return None
    return Comparison(
        figure.name,
        a,
        b,
        result.ratio,
        result.ci95,
        result.verdict,
        result.method,
        margin=figure.margin,
        test=result.test,
        p_value=result.p_value,
        p_adjusted=result.p_value,
        smallest_p=result.smallest_p,
    )


def corrected(comparisons: Sequence[Comparison]) -> list[Comparison]:
    """The pairs of one figure with Holm's correction over those that were tested: each verdict read from
    the adjusted p, and where the exact test cannot reach 5% at these runs after the correction, the runs
    per strategy at which it could; one throughput run each, at least those runs too."""
    adjusted = holm([c.p_value for c in comparisons])
    family = sum(p is not None for p in adjusted)
    out = []
    for c, p in zip(comparisons, adjusted):
        if c.verdict == NO_VERDICT and c.repeats_needed is not None:
            # The repeats must also let the exact test reach 5% over all of this figure's pairs.
            out.append(replace(c, repeats_needed=max(c.repeats_needed, repeats_for_a_verdict(len(comparisons)))))
            continue
        if p is None:
            out.append(c)
            continue
        needed = (
            repeats_for_a_verdict(family)
            if c.smallest_p is not None and family * c.smallest_p >= SIGNIFICANCE
            else None
        )
        out.append(
            replace(
                c,
                p_adjusted=p,
                verdict=verdict(c.ci95, c.ratio, p, c.margin),
                repeats_needed=needed,
            )
        )
    return out


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
        if (stats.t.ppf((1 + CONFIDENCE) / 2, df) + stats.t.ppf(power, df)) * sigma * math.sqrt(2 / n) <= gap:
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
LOG_RANK = (
    "log-rank statistic at 5%, Holm-adjusted over the pairs (runs that never reached the target censored at "
    "their last evaluation)"
)


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
    """Every pair of strategies (a before b), on the time and the tokens to the target: the log-rank statistic,
    its p exact over every relabelling of the runs where they are few, Holm-adjusted over the pairs of each
    figure. `sooner` / `later` only when the adjusted p is below 5% and the Kaplan-Meier medians, where both
    exist, differ by more than the practical margin (training/run_schema.py TARGET_MARGIN)."""
    observed = {name: target_observations(members, target, price) for name, members in groups.items()}
    names = [name for name in groups if observed[name]]
    out = []
    for key in ("seconds", "tokens"):
        pairs = []
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                runs_a, runs_b = _survival(observed[a], key), _survival(observed[b], key)
                test = log_rank(runs_a, runs_b)
                exact = test.test == EXACT_LOG_RANK
                pairs.append(
                    {
                        "figure": key,
                        "a": a,
                        "b": b,
                        "runs_a": len(runs_a),
                        "runs_b": len(runs_b),
                        "median_a": median_time(runs_a),
                        "median_b": median_time(runs_b),
                        "statistic": test.statistic,
                        "direction": test.direction,
                        "test": test.test,
                        "p_value": test.p_value,
                        "smallest_p": smallest_p(len(runs_a), len(runs_b)) if exact else None,
                        "margin": schema.TARGET_MARGIN,
                        "method": LOG_RANK,
                    }
                )
        adjusted = holm([pair["p_value"] for pair in pairs])
        family = sum(p is not None for p in adjusted)
        for pair, p in zip(pairs, adjusted):
            floor = pair["smallest_p"]
            out.append(
                {
                    **pair,
                    "p_adjusted": p,
                    "verdict": _target_verdict(pair, p),
                    "repeats_needed": (
                        repeats_for_a_verdict(family) if floor is not None and family * floor >= SIGNIFICANCE else None
                    ),
                }
            )
    return out


def _target_verdict(pair: dict[str, Any], p_adjusted: float | None) -> str:
    """`sooner` / `later` (a against b) only below 5% after the correction and outside the practical margin."""
    if p_adjusted is None or p_adjusted >= SIGNIFICANCE or pair["direction"] is None:
        return SAME
    median_a, median_b = pair["median_a"], pair["median_b"]
    if median_a is not None and median_b is not None and median_b > 0 and inside(median_a / median_b, pair["margin"]):
        return SAME
    return pair["direction"]


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
        comparisons += corrected(
            [
                c
                for i, a in enumerate(names)
                for b in names[i + 1 :]
                if (c := compare_figure(figure, a, groups[a], b, groups[b])) is not None
            ]
        )
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
