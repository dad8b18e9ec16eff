"""How often a comparison is wrong: A/A and B/A pairs of synthetic runs fed to the report's own functions, and
A/A splits of a real experiment's runs.

    python -m analysis.calibration [--trials N] [--seed S]
    python -m analysis.calibration --runs OUT [--target_loss L] [--splits N] [--seed S]
    python -m analysis.calibration --beyond_exact PAIRS [--seed S]

prints, for n = 1 to 5, 10 and 18 runs per strategy, the rate of false throughput verdicts (a `higher` or
`lower` between two strategies that are the same) and the power (a true 10% difference called in the right
direction); the same with heavy tails (`HEAVY_TAILS`: a throttled mode and one slow machine) at 4, 5 and 10;
and the time to a target loss (`sooner` or `later` on the seconds or tokens of an A/A pair) at 3, 4 and 5.
The runs are drawn as the step times measured here behave (`StepTimeModel`): each run has its own level
(run-to-run drift, a random effect) and its steps follow it with AR(1) autocorrelation. n = 1 is also
measured with the step-time bootstrap the report used to decide on one run each, which is why it no longer
does (docs/statistics.md).

With --runs, the runs are real: OUT is an A/A experiment's folder (`python -m analysis.experiment --strategies ddp
ddp --repeats 6`: 12 runs of one strategy), or any folder whose run folders all hold one strategy. Its runs are
pooled and split into two groups of n (n = 2 to 5), every distinct split (or, with --splits N, N drawn without
replacement from the seed); each split goes through the report's comparison of every figure and of the time to
the target, and a `higher`/`lower`/`sooner`/`later` is a false verdict. Every split is one relabelling of the
pooled runs, so this count checks the verdict's arithmetic on real figures (ties, points, margins), not the
machine: an exact test's splits are exchangeable by construction. What the machine does shows in the two
single trials printed after it: the arms as the experiment ran them (ddp#2 against ddp, interleaved), and the
second half of the runs in launch order (runs/order.json) against the first (drift).

With --beyond_exact, the tests past the figures' exact enumeration limit: the throughput verdict of PAIRS A/A
pairs at 10 and 18 runs each (a Monte Carlo permutation p, analysis/permutation.py), and the share of the orders
of 2n distinct reaching times (all of them at 8 each, PAIRS drawn at 10 and 11) whose log-rank p is below 5%
(enumerated up to 10 each, drawn at 11).
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from analysis.compare import target_loss as target_loss_flag
from analysis.permutation import (
    SIGNIFICANCE,
    exact_p_of_many,
    is_exact,
    mean_difference,
    monte_carlo_p_of_many,
    relabellings,
    tie_margin,
    welch_t,
)
from analysis.runs import Run, load_run, sort_runs
from analysis.survival import LATER, SOONER, Observation, log_rank, log_rank_is_exact, log_rank_statistics
from analysis.uncertainty import (
    CONFIDENCE,
    HIGHER,
    LOWER,
    SAME,
    THROUGHPUT,
    Comparison,
    Figure,
    TargetPoint,
    compare_figure,
    group_by_strategy,
    run_figures,
    step_bootstrap_comparison,
    target_comparisons,
    target_observations,
    verdict,
)
from training import run_schema as schema
from training.cli import EXIT_BAD_INPUT, OneLineParser
from training.record import EvalLine, RunSummary, RunTotals, TrainLine

REPEATS = (1, 2, 3, 4, 5, 10, 18)  # one run each, the real A/A splits' 2 to 5, docs/statistics.md's repeat counts
HEAVY_REPEATS = (4, 5, 10)
TRIALS = 400
SEED = 2024
DIFFERENCE = 1.10  # B is 10% faster than A
FALSE_RATE_BOUND = 0.05

Method = Callable[[Figure, str, Sequence[Run], str, Sequence[Run]], Comparison | None]


@dataclass(frozen=True)
class StepTimeModel:
    """Step times of synthetic runs, with the noise the project's runs show.

    Defaults: log step times with a standard deviation of 7% and lag-1 autocorrelation 0.45 within a run
    (docs/sample_report/runs: 5.4-9.8% and 0.02-0.45 over their 39 steps after warm-up; the largest
    autocorrelation is kept, as it narrows a naive interval most); 40 steps; a run-to-run level of 5%
    (docs/statistics.md's T4 jitter), which one run's step times cannot see.
    """

    steps: int = 40
    step_time_s: float = 0.5
    step_sd: float = 0.07
    autocorrelation: float = 0.45
    run_sd: float = 0.05
    tokens_per_step: int = 1024
    # Heavy tails, which Welch's t assumes away: a share of runs on a throttled device (a second mode, this
    # much slower), and A's first run on one slow machine, this much slower (1.0: none).
    throttled_share: float = 0.0
    throttled_slowdown: float = 1.0
    slow_machine: float = 1.0

    def step_times(self, rng: np.random.Generator, runs: int, speed: float = 1.0) -> np.ndarray:
        """(runs, steps) step times: a level per run, AR(1) noise around it, stationary from the first step."""
        phi = self.autocorrelation
        shocks = rng.normal(0.0, self.step_sd, (runs, self.steps))
        noise = np.empty_like(shocks)
        noise[:, 0] = shocks[:, 0]
        for i in range(1, self.steps):
            noise[:, i] = phi * noise[:, i - 1] + math.sqrt(1 - phi**2) * shocks[:, i]
        level = rng.normal(0.0, self.run_sd, (runs, 1))
        throttled = rng.random((runs, 1)) < self.throttled_share
        level = level + np.where(throttled, math.log(self.throttled_slowdown), 0.0)
        return self.step_time_s / speed * np.exp(level + noise)


# 10% of runs on a device throttled 30% slower, and one of A's runs on a machine 20% slower.
HEAVY_TAILS = StepTimeModel(throttled_share=0.1, throttled_slowdown=1.3, slow_machine=1.2)


class SyntheticRun(Run):
    """A run built in memory, read straight from its summary dict: Run reads summary.json into its record at
    every access, which would be most of a calibration's time over tens of thousands of runs."""

    @cached_property
    def total(self) -> RunTotals:  # type: ignore[override]
        return RunTotals.from_dict(self.summary["total"])

    @property
    def step_times_s(self) -> list[float]:
        return self.summary["step_times_s"]

    def fact(self, key: str) -> Any:
        return self.summary.get(key)


def synthetic_run(strategy: str, times: np.ndarray, tokens_per_step: int, index: int) -> Run:
    """A run as analysis.runs reads it: its step times and whole-job throughput, no warm-up steps."""
    tokens_per_s = tokens_per_step * times.size / float(times.sum())
    summary = {
        "strategy": strategy,
        "global_batch_tokens": tokens_per_step,
        "total": {schema.THROUGHPUT.key: tokens_per_s},
        "step_times_s": times.tolist(),
    }
    return SyntheticRun(Path(strategy, f"r{index}"), summary, {"run": {"perf_warmup_steps": 0}}, label=strategy)


@dataclass(frozen=True)
class Calibration:
    """One method at one repeat count: how often it was wrong, and how often right about a real difference."""

    repeats: int
    trials: int
    false_verdicts: int  # A/A pairs called higher or lower
    detected: int  # B/A pairs (B 10% faster) called higher, B over A
    null_trials: int | None = None  # A/A comparisons where not `trials` pairs: every split of each A/A pool

    @property
    def false_rate(self) -> float:
        return self.false_verdicts / (self.trials if self.null_trials is None else self.null_trials)

    @property
    def power(self) -> float:
        return self.detected / self.trials


def _verdicts(method: Method, model: StepTimeModel, rng: np.random.Generator, n: int, trials: int, speed: float):
    """The verdict of B over A in each of `trials` pairs of n runs each, B `speed` times as fast."""
    times_a = model.step_times(rng, trials * n).reshape(trials, n, model.steps)
    times_b = model.step_times(rng, trials * n, speed).reshape(trials, n, model.steps)
    times_a[:, 0] *= model.slow_machine  # A's first run landed on the slow machine
    if method is compare_figure and not is_exact(n, n):
        # compare_figure's verdicts (tests/test_calibration.py checks), the drawn relabellings batched over pairs
        yield from throughput_verdicts(times_b, times_a, model.tokens_per_step)
        return
    figure: Figure | None = None
    for trial in range(trials):
        a = [synthetic_run("a", t, model.tokens_per_step, i) for i, t in enumerate(times_a[trial])]
        b = [synthetic_run("b", t, model.tokens_per_step, i) for i, t in enumerate(times_b[trial])]
        figure = figure or next(f for f in run_figures(a) if f.name == THROUGHPUT)
        result = method(figure, "b", b, "a", a)
        yield result.verdict if result is not None else ""


def calibrate(
    repeats: int,
    trials: int = TRIALS,
    seed: int = SEED,
    model: StepTimeModel = StepTimeModel(),
    method: Method = compare_figure,
    every_split: bool = False,
) -> Calibration:
    """`trials` A/A and `trials` B/A pairs of `repeats` runs each through `method`, from one fixed seed.

    `every_split` (the report's method only): each A/A pair's 2n runs are pooled and every split of them into n
    and n is compared, as the count over real runs does, so a pool's false verdicts are counted exactly and only
    the draw of the `trials` pools scatters; the B/A pairs are the same as without it."""
    _refuse_slow_machine_in_a_pool(model, every_split)
    rng = np.random.default_rng([seed, repeats])
    if not every_split:
        false_verdicts = sum(v in (HIGHER, LOWER) for v in _verdicts(method, model, rng, repeats, trials, 1.0))
        null_trials = None
    elif method is not compare_figure:
        raise ValueError("every_split counts the report's comparison (compare_figure) only")
    else:
        chosen = list(splits(2 * repeats, repeats, None, rng))
        times_a = model.step_times(rng, trials * repeats).reshape(trials, repeats, model.steps)
        times_b = model.step_times(rng, trials * repeats).reshape(trials, repeats, model.steps)
        times_a[:, 0] *= model.slow_machine  # as _verdicts draws them, so the B/A pairs after them are the same
        false_verdicts = 0
        for trial in range(trials):
            pool = [synthetic_run("a", t, model.tokens_per_step, i) for i, t in enumerate(times_a[trial])]
            pool += [synthetic_run("b", t, model.tokens_per_step, i) for i, t in enumerate(times_b[trial])]
            figure = next(f for f in run_figures(pool) if f.name == THROUGHPUT)
            false_verdicts += _figure_count(figure, pool, chosen)[1]
        null_trials = trials * len(chosen)
    detected = sum(v == HIGHER for v in _verdicts(method, model, rng, repeats, trials, DIFFERENCE))
    return Calibration(repeats, trials, false_verdicts, detected, null_trials)


def _refuse_slow_machine_in_a_pool(model: StepTimeModel, every_split: bool) -> None:
    """A slow machine is A's alone: pooled and split every way, its run lands on either side as often, and the
    count would test exchangeable runs again, which an exact test passes by construction."""
    if every_split and model.slow_machine != 1.0:
        raise ValueError("every_split pools A's slow-machine run with B's runs: count a slow machine pairwise")


def binomial_upper_count(trials: int, rate: float, alpha: float) -> int:
    """The largest count of a Binomial(trials, rate) that a test at level `alpha` still accepts: P(X > k) <= alpha.

    A method whose true false-verdict rate is `rate` shows more than k false verdicts in `trials` with
    probability at most `alpha`; more than k rejects "rate or below"."""
    return int(stats.binom.isf(alpha, trials, rate))


TARGET_REPEATS = (3, 4, 5)  # 3: no verdict is possible; 4: the fewest at which one pair can have one
TARGET_TRIALS = 400  # A/A pools (each split every way) and B/A pairs per row
TARGET_LOSS, TARGET_STEP = 7.0, 15


def exact_target_rate(repeats: int, level: float = 0.05) -> tuple[int, int]:
    """The exact log-rank test's false-verdict count over every relabelling of 2 x `repeats` distinct times
    (ranks 1 to 2n, all reached): (relabellings with p below `level`, all relabellings). Under no difference each
    relabelling is equally likely, so this is the test's size, with no sampling error (0 of 20 at 3 each, 2 of 70
    at 4, 12 of 252 = 4.76% at 5). The report's verdict also needs the medians to differ by the margin, so its
    rate is at most this."""
    total = hits = 0
    for a in itertools.combinations(range(2 * repeats), repeats):
        b = [i for i in range(2 * repeats) if i not in a]
        test = log_rank([Observation(i + 1.0, True) for i in a], [Observation(i + 1.0, True) for i in b])
        total += 1
        hits += test.p_value is not None and test.p_value < level
    return hits, total


FIGURE_BEYOND_EXACT = (10, 18)  # docs/statistics.md's repeat counts, both past the exact limit
TARGET_BEYOND_EXACT = (8, 10, 11)  # 8 each: past the figures' limit; 11: past the log-rank's (705,432)


def figure_test_size(
    repeats: int, pairs: int, seed: int = SEED, model: StepTimeModel = StepTimeModel()
) -> tuple[int, int]:
    """(false verdicts, pairs): `pairs` A/A pairs of `repeats` runs each given the report's throughput verdict
    (`verdict` of Welch's interval, the Monte Carlo p of Welch's t and the 2% margin), the tests batched over
    the pairs: compare_figure gives each pair the same (tests/test_calibration.py checks some)."""
    rng = np.random.default_rng([seed, repeats, 2])
    times = model.step_times(rng, 2 * pairs * repeats).reshape(2, pairs, repeats, model.steps)
    times[0, :, 0] *= model.slow_machine
    said = throughput_verdicts(times[1], times[0], model.tokens_per_step)
    return sum(v in (HIGHER, LOWER) for v in said), pairs


def throughput_verdicts(times_b: np.ndarray, times_a: np.ndarray, tokens_per_step: int) -> list[str]:
    """The throughput verdict of B over A for each pair of (pairs, runs, steps) step times, as compare_figure
    gives it to synthetic runs of these times, with the permutation tests batched over the pairs."""
    logs_a, logs_b = (np.log(tokens_per_step * t.shape[-1] / t.sum(axis=-1)) for t in (times_a, times_b))
    p = monte_carlo_p_of_many(logs_b, logs_a, welch_t)
    interval = stats.ttest_ind(logs_b, logs_a, equal_var=False, axis=-1).confidence_interval(CONFIDENCE)
    ratios = np.exp(logs_b.mean(axis=-1) - logs_a.mean(axis=-1))
    margin = schema.THROUGHPUT.margin
    return [
        verdict((math.exp(lo), math.exp(hi)), float(r), float(q), margin)
        for lo, hi, r, q in zip(interval.low, interval.high, ratios, p)
    ]


def target_test_size(repeats: int, draws: int, seed: int = SEED) -> tuple[int, int]:
    """(orders with log-rank p below 5%, orders): over the orders of 2 x `repeats` distinct times all reaching
    the target, every one where there are at most `draws`, else `draws` drawn. Under no difference each order is
    equally likely, so the share is the test's size; the report's verdict also needs the medians apart by the
    margin, so its rate is at most this. The p is `log_rank`'s for each order (batched over the orders)."""
    runs = 2 * repeats
    if relabellings(repeats, repeats) <= draws:
        sides = np.array(list(itertools.combinations(range(runs), repeats)))
    else:
        rng = np.random.default_rng([seed, repeats, 3])
        sides = np.sort(rng.permuted(np.tile(np.arange(runs), (draws, 1)), axis=1)[:, :repeats], axis=1)
    p = order_p_values(sides, runs)
    return int(np.count_nonzero(p < SIGNIFICANCE)), len(sides)


def order_p_values(sides: np.ndarray, runs: int) -> np.ndarray:
    """The log-rank p `log_rank` gives a's times at ranks `sides[k] + 1` of 1 to `runs` (all reached) against the
    rest, past the figures' exact limit, batched over the rows of `sides`: where `log_rank` enumerates, every
    relabelling's statistic once for all rows (the orders of the same times share them), with scipy's count and
    ties so that each p is `log_rank`'s to the bit; beyond, the drawn relabellings'."""
    rest = _complements(sides, runs)
    statistic = log_rank_statistics([Observation(i + 1.0, True) for i in range(runs)])
    if not log_rank_is_exact(sides.shape[1], runs - sides.shape[1]):
        return monte_carlo_p_of_many(sides, rest, statistic)
    every = np.array(list(itertools.combinations(range(runs), sides.shape[1])))
    null = np.sort(statistic(every, _complements(every, runs)))
    observed = statistic(sides, rest)
    margin = tie_margin(observed)
    less = np.searchsorted(null, observed + margin, side="right") / len(null)
    greater = (len(null) - np.searchsorted(null, observed - margin, side="left")) / len(null)
    return np.clip(np.minimum(less, greater) * 2, 0.0, 1.0)


def _complements(sides: np.ndarray, runs: int) -> np.ndarray:
    """Each row's runs of 0 to `runs` - 1 that are not in `sides`' row, ascending."""
    outside = np.ones((len(sides), runs), dtype=bool)
    np.put_along_axis(outside, sides, False, axis=1)
    return np.nonzero(outside)[1].reshape(len(sides), runs - sides.shape[1])


def beyond_exact_table(pairs: int, seed: int) -> list[str]:
    """The printed rows of --beyond_exact, with the largest count a true 5% rate gives at 1 in 1,000."""
    lines = [f"past the exact limit: Monte Carlo permutation p (analysis/permutation.py), seed {seed}"]
    rows = [(f"throughput, {n} runs each", *figure_test_size(n, pairs, seed)) for n in FIGURE_BEYOND_EXACT]
    rows += [(f"log-rank p < 5%, {n} runs each", *target_test_size(n, pairs, seed)) for n in TARGET_BEYOND_EXACT]
    for name, hits, total in rows:
        bound = binomial_upper_count(total, SIGNIFICANCE, 0.001)
        low, high = stats.binomtest(hits, total).proportion_ci(0.95)
        lines.append(
            f"{name:<32} {hits:>6,} of {total:>7,} = {hits / total:6.2%} (95% CI {low:.2%}-{high:.2%}; "
            f"a 5% rate exceeds {bound:,} 1 time in 1,000)"
        )
    return lines


def target_run(strategy: str, times: np.ndarray, tokens_per_step: int, index: int) -> Run:
    """A run whose validation loss falls from 8.0 at step 10 to 6.0 at step 20, so it reaches 7.0 at step 15,
    as same-seed strategies do; its training time there is the sum of its first 15 step times."""
    run = synthetic_run(strategy, times, tokens_per_step, index)
    elapsed = np.cumsum(times)
    run.train = [TrainLine.from_dict({"step": i + 1, schema.ELAPSED.key: float(e)}) for i, e in enumerate(elapsed)]
    run.evals = [
        EvalLine.from_dict({"step": step, "tokens": step * tokens_per_step, schema.VAL_LOSS.key: loss})
        for step, loss in ((10, 8.0), (20, 6.0))
    ]
    return run


def calibrate_target(
    repeats: int,
    trials: int = TARGET_TRIALS,
    seed: int = SEED,
    model: StepTimeModel = StepTimeModel(),
    every_split: bool = False,
) -> Calibration:
    """`trials` A/A and B/A pairs of `repeats` runs each through the report's time-to-target comparison
    (`target_comparisons`): a false verdict is `sooner` or `later` on the seconds or the tokens of an A/A
    pair; the power, B (10% faster steps) called `sooner` than A on the seconds.

    `every_split`: each A/A pair's 2n runs are pooled and every split of them into n and n is compared, as the
    count over real runs does: the false verdicts of a pool's splits are then counted exactly, and only the
    draw of the `trials` pools scatters (an exact test decides at most 6 of the 126 splits of 10 runs)."""
    _refuse_slow_machine_in_a_pool(model, every_split)
    rng = np.random.default_rng([seed, repeats, 1])
    counts = []
    chosen = list(splits(2 * repeats, repeats, None, rng)) if every_split else []
    for speed in (1.0, DIFFERENCE):
        times_a = model.step_times(rng, trials * repeats).reshape(trials, repeats, model.steps)
        times_b = model.step_times(rng, trials * repeats, speed).reshape(trials, repeats, model.steps)
        times_a[:, 0] *= model.slow_machine
        hits = 0
        for trial in range(trials):
            runs = {
                "b": [target_run("b", t, model.tokens_per_step, i) for i, t in enumerate(times_b[trial])],
                "a": [target_run("a", t, model.tokens_per_step, i) for i, t in enumerate(times_a[trial])],
            }
            if speed == 1.0 and every_split:
                pool = [*runs["a"], *runs["b"]]
                verdicts = _target_split_verdicts(pool, TARGET_LOSS, chosen)
                hits += sum(any(said in FALSE for said in split.values()) for split in verdicts)
                continue
            pairs = target_comparisons(runs, TARGET_LOSS)
            if speed == 1.0:
                hits += any(p["verdict"] in FALSE for p in pairs)
            else:
                hits += any(p["figure"] == "seconds" and p["verdict"] == SOONER for p in pairs)
        counts.append(hits)
    return Calibration(repeats, trials, counts[0], counts[1], trials * len(chosen) if every_split else None)


# ---------------------------------------------------------------------------------------------
# A/A splits of real runs

REAL_REPEATS = (2, 3, 4, 5)
FALSE = frozenset({HIGHER, LOWER, SOONER, LATER})
# A verdict needs p below SIGNIFICANCE (`verdict`, `_target_verdict`): a split whose exact p is at least twice
# that cannot give one, and only the others go through the report's comparison, which decides.
SCREEN = 2 * SIGNIFICANCE


class PoolError(ValueError):
    """A folder that is no A/A pool (no runs, or runs of several strategies); the message is one line."""


class PooledRun(Run):
    """A run read from its folder whose summary is read into its record once: Run reads it afresh at every
    access (to follow edits), which would be most of the time of a count over every split of the pool."""

    @cached_property
    def record(self) -> RunSummary | None:  # type: ignore[override]
        return super().record


def pooled_runs(folder: Path) -> list[Run]:
    """The complete runs below `folder` (an experiment's OUT, or its runs/), which must all be one strategy."""
    loaded = [load_run(path.parent) for path in sorted(folder.glob("**/summary.json"))]
    runs: list[Run] = [PooledRun(**{f.name: getattr(run, f.name) for f in fields(Run)}) for run in loaded]
    runs = [run for run in runs if run.usable and run.complete]
    if len(runs) < 2 * REAL_REPEATS[0]:
        raise PoolError(f"{folder} holds {len(runs)} complete runs; an A/A split needs at least {2 * REAL_REPEATS[0]}")
    strategies = sorted({run.strategy for run in runs})
    if len(strategies) > 1:
        raise PoolError(
            f"{folder} holds runs of {', '.join(strategies)}; A/A splits pool runs of one strategy "
            "(python -m analysis.experiment --strategies ddp ddp --repeats 6)"
        )
    differing = pool_mismatch(runs)
    if differing is not None:
        raise PoolError(f"{folder} holds runs of different {differing}; A/A splits pool runs of one experiment")
    return sort_runs(runs)


# What runs pooled as one strategy's repeats must share, or a split would compare two set-ups, not noise.
POOL_FACTS = {
    "experiment": "experiments",
    "preset": "presets",
    "steps": "steps",
    "world_size": "world sizes",
    "device_name": "devices",
}


def pool_mismatch(runs: Sequence[Run]) -> str | None:
    """The first of POOL_FACTS on which the runs differ, with the values seen; None when they agree."""
    for key, name in POOL_FACTS.items():
        values = sorted({repr(run.fact(key)) for run in runs})
        if len(values) > 1:
            return f"{name} ({', '.join(values)})"
    return None


def distinct_splits(pool: int, n: int) -> int:
    """Ways to take two groups of n from `pool` runs, unordered: C(pool, n) C(pool - n, n) / 2."""
    return math.comb(pool, n) * math.comb(pool - n, n) // 2


Split = tuple[tuple[int, ...], tuple[int, ...]]


def splits(pool: int, n: int, limit: int | None, rng: np.random.Generator) -> Iterator[Split]:
    """Two groups of n run indices each: every distinct split (each once, the smaller first) when `limit` is None
    or at least their number, else `limit` distinct ones drawn at random."""
    if limit is None or distinct_splits(pool, n) <= limit:
        for a in itertools.combinations(range(pool), n):
            rest = [i for i in range(pool) if i not in a]
            yield from ((a, b) for b in itertools.combinations(rest, n) if a < b)
        return
    seen: set[Split] = set()
    while len(seen) < limit:
        order = rng.permutation(pool)
        first, second = sorted((tuple(sorted(order[:n].tolist())), tuple(sorted(order[n : 2 * n].tolist()))))
        if (first, second) not in seen:
            seen.add((first, second))
            yield first, second


@dataclass(frozen=True)
class RealCount:
    """False verdicts of one figure over the A/A splits of n runs each."""

    figure: str
    repeats: int
    splits: int
    distinct: int
    false_verdicts: int

    @property
    def false_rate(self) -> float:
        return self.false_verdicts / self.splits


def default_target(runs: Sequence[Run]) -> float | None:
    """Halfway between the first and the last validation loss of the first run with two: same-seed runs reach
    it between two evaluations, so the tokens are interpolated and the seconds are each run's own."""
    for run in runs:
        losses = [e.val_loss for e in run.evals if e.val_loss is not None]
        if len(losses) >= 2 and losses[0] > losses[-1]:
            return (losses[0] + losses[-1]) / 2
    return None


def _sides(runs: Sequence[Run], split: Split) -> tuple[list[Run], list[Run]]:
    return [runs[i] for i in split[0]], [runs[i] for i in split[1]]


def split_p_values(figure: Figure, runs: Sequence[Run], chosen: Sequence[Split]) -> np.ndarray | None:
    """The exact p `compare_figure` tests each split with (the difference of mean logarithms over every
    relabelling of its runs), for all of `chosen` in batched calls of the same scipy test (`exact_p_of_many`).
    None where compare_figure would test something else: a run without the figure or with a value not positive,
    groups of one run or beyond the exact test's limit."""
    values = [figure.value(run) for run in runs]
    if not chosen or any(v is None or not math.isfinite(v) or v <= 0 for v in values):
        return None
    n1, n2 = len(chosen[0][0]), len(chosen[0][1])
    if min(n1, n2) < 2 or not is_exact(n1, n2) or any((len(a), len(b)) != (n1, n2) for a, b in chosen):
        return None
    logs = np.log(np.asarray(values, dtype=float))
    return exact_p_of_many(logs[[list(a) for a, _ in chosen]], logs[[list(b) for _, b in chosen]], mean_difference)


def _figure_count(figure: Figure, runs: Sequence[Run], chosen: Sequence[Split]) -> tuple[int, int]:
    """(splits compared, false verdicts) of one figure: each split that can give a verdict, or every split
    where its p cannot be batched, through `compare_figure`."""
    if all(figure.value(run) is None for run in runs):
        return 0, 0  # no run has it (a step peak on a CPU without the record): compare_figure has nothing
    p = split_p_values(figure, runs, chosen)
    compared = false = 0
    for k, split in enumerate(chosen):
        if p is not None and p[k] >= SCREEN:  # no verdict possible; compare_figure returns a comparison here
            compared += 1
            continue
        side_a, side_b = _sides(runs, split)
        result = compare_figure(figure, "b", side_b, "a", side_a)
        compared += result is not None
        false += result is not None and result.verdict in FALSE
    return compared, false


TO_TARGET = "to target: "
TARGET_FIGURES = ("seconds", "tokens")


def _target_split_verdicts(runs: Sequence[Run], target: float, chosen: Sequence[Split]) -> Iterator[dict[str, str]]:
    """Per split of `chosen`, the verdict on the time and on the tokens to `target`. Each run's point at the target
    is taken once (`target_observations` is per run); a split whose log-rank p on either figure (the report's own
    `log_rank`, exact and cached by the order of the times) is below SCREEN goes through `target_comparisons`,
    which decides; the others are `no detectable difference`, which is all `_target_verdict` gives a p at least
    0.05. Where a run has no evaluation, every split goes through target_comparisons."""
    points = [target_observations([run], target, None) for run in runs]
    screened = all(points)
    for a, b in chosen:
        if screened:
            tests = [log_rank(_observations(points, a, key), _observations(points, b, key)) for key in TARGET_FIGURES]
            if all(t.p_value is None or t.p_value >= SCREEN for t in tests):
                yield dict.fromkeys(TARGET_FIGURES, SAME)
                continue
        side_a, side_b = _sides(runs, (a, b))
        yield {pair["figure"]: pair["verdict"] for pair in target_comparisons({"b": side_b, "a": side_a}, target)}


def _target_counts(runs: Sequence[Run], target: float, chosen: Sequence[Split]) -> dict[str, tuple[int, int]]:
    """(splits compared, false verdicts) of the time and the tokens to `target`."""
    tally = {key: [0, 0] for key in TARGET_FIGURES}
    for verdicts in _target_split_verdicts(runs, target, chosen):
        for key, said in verdicts.items():
            tally[key][0] += 1
            tally[key][1] += said in FALSE
    return {key: (seen, false) for key, (seen, false) in tally.items()}


def _observations(
    points: Sequence[list[tuple[TargetPoint, bool]]], group: Sequence[int], key: str
) -> list[Observation]:
    """The group's runs as `target_comparisons` hands them to the log-rank test."""
    return [Observation(getattr(p, key), reached) for i in group for p, reached in points[i]]


def calibrate_real(
    runs: Sequence[Run], target: float | None, limit: int | None = None, seed: int = SEED
) -> list[RealCount]:
    """Per figure (the time and the tokens to `target` included, when given) and n, the false verdicts over
    the splits of `runs` into two groups of n, through the report's own comparisons of one pair: every split,
    or `limit` drawn at random from the seed. A figure no split could compare has no count."""
    figures = run_figures(runs)
    counts = []
    for n in (n for n in REAL_REPEATS if 2 * n <= len(runs)):
        chosen = list(splits(len(runs), n, limit, np.random.default_rng([seed, n])))
        distinct = distinct_splits(len(runs), n)
        tallies = {f.name: _figure_count(f, runs, chosen) for f in figures}
        if target is not None:
            tallies |= {f"{TO_TARGET}{key}": c for key, c in _target_counts(runs, target, chosen).items()}
        counts += [RealCount(name, n, seen, distinct, false) for name, (seen, false) in tallies.items() if seen]
    return counts


# ---------------------------------------------------------------------------------------------
# What the splits cannot see: the arms as run, and drift over the launch order

ORDER_FILE = "order.json"


@dataclass(frozen=True)
class Trial:
    """Two groups of a real A/A experiment's runs compared once, per figure: (verdict, p). One trial per
    experiment, not a rate: many experiments make a rate."""

    name: str
    runs_a: int
    runs_b: int
    verdicts: dict[str, tuple[str, float | None]]

    @property
    def flagged(self) -> list[str]:
        """The figures given a verdict: for two groups of one strategy, a false one."""
        return [name for name, (said, _) in self.verdicts.items() if said in FALSE]


def pair_verdicts(
    runs_a: Sequence[Run], runs_b: Sequence[Run], target: float | None, names: tuple[str, str] = ("a", "b")
) -> dict[str, tuple[str, float | None]]:
    """a against b on every figure and, with `target`, the time and the tokens to it: the report's verdicts of
    this one pair and their p."""
    a, b = names
    out = {}
    for figure in run_figures([*runs_a, *runs_b]):
        result = compare_figure(figure, a, runs_a, b, runs_b)
        if result is not None:
            out[figure.name] = (result.verdict, result.p_adjusted)
    if target is not None:
        for pair in target_comparisons({a: list(runs_a), b: list(runs_b)}, target):
            out[f"{TO_TARGET}{pair['figure']}"] = (pair["verdict"], pair["p_adjusted"])
    return out


def arms_as_run(runs: Sequence[Run], target: float | None) -> Trial | None:
    """The second arm against the first as the experiment ran them (ddp#2 against ddp, interleaved): the
    experiment's own A/A comparison. None unless the runs hold exactly two arms."""
    groups = group_by_strategy(runs)
    if len(groups) != 2:
        return None
    (first, runs_1), (second, runs_2) = groups.items()
    name = f"as run: {second} vs {first} ({len(runs_2)} vs {len(runs_1)})"
    return Trial(name, len(runs_2), len(runs_1), pair_verdicts(runs_2, runs_1, target, (second, first)))


def order_file(folder: Path) -> Path | None:
    """The experiment's record of its launch order: OUT/runs/order.json, given OUT or OUT/runs."""
    for path in (folder / "runs" / ORDER_FILE, folder / ORDER_FILE):
        if path.is_file():
            return path
    return None


def launch_order(folder: Path, runs: Sequence[Run]) -> list[Run] | None:
    """`runs` in the order the experiment launched them (order.json's rows; a run launched again after an
    interruption at its last launch). None when there is no order.json or it does not name every run."""
    path = order_file(folder)
    if path is None:
        return None
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))["runs"]
        dirs = [Path(row["run_dir"]).parts for row in rows]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    base = path.parent.resolve()
    position = {}
    for run in runs:
        try:
            tail = run.path.resolve().relative_to(base).parts  # arm/rK below runs/, however OUT was spelt
        except ValueError:
            return None
        at = [i for i, parts in enumerate(dirs) if parts[len(parts) - len(tail) :] == tail]
        if not at:
            return None
        position[id(run)] = at[-1]
    return sorted(runs, key=lambda run: position[id(run)])


