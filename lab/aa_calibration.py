"""How often the report calls identical strategies different: A/A false verdicts, simulated and on real runs.

    python -m lab.aa_calibration --simulate [--trials 4000]
    python -m lab.aa_calibration --runs OUT/runs/*/*      # an A/A experiment's runs

A false verdict is `established` between two arms that are the same strategy. The report's own decision
(analysis/uncertainty.py: compare_figure, Holm over the figure's pairs) is applied, per figure and number of
runs each (n = 2 to 10), to:
- **simulated runs**: three identical arms (three pairs, as single/ddp/fsdp), run-to-run noise on the log scale
  normal, heavy-tailed (Student's t with 3 degrees of freedom), with a slow drift over the launch order
  (rounds interleaved and shuffled, as analysis.experiment launches them), with an occasional slow run
  (1 in 10 runs 30% slower), and with the same drift over runs launched one strategy after another (what
  the guarantee does not cover: the row shows why the driver interleaves);
- **real runs**: random splits of a pool of runs of one strategy into two arms of n (one pair, so no
  correction), for every figure the report compares, the time and tokens to a target halfway down the
  pool's validation losses among them. The splits share runs, so the rate is a check of the rule on real
  figures (their tails, their drift), not a count of independent experiments.
Each row prints the rate with its binomial standard error at a true 5% (or at the rate, if larger). Nothing
of the product imports this module.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from analysis.runs import Run, load_run
from analysis.uncertainty import ESTABLISHED, Figure, compare_figure, run_figures

SIZES = range(2, 11)
ARMS = 3
SPREAD = 0.05  # run-to-run sd of the logarithm, about what repeated GPU runs vary by
SEED = 2026


@dataclass(frozen=True)
class Arm:
    """A stand-in for a strategy's runs: compare_figure reads only the figure's value of each."""

    values: tuple[float, ...]

    def fact(self, key: str) -> None:  # no seed: every simulated run is a unit of its own
        return None


def _noise(model: str, rng: np.random.Generator, n: int) -> np.ndarray:
    """ARMS x n log-scale deviations, in launch order (round k holds every arm's k-th run, shuffled)."""
    if model == "normal":
        return rng.normal(0, SPREAD, (ARMS, n))
    if model == "heavy tails":
        return rng.standard_t(3, (ARMS, n)) * SPREAD / math.sqrt(3)
    if model == "slow runs":
        return rng.normal(0, SPREAD / 2, (ARMS, n)) + np.log(np.where(rng.random((ARMS, n)) < 0.1, 1.3, 1.0))
    if model == "drift, one strategy after another":
        slots = np.arange(ARMS * n).reshape(ARMS, n)
        return rng.normal(0, SPREAD / 2, (ARMS, n)) + 0.002 * slots
    # drift: 1% per launch, each round's order shuffled
    slots = np.argsort(rng.random((n, ARMS)), axis=1).T + ARMS * np.arange(n)
    return rng.normal(0, SPREAD / 2, (ARMS, n)) + 0.01 * slots


MODELS = ("normal", "heavy tails", "drift", "slow runs", "drift, one strategy after another")


def false_rate(figure: Figure, arms: Sequence[Sequence[float]]) -> bool:
    """Whether the report establishes any difference between the arms (all of them identical)."""
    groups = {f"arm{i}": [Arm((v,)) for v in values] for i, values in enumerate(arms)}
    return any(c.status == ESTABLISHED for c in compare_figure(figure, groups, advise=False))  # type: ignore[arg-type]


def simulated(trials: int) -> list[tuple[str, int, float]]:
    """(model, n, rate of experiments with any false verdict among the three pairs)."""
    figure = Figure("x", "x", "s", lambda arm: arm.values[0], True, 0.02)  # type: ignore[attr-defined]
    rng = np.random.default_rng(SEED)
    out = []
    for model in MODELS:
        for n in SIZES:
            hits = sum(false_rate(figure, np.exp(_noise(model, rng, n))) for _ in range(trials))
            out.append((model, n, hits / trials))
    return out


def real(runs: Sequence[Run], splits: int) -> list[tuple[str, int, float, int]]:
    """(figure, n, false-verdict rate over random two-arm splits, splits) for every n the pool allows."""
    rng = np.random.default_rng(SEED)
    losses = sorted(loss for run in runs for line in run.evals if (loss := line.val_loss) is not None)
    target = (losses[0] + losses[-1]) / 2 if losses else None
    out = []
    for figure in run_figures(runs, target):
        for n in SIZES:
            if 2 * n > len(runs):
                break
            hits = 0
            for _ in range(splits):
                order = rng.permutation(len(runs))[: 2 * n]
                groups = {"a": [runs[i] for i in order[:n]], "b": [runs[i] for i in order[n:]]}
                hits += any(c.status == ESTABLISHED for c in compare_figure(figure, groups, advise=False))
            out.append((figure.name, n, hits / splits, splits))
    return out


def _row(label: str, n: int, rate: float, trials: int) -> str:
    error = math.sqrt(max(rate * (1 - rate), 0.05 * 0.95) / trials)
    return f"| {label} | {n} | {rate:.2%} | {error:.2%} |"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.aa_calibration", description=__doc__.splitlines()[0])
    parser.add_argument("--simulate", action="store_true", help="the simulated rows")
    parser.add_argument("--trials", type=int, default=4000, help="simulated experiments per row")
    parser.add_argument("--runs", type=Path, nargs="*", default=[], help="run folders of one strategy (an A/A pool)")
    parser.add_argument("--splits", type=int, default=2000, help="random splits of the pool per row")
    args = parser.parse_args(argv)
    header = "| {} | runs each | any false verdict | standard error at 5% |\n|---|---:|---:|---:|"
    if args.simulate:
        print(header.format(f"simulated noise (three identical arms, {SPREAD:.0%} spread)"))
        for model, n, rate in simulated(args.trials):
            print(_row(model, n, rate, args.trials))
    if args.runs:
        runs = [run for run in (load_run(path) for path in args.runs) if run.usable]
        strategies = sorted({run.strategy for run in runs})
        if len(strategies) != 1:
            print(
                f"error: an A/A pool is runs of one strategy; these are runs of {', '.join(strategies)}",
                file=sys.stderr,
            )
            return 2
        print(header.format(f"real figure ({len(runs)} runs, two arms)"))
        for name, n, rate, splits in real(runs, args.splits):
            print(_row(name, n, rate, splits))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
