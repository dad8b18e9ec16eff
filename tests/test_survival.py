"""Kaplan-Meier medians and the exact log-rank test (analysis/survival.py) on cases worked by hand."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from analysis.permutation import MONTE_CARLO_RESAMPLES, exact_p
from analysis.survival import (
    EXACT_LOG_RANK,
    LATER,
    MONTE_CARLO_LOG_RANK,
    SOONER,
    Observation,
    _censored,
    _log_rank,
    _log_rank_test,
    kaplan_meier,
    log_rank,
    log_rank_statistics,
    median_time,
    ranked,
)
from analysis.uncertainty import SAME, _target_verdict


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


def test_log_rank_of_three_against_three_fully_separated_is_exact() -> None:
    # Reachings of a at 1, 2, 3 with (3, 3), (2, 3), (1, 3) at risk: E = 1/2 + 2/5 + 1/4 = 1.15, O = 3,
    # V = 9/36 + 6/25 + 3/16 = 0.6775: Z = 1.85 / sqrt(0.6775) = 2.25. The chi-square approximation's p of 0.025
    # is not what the runs allow: this split and its mirror are 2 of the C(6, 3) = 20 relabellings, p = 0.10.
    result = log_rank(reached(1.0, 2.0, 3.0), reached(4.0, 5.0, 6.0))
    assert result.statistic == pytest.approx(1.85 / math.sqrt(0.6775))
    assert result.p_value == pytest.approx(2 / 20) and result.test == EXACT_LOG_RANK
    assert result.direction == SOONER
    assert log_rank(reached(4.0, 5.0, 6.0), reached(1.0, 2.0, 3.0)).direction == LATER


def test_four_against_four_fully_separated_reaches_five_percent() -> None:
    result = log_rank(reached(1.0, 2.0, 3.0, 4.0), reached(5.0, 6.0, 7.0, 8.0))
    assert result.p_value == pytest.approx(2 / 70) and result.direction == SOONER


def test_one_run_each_cannot_decide() -> None:
    result = log_rank(reached(1.0), reached(9.0))
    assert result.p_value == 1.0  # two relabellings, both as extreme as the other


def test_runs_that_never_reach_it_count_against_their_strategy() -> None:
    # b's runs were all seen above the target until after a's had reached it.
    result = log_rank(reached(1.0, 2.0, 3.0, 4.0), not_before(5.0, 5.0, 5.0, 5.0))
    assert result.direction == SOONER and result.p_value == pytest.approx(2 / 70)
    nothing = log_rank(not_before(1.0), not_before(2.0))
    assert nothing.statistic is None and nothing.p_value is None


def test_runs_reaching_it_together_are_no_evidence() -> None:
    result = log_rank(reached(5.0, 5.0, 5.0), reached(5.0, 5.0, 5.0))
    assert result.p_value == 1.0 and result.direction is None


@pytest.mark.parametrize("runs", [8, 10])
def test_up_to_ten_runs_each_every_relabelling_is_enumerated(runs: int) -> None:
    # Past the figures' limit of 5,000 but within the log-rank's C(20, 10): a full separation is the most
    # extreme of all relabellings with its mirror, 2 of C(2n, n) exactly, not a count over drawn ones.
    result = log_rank(reached(*range(1, runs + 1)), reached(*range(runs + 1, 2 * runs + 1)))
    assert result.test == EXACT_LOG_RANK and result.direction == SOONER
    assert result.p_value == pytest.approx(2 / math.comb(2 * runs, runs), rel=1e-12)


def test_many_runs_draw_relabellings_with_the_observed_one_counted() -> None:
    # C(22, 11) = 705,432 relabellings: beyond the log-rank's exact limit, R drawn ones. Only the split itself and
    # its mirror are as extreme as a full separation (about 0.03 of the R draws), and the observed one counts too:
    # p is a whole count of 2 / (R + 1) at least one, never the chi-square's.
    result = log_rank(reached(*range(1, 12)), reached(*range(12, 23)))
    assert result.test == MONTE_CARLO_LOG_RANK and result.direction == SOONER
    counts = result.p_value * (MONTE_CARLO_RESAMPLES + 1) / 2
    assert counts == pytest.approx(round(counts)) and 1 <= round(counts) <= 6


def test_eight_against_eight_just_past_the_chi_square_cut_is_no_verdict() -> None:
    # a at ranks {1, 2, 3, 6, 7, 10, 11, 12} of 16: the chi-square p is 0.0499, the exact p 0.067 (the share of
    # the 12,870 relabellings at least as extreme); a verdict there would be the chi-square's liberal 6.7% size.
    a = reached(1, 2, 3, 6, 7, 10, 11, 12)
    b = reached(4, 5, 8, 9, 13, 14, 15, 16)
    chi_square = stats.logrank(
        stats.CensoredData(uncensored=[o.value for o in a]), stats.CensoredData(uncensored=[o.value for o in b])
    )
    assert chi_square.pvalue < 0.05
    result = log_rank(a, b)
    assert result.p_value == pytest.approx(0.067, abs=0.01) and result.p_value > 0.05
    pair = {"direction": result.direction, "median_a": median_time(a), "median_b": median_time(b), "margin": 0.02}
    assert _target_verdict(pair, result.p_value) == SAME


def test_the_batched_log_rank_statistic_is_scipys() -> None:
    # Ties, censoring and a time where both reach: the matrix form against scipy.stats.logrank split by split.
    rng = np.random.default_rng(7)
    for _ in range(200):
        n1, n2 = rng.integers(2, 7, 2)
        runs = [Observation(float(v), bool(r)) for v, r in zip(rng.integers(1, 6, n1 + n2), rng.random(n1 + n2) < 0.7)]
        a, b = runs[:n1], runs[n1:]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            expected = stats.logrank(_censored(a), _censored(b)).statistic
        got = log_rank_statistics(runs)(np.arange(n1)[None], np.arange(n1, n1 + n2)[None])[0]
        assert got == pytest.approx(expected if np.isfinite(expected) else 0.0, abs=1e-9)


def test_half_way_at_the_second_last_reaching_time_takes_the_midpoint_to_the_last() -> None:
    # Two runs: half are there at 1.0 and stay half until 2.0, the last reaching time; the ordinary median.
    assert median_time(reached(1.0, 2.0)) == 1.5
    # 3/4 after 1.0, 3/4 x 2/3 = 1/2 after 3.0, the last reaching time: no later one to go half way to.
    assert median_time([*reached(1.0, 3.0), *not_before(4.0, 4.0)]) == 3.0


def test_what_a_test_that_cannot_decide_says() -> None:
    # Runs that reach it at one time together: a statistic of exactly 0 (no direction), p = 1, and the name of
    # the exact test that was asked; runs that never reach it: nothing to test, still named.
    tied = log_rank(reached(5.0, 5.0, 5.0), reached(5.0, 5.0, 5.0))
    assert tied.statistic == 0.0 and tied.test == EXACT_LOG_RANK
    nothing = log_rank(not_before(1.0), not_before(2.0))
    assert nothing.test == EXACT_LOG_RANK


def test_many_runs_report_the_statistic_they_read() -> None:
    # Eight against eight fully separated: the same Z as scipy.stats.logrank's, positive (a sooner).
    a, b = reached(*range(1, 9)), reached(*range(9, 17))
    result = log_rank(a, b)
    expected = stats.logrank(
        stats.CensoredData(uncensored=list(range(1, 9))), stats.CensoredData(uncensored=list(range(9, 17)))
    )
    assert result.statistic == pytest.approx(expected.statistic) and result.statistic > 0


def test_a_relabelling_with_nothing_to_compare_counts_as_a_statistic_of_zero() -> None:
    # a = (not before 1, reached 2), b = (not before 1, not before 2): Z = 1 (at 2: a has 1 of 2 at risk, 1
    # event: O - E = 1/2, V = 1/4). Of the C(4, 2) = 6 relabellings, the two that put both "not before 1" on
    # one side leave that side no run at risk at 2: no statistic, counted as 0 (no evidence). The others
    # give Z = +1 (2 of them, the observed included) or -1 (2). Two-sided: 2 x min(4/6, 2/6) = 2/3. Counting
    # the empty relabellings as anything above 0 would make them as extreme as the observed one (p = 1).
    result = log_rank([*not_before(1.0), *reached(2.0)], not_before(1.0, 2.0))
    assert result.statistic == pytest.approx(1.0)
    assert result.p_value == pytest.approx(2 / 3)
    # An observed Z of 0 with such relabellings among the 15: counted as 0 they are as extreme as it (p = 1);
    # left out of both tails they would lower it to 14/15.
    zero = log_rank([*not_before(1.0), *reached(3.0)], [*not_before(1.0), *reached(2.0, 2.0), *not_before(3.0)])
    assert zero.statistic == pytest.approx(0.0) and zero.p_value == 1.0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from([0.5, 1.0, 1.25, 2.0, 7.5, 30.0]), st.booleans()), min_size=2, max_size=9),
    st.integers(1, 8),
)
def test_the_log_rank_of_the_times_is_that_of_their_ranks(runs: list[tuple[float, bool]], cut: int) -> None:
    # log_rank computes on ranks (and caches by them): it must be scipy's statistic and the exact p of the times
    # themselves, ties and censoring included, which the uncached reference below recomputes.
    cut = min(cut, len(runs) - 1)
    a, b = [Observation(*r) for r in runs[:cut]], [Observation(*r) for r in runs[cut:]]
    test = log_rank(a, b)
    z, large_sample_p = _log_rank(a, b)
    if not math.isfinite(z):
        assert test.statistic in (None, 0.0)
        return
    assert test.statistic == z
    if test.test == EXACT_LOG_RANK:
        pooled = [*a, *b]

        def statistic(x, y) -> float:
            value = _log_rank([pooled[i] for i in x], [pooled[i] for i in y])[0]
            return value if math.isfinite(value) else 0.0

        assert test.p_value == exact_p(np.arange(len(a)), np.arange(len(a), len(pooled)), statistic, False)
    assert ranked(a, b) == ranked(list(reversed(a)), list(reversed(b)))  # the order within a side is no key


def test_runs_whose_times_order_alike_share_one_enumeration() -> None:
    _log_rank_test.cache_clear()
    first = log_rank(reached(1.0, 2.0, 3.0), reached(4.0, 5.0, 6.0))
    again = log_rank(reached(10.0, 20.5, 30.0), reached(44.0, 51.0, 61.0))
    assert first == again and _log_rank_test.cache_info().hits == 1
