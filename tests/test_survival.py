"""Kaplan-Meier medians and the log-rank test (analysis/survival.py) on cases worked by hand."""

from __future__ import annotations

import math

import pytest

from analysis.survival import LATER, NO_DIFFERENCE, SOONER, Observation, kaplan_meier, log_rank, median_time


def reached(*values: float) -> list[Observation]:
    return [Observation(v, True) for v in values]


def not_before(*values: float) -> list[Observation]:
    return [Observation(v, False) for v in values]


def test_with_every_run_reaching_it_the_median_is_the_ordinary_one() -> None:
    assert median_time(reached(3.0, 1.0, 2.0)) == 2.0
    assert median_time(reached(4.0, 1.0, 2.0, 3.0)) == 2.5  # half way at 2.0 until 3.0: the midpoint
    assert median_time(reached(5.0)) == 5.0


def test_a_run_censored_early_leaves_the_risk_set_without_a_step() -> None:
    # Not before 1.0, then reached at 2, 3 and 4: after 1.0 three are at risk, each reaching takes a third.
    assert kaplan_meier([*not_before(1.0), *reached(2.0, 3.0, 4.0)]) == [
        (2.0, pytest.approx(2 / 3)),
        (3.0, pytest.approx(1 / 3)),
        (4.0, pytest.approx(0.0)),
    ]
    assert median_time([*not_before(1.0), *reached(2.0, 3.0, 4.0)]) == 3.0


def test_fewer_than_half_reaching_it_has_no_median() -> None:
    assert median_time([*reached(2.0), *not_before(5.0, 6.0)]) is None
    assert median_time(not_before(5.0)) is None
    assert median_time([*reached(2.0), *not_before(5.0)]) == 2.0  # exactly half, and nothing after: its time


def test_log_rank_of_three_against_three_fully_separated() -> None:
    # Reachings of a at 1, 2, 3 with (3, 3), (2, 3), (1, 3) at risk: E = 1/2 + 2/5 + 1/4 = 1.15, O = 3,
    # V = 9/36 + 6/25 + 3/16 = 0.6775: chi2 = 1.85^2 / 0.6775 = 5.05, p = 0.0246.
    result = log_rank(reached(1.0, 2.0, 3.0), reached(4.0, 5.0, 6.0))
    assert result.expected_a == pytest.approx(1.15) and result.chi2 == pytest.approx(1.85**2 / 0.6775)
    assert result.p_value == pytest.approx(math.erfc(math.sqrt(result.chi2 / 2))) and result.p_value < 0.05
    assert result.verdict == SOONER
    assert log_rank(reached(4.0, 5.0, 6.0), reached(1.0, 2.0, 3.0)).verdict == LATER


def test_one_run_each_cannot_decide() -> None:
    result = log_rank(reached(1.0), reached(9.0))
    assert result.chi2 == pytest.approx(1.0) and result.verdict == NO_DIFFERENCE  # p = 0.32


def test_runs_that_never_reach_it_count_against_their_strategy() -> None:
    # b's runs were all seen above the target until after a's had reached it.
    assert log_rank(reached(1.0, 2.0, 3.0, 4.0), not_before(5.0, 5.0, 5.0, 5.0)).verdict == SOONER
    nothing = log_rank(not_before(1.0), not_before(2.0))
    assert nothing.chi2 is None and nothing.verdict == NO_DIFFERENCE
