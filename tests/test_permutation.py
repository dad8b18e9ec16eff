"""The exact tests' arithmetic (analysis/permutation.py) on its own: the floor of p, the repeats a verdict
needs, the one-run side and the statistic, each against a count done here."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from analysis.permutation import (
    MAX_REPEATS,
    MONTE_CARLO_RESAMPLES,
    SIGNIFICANCE,
    drawn_relabellings,
    exact_p,
    exact_p_of_many,
    is_exact,
    mean_difference,
    monte_carlo_p,
    monte_carlo_p_of_many,
    repeats_for_a_verdict,
    smallest_p,
    welch_t,
)


def test_the_smallest_p_is_a_probability_for_any_counts() -> None:
    # With an empty side there is one relabelling: 2 / 1 would be no probability.
    assert smallest_p(0, 3) == 1.0 and smallest_p(1, 1) == 1.0 and smallest_p(2, 2) == pytest.approx(1 / 3)


def test_a_verdict_needs_p_below_alpha_not_equal_to_it() -> None:
    # At 3 runs each the floor is 2 / 20 = 0.1 exactly; a verdict reads p < alpha, so alpha 0.1 needs 4.
    assert repeats_for_a_verdict(1, alpha=0.1) == 4
    assert repeats_for_a_verdict() == repeats_for_a_verdict(1) == 4  # one pair unless told
    assert repeats_for_a_verdict(1, alpha=0.0) == MAX_REPEATS  # never reachable: the cap, not beyond it


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 50))
def test_the_repeats_are_the_first_count_whose_floor_holm_lets_through(pairs: int) -> None:
    n = repeats_for_a_verdict(pairs)
    assert pairs * smallest_p(n, n) < SIGNIFICANCE <= pairs * smallest_p(n - 1, n - 1)


def _scipy_count(observed: float, null: list[float]) -> float:
    """Two-sided p as scipy.stats.permutation_test counts it: twice the smaller tail, the observed included."""
    values = np.asarray(null)
    return min(1.0, 2 * min(np.mean(values <= observed), np.mean(values >= observed)))


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(1, 20), min_size=1, max_size=4).map(lambda v: np.asarray(v, dtype=float)),
    st.lists(st.integers(1, 20), min_size=1, max_size=4).map(lambda v: np.asarray(v, dtype=float)),
)
def test_the_exact_p_is_the_share_of_relabellings_as_extreme(x: np.ndarray, y: np.ndarray) -> None:
    # Every split of the pooled values into groups of len(x) and len(y), counted here; a side of one run goes
    # through the module's own enumeration, larger ones through scipy's.
    pooled = np.concatenate([x, y])
    null = []
    for chosen in itertools.combinations(range(pooled.size), x.size):
        rest = [i for i in range(pooled.size) if i not in chosen]
        null.append(float(mean_difference(pooled[list(chosen)], pooled[rest])))
    expected = _scipy_count(float(mean_difference(x, y)), null)
    assert exact_p(x, y, mean_difference, True) == pytest.approx(expected)


def test_the_difference_of_means_follows_the_axis_it_is_given() -> None:
    # Rows out of order: sorting along any axis but the one averaged over would mix the columns.
    x = np.array([[10.0, 1.0], [3.0, 20.0]])
    y = np.array([[5.0, 0.0], [2.0, 5.0]])
    assert mean_difference(x, y, axis=0) == pytest.approx([3.0, 8.0])
    assert mean_difference(x, y, axis=1) == pytest.approx([3.0, 8.0])


def test_eight_against_eight_is_enumerated_not_sampled() -> None:
    # C(16, 8) = 12,870 relabellings, more than scipy's default 9,999 random ones: the p of a full separation
    # is exactly its mirror and itself out of all of them.
    x, y = np.arange(1.0, 9.0), np.arange(9.0, 17.0)
    assert exact_p(x, y, mean_difference, True) == pytest.approx(2 / 12_870, rel=1e-12)


def test_the_exact_limit_is_inclusive() -> None:
    # C(5000, 1) = 5,000 relabellings: exactly the limit, still enumerated.
    assert is_exact(1, 4_999) and not is_exact(1, 5_000) and not is_exact(0, 3)


def _by_lone_value(table: dict[float, float]):
    """A statistic of (the lone run, the rest) read from `table` by the lone run's value: the null
    distribution is then exactly the table."""
    return lambda one, rest: table[float(one[0])]


@pytest.mark.parametrize(
    "table, expected",
    [
        # Statistic of the observed relabelling first (lone value 1.0), then the others'.
        ({1: 8.0, 2: -4.0, 3: -1.0, 4: 0.5}, 2 / 4),  # the largest: twice the upper tail
        ({1: 3.0, 2: 3.0, 3: 3.0}, 1.0),  # every relabelling tied: both tails whole, p capped at 1
        # Ties within 100 machine epsilons (2.2e-14) of the observed, relative to it, count as extreme,
        # however large it is...
        ({1: 1e6 * (1 + 2e-14), 2: 1e6, 3: -1e6, 4: -2e6}, 1.0),
        ({1: 1.0, 2: 1.0 - 2e-14, 3: 0.5, 4: -3.0, 5: -4.0, 6: -5.0}, 4 / 6),
        # ...and never beyond: 3e-14 below an observed 1 is not a tie, nor is anything 0.5 away.
        ({1: 1.0, 2: 1.0 - 3e-14, 3: 0.5, 4: -3.0, 5: -4.0, 6: -5.0}, 2 / 6),
        # An observed 0 has no band: 1e-300 either side of it is not a tie.
        ({1: 0.0, 2: 1e-300, 3: 5.0, 4: 6.0, 5: 7.0, 6: 8.0}, 2 / 6),
        ({1: 0.0, 2: -1e-300, 3: -5.0, 4: -6.0, 5: -7.0, 6: -8.0}, 2 / 6),
    ],
)
def test_one_run_against_many_counts_ties_as_scipy_does(table: dict[float, float], expected: float) -> None:
    x, y = np.array([1.0]), np.array([float(v) for v in table if v != 1])
    assert exact_p(x, y, _by_lone_value({float(k): v for k, v in table.items()}), False) == pytest.approx(expected)
    # The lone run on the other side: the same relabellings, the statistic read the other way round.
    flipped = {float(k): v for k, v in table.items()}
    assert exact_p(y, x, lambda rest, one: flipped[float(one[0])], False) == pytest.approx(expected)


@pytest.mark.parametrize(("inside", "outside"), [(1.0, 1.0 - 1.5e-14), (0.0, 1e-15)])
def test_a_drawn_p_counts_ties_within_scipys_margin_only(inside: float, outside: float) -> None:
    # The statistic is `inside` whenever the lone run stays on its side, `outside` otherwise: 1.5e-14 below an
    # observed 1 is within scipy's 100 epsilons (a tie, p = 1); 1e-15 above an observed 0 is not (no margin at 0).
    def statistic(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.where(x.max(axis=axis) > 0.5, inside, outside)

    p = monte_carlo_p_of_many(np.array([[1.0]]), np.zeros((1, 5)), statistic, resamples=99, seed=5)[0]
    stays = np.count_nonzero(drawn_relabellings(6, 99, 5)[:, 0] == 0)  # relabellings that keep it on its side
    assert p == (1.0 if inside == 1.0 else min(1.0, 2 * (stays + 1) / 100)) and stays < 50


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(0, 6), min_size=8, max_size=8),  # small integers: ties between and within the sides
    st.sampled_from([(2, 2), (2, 3), (3, 3), (4, 4), (3, 5)]),
)
def test_the_batched_exact_p_is_exact_p_split_for_split(levels: list[int], sizes: tuple[int, int]) -> None:
    # Every split of these counts of a pool of 8, batched in chunks of 7 (a last chunk smaller), against exact_p.
    logs = np.log1p(np.asarray(levels, dtype=float) / 10)
    n1, n2 = sizes
    chosen = [
        (a, b)
        for a in itertools.combinations(range(8), n1)
        for b in itertools.combinations([i for i in range(8) if i not in a], n2)
    ][:40]
    x, y = logs[[list(a) for a, _ in chosen]], logs[[list(b) for _, b in chosen]]
    batched = exact_p_of_many(x, y, mean_difference, chunk=7)
    assert batched.tolist() == [exact_p(x[i], y[i], mean_difference, True) for i in range(len(chosen))]


def test_the_batched_exact_p_refuses_a_side_of_one() -> None:
    with pytest.raises(ValueError, match="n1, n2 >= 2"):
        exact_p_of_many(np.ones((3, 1)), np.ones((3, 2)), mean_difference)


def test_welch_t_is_scipys_and_infinite_only_without_spread() -> None:
    x, y = np.array([1.0, 2.5, 2.0, 4.0]), np.array([3.0, 7.0, 5.5])
    assert welch_t(x, y) == pytest.approx(stats.ttest_ind(x, y, equal_var=False).statistic, rel=1e-12)
    assert welch_t(np.array([1.0, 1.0]), np.array([2.0, 2.0])) == -np.inf
    assert welch_t(np.array([1.0, 1.0]), np.array([1.0, 1.0])) == 0.0


def test_a_drawn_p_counts_the_observed_split_and_repeats_from_its_seed() -> None:
    # A full separation of 10 against 10 (184,756 relabellings): none of the R drawn is more extreme, so each
    # tail is 1 / (R + 1) and p twice that; a p of 0, as an uncorrected share would give, is impossible.
    x, y = np.arange(10.0), np.arange(10.0, 20.0)
    assert monte_carlo_p(x, y, welch_t) == pytest.approx(2 / (MONTE_CARLO_RESAMPLES + 1))
    noisy = np.random.default_rng(3).normal(size=(2, 10))
    assert monte_carlo_p(noisy[0], noisy[1], welch_t) == monte_carlo_p(noisy[0], noisy[1], welch_t)
    assert monte_carlo_p(noisy[0], noisy[1], welch_t, resamples=99) * 100 / 2 == pytest.approx(
        round(monte_carlo_p(noisy[0], noisy[1], welch_t, resamples=99) * 50)
    )


def test_a_drawn_p_is_the_count_over_the_drawn_orders_and_a_row_gets_it_alone_or_batched() -> None:
    rng = np.random.default_rng(11)
    x, y = rng.normal(size=(4, 3)), rng.normal(1.0, 3.0, size=(4, 5))
    order = drawn_relabellings(8, 99, 5)
    for row in range(4):
        pooled = np.concatenate([x[row], y[row]])
        null = np.array([welch_t(pooled[o[:3]], pooled[o[3:]]) for o in order])
        observed = welch_t(x[row], y[row])
        tails = [(np.sum(null <= observed) + 1) / 100, (np.sum(null >= observed) + 1) / 100]
        assert monte_carlo_p(x[row], y[row], welch_t, 99, 5) == pytest.approx(min(1.0, 2 * min(tails)))
    alone = [monte_carlo_p(x[row], y[row], welch_t, 99, 5) for row in range(4)]
    assert monte_carlo_p_of_many(x, y, welch_t, 99, 5, chunk=3).tolist() == alone
