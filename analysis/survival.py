"""Time to an event that some runs never reach: the Kaplan-Meier median and the log-rank test.

A run that never reached the target loss is not dropped: it is "not before" its last evaluation (censored
there), which is all it says. Dropping it would leave the runs that happened to get there, and bias the
median towards the lucky ones. Pure Python: the runs are few.

- E. L. Kaplan and P. Meier, "Nonparametric estimation from incomplete observations", JASA 53, 1958.
- N. Mantel, "Evaluation of survival data and two new rank order statistics arising in its consideration",
  Cancer Chemotherapy Reports 50, 1966 (the log-rank test).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

SIGNIFICANCE = 0.05
SOONER, LATER, NO_DIFFERENCE = "sooner", "later", "no detectable difference"


@dataclass(frozen=True)
class Observation:
    """One run: the time (or tokens) it reached the target at, or its last evaluation when it never did."""

    value: float
    reached: bool


def kaplan_meier(observations: Sequence[Observation]) -> list[tuple[float, float]]:
    """The survival curve: (time, share of runs not yet at the target just after it) at each reaching time.

    At a time where a run reaches the target and another is censored, the censored one still counts as at
    risk (it was seen not to have reached it by then), as is usual."""
    ordered = sorted(observations, key=lambda o: (o.value, not o.reached))
    at_risk, survival, curve = len(ordered), 1.0, []
    i = 0
    while i < len(ordered):
        time = ordered[i].value
        tied = [o for o in ordered[i:] if o.value == time]
        events = sum(o.reached for o in tied)
        if events:
            survival *= 1 - events / at_risk
            curve.append((time, survival))
        at_risk -= len(tied)
        i += len(tied)
    return curve


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
    """a against b: observed and expected reachings of a, the statistic, its p-value and the verdict."""

    observed_a: float
    expected_a: float
    chi2: float | None  # None: no reaching time at which both were at risk, so nothing to test
    p_value: float | None
    verdict: str  # a reaches the target SOONER / LATER than b, or NO_DIFFERENCE


def log_rank(a: Sequence[Observation], b: Sequence[Observation]) -> LogRank:
    """Mantel's log-rank test of a against b, chi-square with one degree of freedom, at 5%."""
    observed = expected = variance = 0.0
    for time in sorted({o.value for o in [*a, *b] if o.reached}):
        at_risk_a = sum(o.value >= time for o in a)
        at_risk_b = sum(o.value >= time for o in b)
        events_a = sum(o.reached and o.value == time for o in a)
        events = events_a + sum(o.reached and o.value == time for o in b)
        at_risk = at_risk_a + at_risk_b
        observed += events_a
        expected += events * at_risk_a / at_risk
        if at_risk > 1:
            variance += events * at_risk_a * at_risk_b * (at_risk - events) / (at_risk**2 * (at_risk - 1))
    if variance <= 0:
        return LogRank(observed, expected, None, None, NO_DIFFERENCE)
    chi2 = (observed - expected) ** 2 / variance
    p_value = math.erfc(math.sqrt(chi2 / 2))  # the chi-square(1) tail: a two-sided normal tail of sqrt(chi2)
    if p_value >= SIGNIFICANCE:
        return LogRank(observed, expected, chi2, p_value, NO_DIFFERENCE)
    return LogRank(observed, expected, chi2, p_value, SOONER if observed > expected else LATER)
