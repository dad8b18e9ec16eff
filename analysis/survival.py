"""Time to an event that some runs never reach: the Kaplan-Meier median and the log-rank test, on scipy.stats.

A run that never reached the target loss is not dropped: it is "not before" its last evaluation (censored
there), which is all it says. Dropping it would leave the runs that happened to get there, and bias the
median towards the lucky ones.

The curve is scipy.stats.ecdf of the runs as scipy.stats.CensoredData; the statistic comparing two
strategies is scipy.stats.logrank's. Its p-value is exact where the runs are few: the share of all
relabellings of the pooled runs whose log-rank statistic is at least as extreme (analysis/permutation.py),
up to 10 runs each; with more, the same share over relabellings drawn at random (`monte_carlo_p`). The chi-square
approximation is never used for a p: it calls identical strategies different one time in ten
at 3 runs each, where no relabelling can give p below 0.10, and 6.7% of the time at 8 each.

- E. L. Kaplan and P. Meier, "Nonparametric estimation from incomplete observations", JASA 53, 1958.
- N. Mantel, "Evaluation of survival data and two new rank order statistics arising in its consideration",
  Cancer Chemotherapy Reports 50, 1966 (the log-rank test).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import stats

from analysis.permutation import MONTE_CARLO, exact_p, is_exact, monte_carlo_p, relabellings

SOONER, LATER = "sooner", "later"
EXACT_LOG_RANK = "exact permutation test of the log-rank statistic (every relabelling of the runs)"
# The log-rank's relabellings are enumerated further than a figure's (permutation.EXACT_LIMIT): one matrix
# product gives every relabelling's statistic (`log_rank_statistics`), 10 runs against 10 (184,756) in about a
# second. Drawn relabellings from the one fixed seed called identical strategies different 5.10% of the time at 8
# runs each (every one of the 12,870 orders), the exact test 4.99% (docs/statistics.md).
LOG_RANK_EXACT_LIMIT = math.comb(20, 10)
MONTE_CARLO_LOG_RANK = f"{MONTE_CARLO}: the log-rank statistic (many runs)"


@dataclass(frozen=True)
class Observation:
    """One run: the time (or tokens) it reached the target at, or its last evaluation when it never did."""

    value: float
    reached: bool


def _censored(observations: Sequence[Observation]) -> stats.CensoredData:
    return stats.CensoredData(
        uncensored=[o.value for o in observations if o.reached],
        right=[o.value for o in observations if not o.reached],
    )


def kaplan_meier(observations: Sequence[Observation]) -> list[tuple[float, float]]:
    """The survival curve: (time, share of runs not yet at the target just after it) at each reaching time.

    At a time where a run reaches the target and another is censored, the censored one still counts as at
    risk (it was seen not to have reached it by then), as scipy's estimate has it."""
    reached = {o.value for o in observations if o.reached}
    if not reached:
        return []
    curve = stats.ecdf(_censored(observations)).sf
    return [(float(t), float(s)) for t, s in zip(curve.quantiles, curve.probabilities) if t in reached]


def median_time(observations: Sequence[Observation]) -> float | None:
    """The Kaplan-Meier median: the first time the share not yet there falls to half or below; where it is
    exactly half up to a later reaching time, the midpoint of the two (so, with every run reaching the target,
    the ordinary median). None when the curve never falls to half: fewer than half reached it."""
    curve = kaplan_meier(observations)
    for i, (time, survival) in enumerate(curve):
        if survival < 0.5 - 1e-12:
            return time
        if abs(survival - 0.5) <= 1e-12:
            return (time + curve[i + 1][0]) / 2 if i + 1 < len(curve) else time
    return None


@dataclass(frozen=True)
class LogRank:
    """a against b: the log-rank statistic, its two-sided p-value and the direction it points."""

    statistic: float | None  # Z: positive when a reaches the target more often than expected; None: nothing to test
    p_value: float | None  # None: no reaching time at which both were at risk, so nothing to test
    direction: str | None  # SOONER / LATER (a against b) from the sign of the statistic; None at 0
    test: str


def _log_rank(a: Sequence[Observation], b: Sequence[Observation]) -> tuple[float, float]:
    """scipy's log-rank statistic and large-sample p; nan for both when no reaching time had both at risk."""
    with warnings.catch_warnings():  # 0 / 0 there: read as "nothing to test"
        warnings.simplefilter("ignore", RuntimeWarning)
        result = stats.logrank(_censored(a), _censored(b))
    return float(result.statistic), float(result.pvalue)


def log_rank(a: Sequence[Observation], b: Sequence[Observation]) -> LogRank:
    """The log-rank statistic of a against b, its p-value exact over every relabelling when there are few
    (analysis/permutation.py), over relabellings drawn from a fixed seed otherwise.

    It is computed on the ranks of the values (`ranked`): the statistic counts the runs at risk and reaching
    the target at each time and never uses a time's value, so the ranks give the same statistic and p to the
    last bit, and runs whose times order the same way share one enumeration of the relabellings."""
    if not all(math.isfinite(o.value) for o in [*a, *b]):
        return _log_rank_test(tuple(a), tuple(b))
    return _log_rank_test(*ranked(a, b))


