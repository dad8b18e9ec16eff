"""training/records/steady_mean.py: steady_mean, the one definition of a run's per-step mean, on hand-computed values."""

from __future__ import annotations

import math

from training.records.steady_mean import SteadyMean, steady_mean


def test_warm_up_steps_are_left_out() -> None:
    # Steps 1-2 are warm-up; steps 3-5 hold 4, 6, 11: (4 + 6 + 11) / 3 = 7.
    got = steady_mean([(1, 100.0), (2, 50.0), (3, 4.0), (4, 6.0), (5, 11.0)], warmup_steps=2)
    assert got == SteadyMean(7.0, 3, 0)


def test_a_step_equal_to_the_warm_up_count_is_warm_up() -> None:
    # warmup_steps=3 leaves out steps 1, 2 and 3: only step 4's 2.5 is left.
    assert steady_mean([(1, 9.0), (2, 9.0), (3, 9.0), (4, 2.5)], warmup_steps=3) == SteadyMean(2.5, 1, 0)


def test_no_warm_up_averages_every_step() -> None:
    assert steady_mean([(1, 1.0), (2, 2.0), (3, 6.0)], warmup_steps=0) == SteadyMean(3.0, 3, 0)


def test_only_warm_up_steps_fall_back_to_all_of_them() -> None:
    # A run shorter than its warm-up: (8 + 2) / 2 = 5 over both steps, rather than no figure.
    assert steady_mean([(1, 8.0), (2, 2.0)], warmup_steps=5) == SteadyMean(5.0, 2, 0)


def test_non_finite_values_are_left_out_and_counted() -> None:
    # After warm-up (step 1): 3, inf, 5, nan, None, 7 -> finite 3, 5, 7: mean 5, three left out.
    points = [
        (1, float("nan")),
        (2, 3.0),
        (3, float("inf")),
        (4, 5.0),
        (5, float("nan")),
        (6, None),
        (7, 7.0),
        (8, float("-inf")),
    ]
    assert steady_mean(points, warmup_steps=1) == SteadyMean(5.0, 3, 4)


def test_warm_up_non_finite_values_are_not_counted() -> None:
    # The nan at step 1 is warm-up: outside the averaged range, so not among those left out.
    assert steady_mean([(1, float("nan")), (2, 4.0), (3, 8.0)], warmup_steps=1) == SteadyMean(6.0, 2, 0)


def test_integers_count_and_bools_are_refused() -> None:
    # 2 and 4 are measurements: mean 3. True and False are not (a bool is an int in Python): left out.
    assert steady_mean([(1, 2), (2, True), (3, 4), (4, False)], warmup_steps=0) == SteadyMean(3.0, 2, 2)
    got = steady_mean([(1, True), (2, False)], warmup_steps=0)
    assert math.isnan(got.value) and (got.steps, got.nonfinite_left_out) == (0, 2)


def test_no_finite_value_is_nan_over_no_steps() -> None:
    got = steady_mean([(1, float("inf")), (2, None)], warmup_steps=0)
    assert math.isnan(got.value) and (got.steps, got.nonfinite_left_out) == (0, 2)


def test_empty_is_nan_over_no_steps() -> None:
    got = steady_mean([], warmup_steps=3)
    assert math.isnan(got.value) and (got.steps, got.nonfinite_left_out) == (0, 0)


def test_any_iterable_is_read_once() -> None:
    # A generator, as the summary passes it: read once, both for the choice and for the mean.
    got = steady_mean(((step, float(step)) for step in range(1, 11)), warmup_steps=4)
    assert got == SteadyMean(7.5, 6, 0)  # (5 + 6 + ... + 10) / 6 = 45 / 6