def drift(folder: Path, runs: Sequence[Run], target: float | None) -> Trial | None:
    """The second half of the runs in launch order against the first (the middle one left out of an odd
    pool): a machine that slows down over the experiment shows here, and in no split of the pooled runs.
    None without a launch order naming every run."""
    ordered = launch_order(folder, runs)
    if ordered is None:
        return None
    half = len(ordered) // 2
    first, second = ordered[:half], ordered[len(ordered) - half :]
    name = f"drift: last {half} launched vs first {half}"
    return Trial(name, half, half, pair_verdicts(second, first, target, ("second half", "first half")))


def real_table(folder: Path, target: float | None, limit: int | None, seed: int) -> list[str]:
    """The printed table of --runs: one line per figure, one column per n, then the two single trials."""
    runs = pooled_runs(folder)
    target = target if target is not None else default_target(runs)
    counts = calibrate_real(runs, target, limit, seed)
    per_n = {c.repeats: c.splits for c in counts}
    ns = sorted(per_n)
    by = {(c.figure, c.repeats): c for c in counts}
    target_line = f"target loss {target:.4g}" if target is not None else "no target (the runs have no falling loss)"
    how = "every split" if limit is None else f"at most {limit} splits per n drawn with seed {seed}"
    lines = [
        f"{len(runs)} complete {runs[0].strategy} runs of {folder}, pooled; {target_line}; {how}",
        "splits per n (of the distinct splits): "
        + ", ".join(f"n={n}: {per_n[n]:,} (of {distinct_splits(len(runs), n):,})" for n in ns),
        f"{'figure':<28}" + "".join(f"{f'n={n}':>22}" for n in ns),
    ]
    names = list(dict.fromkeys(f for f, _ in by))
    for name in names:
        cells = [by.get((name, n)) for n in ns]
        lines.append(
            f"{name:<28}"
            + "".join(
                f"{f'{c.false_verdicts:,}/{c.splits:,} {c.false_rate:.2%}':>22}" if c else f"{'':>22}" for c in cells
            )
        )
    as_run, drifted = arms_as_run(runs, target), drift(folder, runs, target)
    lines.append("single trials (one per experiment: a verdict is this experiment's outcome, not a rate):")
    if as_run is None:
        lines.append(f"as run: none (the runs hold {len(group_by_strategy(runs))} arms, not 2)")
    if drifted is None:
        lines.append(f"drift: none (no runs/{ORDER_FILE} naming every run)")
    trials = [t for t in (as_run, drifted) if t is not None]
    if trials:
        lines.append(f"{'figure':<28}" + "".join(f"  {t.name:<44}" for t in trials))
        for name in dict.fromkeys([*names, *(f for t in trials for f in t.verdicts)]):
            lines.append(f"{name:<28}" + "".join(f"  {_verdict_cell(t.verdicts.get(name)):<44}" for t in trials))
        lines += [primary_line(t) for t in trials]
    return lines