def ranked(a: Sequence[Observation], b: Sequence[Observation]) -> tuple[tuple[Observation, ...], ...]:
    """Each side with every value replaced by its rank among both sides' values (equal values share a rank,
    reached or not), each side in ascending order: the order pattern the log-rank statistic depends on."""
    rank = {value: float(i + 1) for i, value in enumerate(sorted({o.value for o in [*a, *b]}))}

    def side(observations: Sequence[Observation]) -> tuple[Observation, ...]:
        return tuple(sorted((Observation(rank[o.value], o.reached) for o in observations), key=_order))

    return side(a), side(b)


def _order(observation: Observation) -> tuple[float, bool]:
    return observation.value, observation.reached


# An A/A calibration over every split of 12 runs tests tens of thousands of pairs whose times order in a few
# hundred ways: each pattern's relabellings are enumerated once.
@lru_cache(maxsize=4096)
def _log_rank_test(a: tuple[Observation, ...], b: tuple[Observation, ...]) -> LogRank:
    z = _log_rank(a, b)[0]
    exact = log_rank_is_exact(len(a), len(b))
    test = EXACT_LOG_RANK if exact else MONTE_CARLO_LOG_RANK
    if not math.isfinite(z):
        if any(o.reached for o in [*a, *b]):
            # Every run at risk reached it at the same time: each relabelling is as extreme as this one.
            return LogRank(0.0, 1.0, None, test)
        return LogRank(None, None, None, test)  # no run reached it: nothing to test
    direction = SOONER if z > 0 else LATER if z < 0 else None
    pooled = [*a, *b]
    if not exact:
        statistic_of = log_rank_statistics(pooled)
        p = monte_carlo_p(np.arange(len(a)), np.arange(len(a), len(pooled)), statistic_of)
        return LogRank(z, p, direction, test)
    if not is_exact(len(a), len(b)):  # every relabelling at once, through the matrix product
        sides = np.arange(len(a)), np.arange(len(a), len(pooled))
        return LogRank(z, exact_p(*sides, log_rank_statistics(pooled), vectorized=True), direction, test)
    every = tuple(sorted(pooled, key=_order))

    def statistic(x: np.ndarray, y: np.ndarray) -> float:
        return _relabelled(every, tuple(sorted((pooled[i] for i in x), key=_order)))

    p = exact_p(np.arange(len(a)), np.arange(len(a), len(pooled)), statistic, vectorized=False)
    return LogRank(z, p, direction, test)


def log_rank_is_exact(n1: int, n2: int) -> bool:
    """Whether `log_rank` enumerates every relabelling of these counts (else it draws them)."""
    return n1 >= 1 and n2 >= 1 and relabellings(n1, n2) <= LOG_RANK_EXACT_LIMIT


def log_rank_statistics(pooled: Sequence[Observation]) -> Callable[..., np.ndarray]:
    """The log-rank statistic of many relabellings at once, as a vectorized statistic of index arrays into
    `pooled`: (..., n1) indices of a's runs and (..., n2) of b's. At each reaching time the runs at risk and
    reaching are sums over a side's runs of fixed 0/1 rows, so one matrix product gives them for every
    relabelling; the statistic is scipy.stats.logrank's (O - E) / sqrt(V), 0 where V is 0 (nothing to compare,
    as in `_relabelled`)."""
    values = np.array([o.value for o in pooled])
    reached = np.array([o.reached for o in pooled])
    times = np.unique(values[reached])
    at_risk = (values[:, None] >= times[None, :]).astype(float)  # (runs, times)
    events = ((values[:, None] == times[None, :]) & reached[:, None]).astype(float)
    n, d = at_risk.sum(axis=0), events.sum(axis=0)
    shrink = np.divide(n - d, n - 1, out=np.zeros_like(n), where=n > 1)

    def statistic(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
        side = np.moveaxis(np.asarray(x), axis, -1).astype(int)
        member = np.zeros((side.size // side.shape[-1], len(pooled)))
        np.put_along_axis(member, side.reshape(member.shape[0], -1), 1.0, axis=-1)
        share = (member @ at_risk).reshape(*side.shape[:-1], -1) / n  # a's share of those at risk at each time
        observed = (member @ events).sum(axis=-1).reshape(side.shape[:-1])
        expected = (d * share).sum(axis=-1)
        variance = (d * share * (1 - share) * shrink).sum(axis=-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            z = (observed - expected) / np.sqrt(variance)
        return np.where(variance > 0, z, 0.0)

    return statistic


# The statistic of one relabelling depends on which observations go to each side, not on the split it is a
# relabelling of: the 252 relabellings of 10 runs are computed once for all 252 splits of the same times.
@lru_cache(maxsize=1 << 16)
def _relabelled(pooled: tuple[Observation, ...], x: tuple[Observation, ...]) -> float:
    """The log-rank statistic of `x` against the rest of `pooled` (both in ascending order); 0 where no reaching
    time had both at risk: a relabelling with nothing to compare is no evidence."""
    rest = list(pooled)
    for observation in x:
        rest.remove(observation)
    value = _log_rank(x, rest)[0]
    return value if math.isfinite(value) else 0.0
