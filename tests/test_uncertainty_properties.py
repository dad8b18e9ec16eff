"""Properties of analysis/uncertainty.py that the worked cases of tests/test_statistics.py leave open: a pair
read the other way round, the bootstrap's percentiles, the block length's bounds, where a censored run was
last seen, and report.json's fields. In this process, on runs built in memory."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.uncertainty import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    HIGHER,
    LOWER,
    SAME,
    Comparison,
    block_length,
    bootstrap_median_interval,
    bootstrap_medians,
    censored_at,
    step_ratio,
)
from tests.test_statistics import target_run

ratios = st.floats(0.01, 100.0)


@settings(max_examples=50, deadline=None)
@given(ratios, ratios, ratios, st.sampled_from([HIGHER, LOWER, SAME]))
def test_a_pair_read_the_other_way_round_is_the_reciprocal(ratio: float, low: float, high: float, said: str) -> None:
    low, high = sorted((low, high))
    c = Comparison("throughput", "ddp", "fsdp", ratio, (low, high), said, "m", p_value=0.01, margin=0.02)
    b = c.inverted()
    assert (b.a, b.b) == ("fsdp", "ddp") and b.ratio == pytest.approx(1 / ratio)
    assert b.ci95 == pytest.approx((1 / high, 1 / low))  # the bounds swap: the lower bound is 1 / the upper one
    assert b.verdict == {HIGHER: LOWER, LOWER: HIGHER}.get(said, said)
    assert (b.p_value, b.margin, b.figure) == (0.01, 0.02, "throughput")  # the evidence is the same
    assert b.inverted().ci95 == pytest.approx(c.ci95) and b.inverted().ratio == pytest.approx(ratio)
    assert Comparison("f", "a", "b", 2.0, None, "not enough runs", "m").inverted().ci95 is None


def _steps(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).lognormal(0.0, 0.2, n)


@pytest.mark.parametrize("block", [1, 3])
def test_the_step_interval_is_the_2_5_and_97_5_percentiles_of_the_resampled_medians(block: int) -> None:
    data = _steps(0, 60)
    medians = bootstrap_medians(data, BOOTSTRAP_RESAMPLES, np.random.default_rng(BOOTSTRAP_SEED), block)
    middle, low, high = bootstrap_median_interval(data, block=block)
    assert middle == np.median(data)
    assert (low, high) == tuple(np.percentile(medians, [2.5, 97.5]))
    assert np.mean(medians < low) <= 0.025 <= np.mean(medians <= low)


def test_the_ratio_interval_is_the_2_5_and_97_5_percentiles_of_the_resampled_ratios() -> None:
    x, y = _steps(1, 40), _steps(2, 50)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    ratios = bootstrap_medians(x, BOOTSTRAP_RESAMPLES, rng) / bootstrap_medians(y, BOOTSTRAP_RESAMPLES, rng)
    middle, (low, high) = step_ratio(x, y)
    assert middle == pytest.approx(np.median(x) / np.median(y))
    assert (low, high) == tuple(np.percentile(ratios, [2.5, 97.5]))


def test_the_default_block_is_one_step() -> None:
    data = _steps(3, 30)
    one = bootstrap_medians(data, 300, np.random.default_rng(7), 1)
    assert np.array_equal(bootstrap_medians(data, 300, np.random.default_rng(7)), one)


def test_the_block_length_reaches_a_quarter_of_the_run() -> None:
    # Forty steps, the last twenty slower: the autocorrelation at lag L is (40 - 3L) / 40, inside the white
    # noise band 1.96 / sqrt(40) = 0.31 first at L = 10, exactly a quarter of the run: still a block.
    assert block_length([1.0] * 20 + [2.0] * 20) == 10
    assert block_length([3.0] * 20) == 1  # every step the same: nothing correlated, one step a block


def test_a_run_that_never_reached_the_target_is_censored_at_its_last_evaluation() -> None:
    run = target_run(
        [(10, 1000, 8.0), (20, 2000, 7.8), (30, 3000, 7.6)], [(10, 5.0), (20, 9.0), (30, 14.0)], world_size=2
    )
    point = censored_at(run, price=3.0)
    assert (point.seconds, point.tokens) == (14.0, 3000)
    assert point.cost == pytest.approx(3.0 * 2 * 14.0 / 3600)  # per device-hour, two devices
    assert censored_at(run).cost is None