# A trial's one test: the throughput. Training time and the seconds to the target are the same runs' clock read
# other ways, and ten uncorrected figures would give a false verdict somewhere far more often than 5%.
PRIMARY = THROUGHPUT


def primary_line(trial: Trial) -> str:
    """The trial's verdict: its primary figure's, one test of one trial; the other rows describe it."""
    cell = _verdict_cell(trial.verdicts.get(PRIMARY)) or "none (no throughput)"
    return (
        f"{trial.name}: primary figure {PRIMARY}: {cell} (one trial; the other rows are uncorrected and describe it; "
        "no verdict is no evidence of no difference)"
    )


def _verdict_cell(cell: tuple[str, float | None] | None) -> str:
    if cell is None:
        return ""
    said, p = cell
    return said if p is None else f"{said}, p = {p:.3g}"


def table(trials: int, seed: int) -> list[str]:
    """The printed table: the report's method at each repeat count, and the step-time bootstrap at n = 1. Where
    the exact test decides (2 to 5 runs each), the false verdicts are counted over every split of each A/A pool."""
    rows = [("step-time bootstrap (one run each)", calibrate(1, trials, seed, method=step_bootstrap_comparison))]
    rows += [("report (compare_figure)", calibrate(n, trials, seed, every_split=1 < n <= 5)) for n in REPEATS]
    rows += [("report, heavy tails", calibrate(n, trials, seed, model=HEAVY_TAILS)) for n in HEAVY_REPEATS]
    lines = [
        f"{trials} A/A and {trials} B/A pairs per row (B {DIFFERENCE - 1:.0%} faster), seed {seed}; {StepTimeModel()}",
        f"heavy tails: {HEAVY_TAILS}",
        "at 2 to 5 runs each the false verdicts are counted over every split of each A/A pair's pooled runs, "
        "except with heavy tails: pairs, A's first run on the slow machine",
        f"{'method':<36} {'runs each':>9} {'false verdicts':>15} {'power':>7}",
    ]
    lines += [_row(name, c) for name, c in rows]
    pools = min(trials, TARGET_TRIALS)
    targets = [
        (f"time to target{label}", calibrate_target(n, pools, seed, model, every_split=model.slow_machine == 1.0))
        for label, model in (("", StepTimeModel()), (", heavy tails", HEAVY_TAILS))
        for n in TARGET_REPEATS
    ]
    lines.append(
        f"time to target: false verdicts over every split of {pools} A/A pools of 2n runs (heavy tails: {pools} "
        f"A/A pairs), power over {pools} B/A pairs; loss reached at step {TARGET_STEP}"
    )
    lines += [_row(name, c) for name, c in targets]
    lines.append("time to target, exact: the exact log-rank test's size over every relabelling (no sampling error)")
    for n in TARGET_REPEATS:
        hits, total = exact_target_rate(n)
        lines.append(f"{'time to target (enumerated)':<36} {n:>9} {hits / total:>15.2%} ({hits} of {total})")
    return lines


