"""How often a comparison is wrong: A/A and B/A pairs of synthetic runs fed to the report's own functions, and
A/A splits of a real experiment's runs.

    python -m analysis.calibration [--trials N] [--seed S]
    python -m analysis.calibration --runs OUT [--target_loss L] [--splits N] [--seed S]

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
pooled and split into two groups of n (n = 2 to 5), every distinct split where there are at most --splits of
them, else that many drawn without replacement from the seed; each split goes through the report's comparison
of every figure and of the time to the target, and a `higher`/`lower`/`sooner`/`later` is a false verdict. The
splits share runs, so they are not independent experiments: the rate they give is the machine's, measured on
these runs, with more scatter than a binomial count of independent pairs would have.
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from analysis.compare import target_loss as target_loss_flag
from analysis.runs import Run, load_run, sort_runs
from analysis.uncertainty import (
    HIGHER,
    LOWER,
    THROUGHPUT,
    Comparison,
    Figure,
    compare_figure,
    run_figures,
    step_bootstrap_comparison,
    target_comparisons,
)
from training import run_schema as schema
from training.cli import EXIT_BAD_INPUT, OneLineParser
from training.record import EvalLine, RunTotals, TrainLine

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
    # much slower), and the first run of each side on one slow machine, this much slower (1.0: none).
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

    @property
    def false_rate(self) -> float:
        return self.false_verdicts / self.trials

    @property
    def power(self) -> float:
        return self.detected / self.trials


def _verdicts(method: Method, model: StepTimeModel, rng: np.random.Generator, n: int, trials: int, speed: float):
    """The verdict of B over A in each of `trials` pairs of n runs each, B `speed` times as fast."""
    times_a = model.step_times(rng, trials * n).reshape(trials, n, model.steps)
    times_b = model.step_times(rng, trials * n, speed).reshape(trials, n, model.steps)
    times_a[:, 0] *= model.slow_machine  # A's first run landed on the slow machine
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
) -> Calibration:
    """`trials` A/A and `trials` B/A pairs of `repeats` runs each through `method`, from one fixed seed."""
    rng = np.random.default_rng([seed, repeats])
    false_verdicts = sum(v in (HIGHER, LOWER) for v in _verdicts(method, model, rng, repeats, trials, 1.0))
    detected = sum(v == HIGHER for v in _verdicts(method, model, rng, repeats, trials, DIFFERENCE))
    return Calibration(repeats, trials, false_verdicts, detected)


def binomial_upper_count(trials: int, rate: float, alpha: float) -> int:
    """The largest count of a Binomial(trials, rate) that a test at level `alpha` still accepts: P(X > k) <= alpha.

    A method whose true false-verdict rate is `rate` shows more than k false verdicts in `trials` with
    probability at most `alpha`; more than k rejects "rate or below"."""
    return int(stats.binom.isf(alpha, trials, rate))


TARGET_REPEATS = (3, 4, 5)  # 3: no verdict is possible; 4: the fewest at which one pair can have one
TARGET_TRIALS = 200  # the exact log-rank recomputes scipy's statistic per relabelling: 252 at 5 runs each
TARGET_LOSS, TARGET_STEP = 7.0, 15


def exact_target_rate(repeats: int, level: float = 0.05) -> tuple[int, int]:
    """The exact log-rank test's false-verdict count over every relabelling of 2 x `repeats` distinct times
    (ranks 1 to 2n, all reached): (relabellings with p below `level`, all relabellings). Under no difference each
    relabelling is equally likely, so this is the test's size, with no sampling error (0 of 20 at 3 each, 2 of 70
    at 4, 12 of 252 = 4.76% at 5). The report's verdict also needs the medians to differ by the margin, so its
    rate is at most this."""
    from analysis.survival import Observation, log_rank

    total = hits = 0
    for a in itertools.combinations(range(2 * repeats), repeats):
        b = [i for i in range(2 * repeats) if i not in a]
        test = log_rank([Observation(i + 1.0, True) for i in a], [Observation(i + 1.0, True) for i in b])
        total += 1
        hits += test.p_value is not None and test.p_value < level
    return hits, total


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
    repeats: int, trials: int = TARGET_TRIALS, seed: int = SEED, model: StepTimeModel = StepTimeModel()
) -> Calibration:
    """`trials` A/A and B/A pairs of `repeats` runs each through the report's time-to-target comparison
    (`target_comparisons`): a false verdict is `sooner` or `later` on the seconds or the tokens of an A/A
    pair; the power, B (10% faster steps) called `sooner` than A on the seconds."""
    rng = np.random.default_rng([seed, repeats, 1])
    counts = []
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
            pairs = target_comparisons(runs, TARGET_LOSS)
            if speed == 1.0:
                hits += any(p["verdict"] in ("sooner", "later") for p in pairs)
            else:
                hits += any(p["figure"] == "seconds" and p["verdict"] == "sooner" for p in pairs)
        counts.append(hits)
    return Calibration(repeats, trials, counts[0], counts[1])


# ---------------------------------------------------------------------------------------------
# A/A splits of real runs

REAL_REPEATS = (2, 3, 4, 5)
REAL_SPLITS = 200  # per n: every split where there are fewer, else this many drawn from the seed
FALSE = frozenset({HIGHER, LOWER, "sooner", "later"})


class PoolError(ValueError):
    """A folder that is no A/A pool (no runs, or runs of several strategies); the message is one line."""


def pooled_runs(folder: Path) -> list[Run]:
    """The complete runs below `folder` (an experiment's OUT, or its runs/), which must all be one strategy."""
    runs = [load_run(path.parent) for path in sorted(folder.glob("**/summary.json"))]
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


def splits(pool: int, n: int, limit: int, rng: np.random.Generator) -> Iterator[tuple[tuple[int, ...], ...]]:
    """Two groups of n run indices each: every distinct split when there are at most `limit`, else `limit`
    distinct ones drawn at random."""
    if distinct_splits(pool, n) <= limit:
        for a in itertools.combinations(range(pool), n):
            rest = [i for i in range(pool) if i not in a]
            yield from ((a, b) for b in itertools.combinations(rest, n) if a < b)
        return
    seen: set[tuple[tuple[int, ...], ...]] = set()
    while len(seen) < limit:
        order = rng.permutation(pool)
        split = tuple(sorted((tuple(sorted(order[:n].tolist())), tuple(sorted(order[n : 2 * n].tolist())))))
        if split not in seen:
            seen.add(split)
            yield split


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


def calibrate_real(
    runs: Sequence[Run], target: float | None, limit: int = REAL_SPLITS, seed: int = SEED
) -> list[RealCount]:
    """Per figure (the time and the tokens to `target` included, when given) and n, the false verdicts over
    the splits of `runs` into two groups of n, through the report's own comparisons of one pair."""
    figures = run_figures(runs)
    counts: dict[tuple[str, int], list[int]] = {}
    for n in (n for n in REAL_REPEATS if 2 * n <= len(runs)):
        rng = np.random.default_rng([seed, n])
        for a, b in splits(len(runs), n, limit, rng):
            side_a, side_b = [runs[i] for i in a], [runs[i] for i in b]
            verdicts = {
                f.name: c.verdict for f in figures if (c := compare_figure(f, "b", side_b, "a", side_a)) is not None
            }
            if target is not None:
                verdicts |= {
                    f"{TO_TARGET}{p['figure']}": p["verdict"]
                    for p in target_comparisons({"b": side_b, "a": side_a}, target)
                }
            for name, said in verdicts.items():
                tally = counts.setdefault((name, n), [0, 0])
                tally[0] += 1
                tally[1] += said in FALSE
    return [
        RealCount(name, n, seen, distinct_splits(len(runs), n), false) for (name, n), (seen, false) in counts.items()
    ]


TO_TARGET = "to target: "


def real_table(folder: Path, target: float | None, limit: int, seed: int) -> list[str]:
    """The printed table of --runs: one line per figure, one column per n."""
    runs = pooled_runs(folder)
    target = target if target is not None else default_target(runs)
    counts = calibrate_real(runs, target, limit, seed)
    per_n = {c.repeats: c.splits for c in counts}
    ns = sorted(per_n)
    by = {(c.figure, c.repeats): c for c in counts}
    target_line = f"target loss {target:.4g}" if target is not None else "no target (the runs have no falling loss)"
    lines = [
        f"{len(runs)} complete {runs[0].strategy} runs of {folder}, pooled; {target_line}; seed {seed}",
        "splits per n (of the distinct splits): "
        + ", ".join(f"n={n}: {per_n[n]} (of {distinct_splits(len(runs), n):,})" for n in ns),
        f"{'figure':<28}" + "".join(f"{f'n={n}':>16}" for n in ns),
    ]
    for name in dict.fromkeys(f for f, _ in by):
        cells = [by.get((name, n)) for n in ns]
        lines.append(
            f"{name:<28}"
            + "".join(f"{f'{c.false_verdicts}/{c.splits} {c.false_rate:.1%}':>16}" if c else f"{'':>16}" for c in cells)
        )
    return lines


def table(trials: int, seed: int) -> list[str]:
    """The printed table: the report's method at each repeat count, and the step-time bootstrap at n = 1."""
    rows = [("step-time bootstrap (one run each)", calibrate(1, trials, seed, method=step_bootstrap_comparison))]
    rows += [("report (compare_figure)", calibrate(n, trials, seed)) for n in REPEATS]
    rows += [("report, heavy tails", calibrate(n, trials, seed, model=HEAVY_TAILS)) for n in HEAVY_REPEATS]
    lines = [
        f"{trials} A/A and {trials} B/A pairs per row (B {DIFFERENCE - 1:.0%} faster), seed {seed}; {StepTimeModel()}",
        f"heavy tails: {HEAVY_TAILS}",
        f"{'method':<36} {'runs each':>9} {'false verdicts':>15} {'power':>7}",
    ]
    lines += [f"{name:<36} {c.repeats:>9} {c.false_rate:>15.1%} {c.power:>7.1%}" for name, c in rows]
    targets = [
        (f"time to target{label}", calibrate_target(n, min(trials, TARGET_TRIALS), seed, model))
        for label, model in (("", StepTimeModel()), (", heavy tails", HEAVY_TAILS))
        for n in TARGET_REPEATS
    ]
    lines.append(
        f"time to target: {min(trials, TARGET_TRIALS)} A/A and B/A pairs per row, loss reached at step {TARGET_STEP}"
    )
    lines += [f"{name:<36} {c.repeats:>9} {c.false_rate:>15.1%} {c.power:>7.1%}" for name, c in targets]
    lines.append("time to target, exact: the exact log-rank test's size over every relabelling (no sampling error)")
    for n in TARGET_REPEATS:
        hits, total = exact_target_rate(n)
        lines.append(f"{'time to target (enumerated)':<36} {n:>9} {hits / total:>15.2%} ({hits} of {total})")
    return lines


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
        "--splits", type=int, default=REAL_SPLITS, help=f"with --runs: splits per n at most (default {REAL_SPLITS})"
    )
    args = parser.parse_args(argv)
    if args.trials < 1:
        print("error: --trials must be at least 1", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.splits < 1:
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