def _row(name: str, c: Calibration) -> str:
    row = f"{name:<36} {c.repeats:>9} {c.false_rate:>15.2%} {c.power:>7.1%}"
    return row if c.null_trials is None else f"{row} ({c.false_verdicts:,} of {c.null_trials:,} splits)"


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m analysis.calibration", description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=TRIALS, help=f"pairs of each kind per row (default {TRIALS})")
    parser.add_argument("--seed", type=int, default=SEED, help=f"random seed (default {SEED})")
    parser.add_argument(
        "--runs",
        type=Path,
        metavar="OUT",
        help="count false verdicts over A/A splits of the runs below OUT (an experiment of one strategy, e.g. "
        "--strategies ddp ddp --repeats 6) instead of simulating",
    )
    parser.add_argument(
        "--target_loss",
        type=target_loss_flag,
        metavar="LOSS",
        help="with --runs: the time to this validation loss is a figure too (default: halfway between the first "
        "run's first and last validation loss)",
    )
    parser.add_argument(
        "--splits",
        type=int,
        help="with --runs: draw this many splits per n at random from the seed instead of taking every split "
        "(default: every split, no sampling error)",
    )
    parser.add_argument(
        "--beyond_exact",
        type=int,
        metavar="PAIRS",
        help="print the false-verdict rates of the Monte Carlo permutation tests past the exact limit instead: "
        "PAIRS A/A pairs per row",
    )
    args = parser.parse_args(argv)
    if args.beyond_exact is not None:
        if args.beyond_exact < 1:
            print("error: --beyond_exact must be at least 1", file=sys.stderr)
            return EXIT_BAD_INPUT
        print("\n".join(beyond_exact_table(args.beyond_exact, args.seed)))
        return 0
    if args.trials < 1:
        print("error: --trials must be at least 1", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.splits is not None and args.splits < 1:
        print("error: --splits must be at least 1", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.runs is None:
        print("\n".join(table(args.trials, args.seed)))
        return 0
    try:
        lines = real_table(args.runs, args.target_loss, args.splits, args.seed)
    except PoolError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
