"""Verdicts at the repeat counts people run: exact, symmetric, silent on ties and on differences too small to
matter (analysis/survival.py, analysis/uncertainty.py, analysis/permutation.py).

Checked by enumeration where the cases are few and by hypothesis properties otherwise, through the functions
the report calls (`build_statistics`, `log_rank`) on runs built in memory.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.permutation import holm, repeats_for_a_verdict, smallest_p
from analysis.runs import Run
from analysis.survival import Observation, log_rank
from analysis.uncertainty import HIGHER, LOWER, THROUGHPUT, build_statistics, ratio_over_runs
from tests.test_statistics import make_run, target_run

VERDICTS = (HIGHER, LOWER, "sooner", "later")
FLIP = {HIGHER: LOWER, LOWER: HIGHER, "sooner": "later", "later": "sooner"}


def reaching_runs(name: str, seconds: list[float], tokens: list[float] | None = None) -> list[Run]:
    """Runs of `name` whose validation loss reaches 7.0 at step 15 (half way between evaluations at 10 and
    20), at the given training times and tokens there."""
    runs = []
    for k, at in enumerate(seconds):
        at_tokens = 1500.0 if tokens is None else tokens[k]
        run = target_run(
            [(10, 1000, 8.0), (20, 2 * at_tokens - 1000, 6.0)],
            [(10, at - 1.0), (15, at), (20, at + 1.0)],
        )
        run.summary["strategy"], run.path = name, Path(name) / f"r{k}"
        runs.append(run)
    return runs


def target_verdicts(runs: list[Run]) -> dict[str, dict]:
    return {c["figure"]: c for c in build_statistics(runs, target_loss=7.0).target_comparisons}


# ---------------------------------------------------------------------------------------------
# Enumeration at 3 runs each


@pytest.mark.parametrize("split", list(itertools.combinations(range(6), 3)))
def test_no_ordering_of_three_against_three_gives_a_time_to_target_verdict(split: tuple[int, ...]) -> None:
    # Six distinct reaching times; every one of the C(6, 3) = 20 ways to give three of them to ddp.
    times = [10.0 + i for i in range(6)]
    ddp = [times[i] for i in split]
    fsdp = [times[i] for i in range(6) if i not in split]
    pair = target_verdicts(reaching_runs("ddp", ddp) + reaching_runs("fsdp", fsdp))["seconds"]
    assert pair["verdict"] not in VERDICTS
    assert pair["p_value"] >= 2 / 20 - 1e-12


@pytest.mark.parametrize("censored", [1, 2, 3])
def test_three_against_three_with_runs_that_never_reach_it_gives_no_verdict(censored: int) -> None:
    # fsdp's slowest runs never reach the target: seen above it at their last evaluation, after every ddp run.
    observations = [Observation(1.0 + i, True) for i in range(3)]
    others = [Observation(10.0 + i, i < 3 - censored) for i in range(3)]
    result = log_rank(observations, others)
    assert result.p_value >= 0.1 - 1e-12


def test_the_reading_says_three_runs_each_cannot_decide_and_how_many_can() -> None:
    from analysis.report import target_lines

    runs = reaching_runs("ddp", [10.0, 10.5, 11.0]) + reaching_runs("fsdp", [20.0, 20.5, 21.0])
    text = " ".join(target_lines(build_statistics(runs, target_loss=7.0)))
    assert "ddp against fsdp in seconds: no detectable difference (p = 0.100" in text
    assert "no exact test of 3 and 3 runs can reach 5% (the smallest p they allow is 0.100): 4 runs each" in text


# ---------------------------------------------------------------------------------------------
# The two cases the report must get right


def test_ddp_against_fsdp_reaching_the_target_at_the_same_step_is_no_verdict() -> None:
    # Same seed, same step: the tokens to the target are equal up to the interpolation between evaluations
    # (1e-4 tokens apart); the times differ by the machine's noise.
    ddp = reaching_runs("ddp", [10.0, 10.2, 10.4], [1500.0] * 3)
    fsdp = reaching_runs("fsdp", [10.1, 10.3, 10.5], [1500.0001] * 3)
    pairs = target_verdicts(ddp + fsdp)
    tokens = pairs["tokens"]
    assert tokens["verdict"] == "no detectable difference"
    assert tokens["test"].startswith("exact permutation test of the log-rank statistic")
    assert tokens["p_value"] == pytest.approx(0.1) and tokens["p_adjusted"] == pytest.approx(0.1)


def test_an_a_a_experiment_with_two_repeats_gives_no_verdict_on_what_repeats_exactly() -> None:
    # ddp and ddp#2: the same strategy twice, two repeats each; losses and bytes repeat exactly, times do not.
    runs = []
    for name in ("ddp", "ddp#2"):
        for k in range(2):
            runs.append(
                make_run(
                    name,
                    tokens_per_s=1000.0 * (1 + 0.03 * k + (0.01 if name == "ddp" else 0.0)),
                    step_peak=[300 * 2**20],
                    name=f"r{k}",
                    final_val_loss=6.123,
                    loss_mean=7.5,
                    train_time_s=10.0 * (1 - 0.02 * k) + (0.05 if name == "ddp" else 0.0),
                )
            )
    stats = build_statistics(runs)
    assert stats.comparisons and all(c.verdict not in VERDICTS for c in stats.comparisons)
    exact = {c.figure: c.verdict for c in stats.comparisons if c.ratio == 1.0}
    assert set(exact) == {"step_peak_bytes", "final_val_loss", "avg_loss", "peak_rss_mib"}
    assert set(exact.values()) == {"no meaningful difference"}


# ---------------------------------------------------------------------------------------------
# Properties

positive = st.floats(min_value=1.0, max_value=1e6, allow_nan=False, allow_infinity=False)
samples = st.lists(positive, min_size=2, max_size=4)


def throughput_runs(a: list[float], b: list[float], names: tuple[str, str] = ("a", "b")) -> list[Run]:
    return [make_run(names[0], tokens_per_s=v, name=f"r{k}") for k, v in enumerate(a)] + [
        make_run(names[1], tokens_per_s=v, name=f"r{k}") for k, v in enumerate(b)
    ]


@settings(max_examples=60, deadline=None)
@given(samples, samples)
def test_swapping_the_sides_flips_higher_and_lower(a: list[float], b: list[float]) -> None:
    forward = build_statistics(throughput_runs(a, b)).comparison(THROUGHPUT, "a", "b")
    backward = build_statistics(throughput_runs(b, a)).comparison(THROUGHPUT, "a", "b")
    assert backward.verdict == FLIP.get(forward.verdict, forward.verdict)
    assert backward.p_value == pytest.approx(forward.p_value)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(1.0, 100.0), min_size=1, max_size=4), st.lists(st.floats(1.0, 100.0), min_size=1, max_size=4))
def test_swapping_the_sides_flips_sooner_and_later(a: list[float], b: list[float]) -> None:
    forward, backward = log_rank(reached(a), reached(b)), log_rank(reached(b), reached(a))
    assert backward.p_value == pytest.approx(forward.p_value)
    assert backward.direction == {"sooner": "later", "later": "sooner"}.get(forward.direction)


def reached(values: list[float]) -> list[Observation]:
    return [Observation(v, True) for v in values]


@settings(max_examples=30, deadline=None)
@given(samples)
def test_identical_samples_never_give_a_verdict(values: list[float]) -> None:
    stats = build_statistics(throughput_runs(values, values))
    assert stats.comparison(THROUGHPUT, "a", "b").verdict not in VERDICTS
    assert log_rank(reached(values), reached(values)).p_value == 1.0


@settings(max_examples=30, deadline=None)
@given(positive, st.integers(1, 4), st.integers(1, 4), st.floats(-0.999, 0.999))
def test_a_difference_inside_the_margin_never_gives_a_verdict(value: float, n_a: int, n_b: int, power: float) -> None:
    # Repeats that agree exactly (same-seed losses, counts) on each side, less than 2% apart either way round
    # (the margin is symmetric on the log scale: 1.02 and 1 / 1.02): not a finding.
    factor = 1.02**power
    runs = throughput_runs([value] * n_a, [value * factor] * n_b)
    assert build_statistics(runs).comparison(THROUGHPUT, "a", "b").verdict not in VERDICTS
    tokens = [1500.0] * n_a + [1500.0 * factor] * n_b
    ddp = reaching_runs("ddp", [10.0 + k for k in range(n_a)], tokens[:n_a])
    fsdp = reaching_runs("fsdp", [10.0 + k for k in range(n_b)], tokens[n_a:])
    assert target_verdicts(ddp + fsdp)["tokens"]["verdict"] not in VERDICTS


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.floats(1.0, 50.0), st.booleans()), min_size=1, max_size=5),
    st.lists(st.tuples(st.floats(1.0, 50.0), st.booleans()), min_size=1, max_size=5),
)
def test_an_exact_p_is_never_below_what_the_relabellings_allow(a: list, b: list) -> None:
    result = log_rank([Observation(*o) for o in a], [Observation(*o) for o in b])
    if result.p_value is not None:
        assert result.p_value >= 1 / math.comb(len(a) + len(b), len(a)) - 1e-12


@settings(max_examples=60, deadline=None)
@given(samples, samples)
def test_an_exact_p_over_repeats_is_never_below_what_the_relabellings_allow(a: list[float], b: list[float]) -> None:
    comparison = build_statistics(throughput_runs(a, b)).comparison(THROUGHPUT, "a", "b")
    assert comparison.p_value is None or comparison.p_value >= 1 / math.comb(len(a) + len(b), len(a)) - 1e-12


# Each side one repeated value (same-seed losses, byte counts) or values that differ: a side that repeats
# exactly is where a point verdict could slip in without a test.
repeated = st.builds(lambda value, n: [value] * n, positive, st.integers(2, 4))
sides = st.one_of(samples, repeated)


@settings(max_examples=80, deadline=None)
@given(sides, sides, st.booleans())
def test_two_runs_or_more_each_always_get_a_p_no_smaller_than_the_relabellings_allow(
    a: list[float], b: list[float], exact: bool
) -> None:
    result = ratio_over_runs(a, b, exact=exact, margin=0.01)
    if len(set(a) | set(b)) == 1:
        assert result.p_value is None and result.verdict not in VERDICTS  # nothing differs: nothing to test
    else:
        assert result.p_value is not None and result.p_value >= 1 / math.comb(len(a) + len(b), len(a)) - 1e-12


@settings(max_examples=60, deadline=None)
@given(st.lists(positive, min_size=2, max_size=2).filter(lambda v: v[0] != v[1]), st.booleans())
def test_no_verdict_at_two_runs_against_two_at_5_percent(a: list[float], exact: bool) -> None:
    # The smallest two-sided p at 2 runs each is 2 / C(4, 2) = 1/3, whether or not each side repeats exactly.
    for x, y in ((a, [a[0] * 1.1] * 2), ([a[0]] * 2, [a[1]] * 2), (a, [v * 2 for v in a])):
        assert ratio_over_runs(x, y, exact=exact, margin=0.01).verdict not in VERDICTS


def test_sides_that_each_repeat_but_differ_are_tested_not_declared() -> None:
    two = ratio_over_runs([110, 110], [100, 100], exact=True, margin=0.01)
    assert two.verdict not in VERDICTS and two.p_value == pytest.approx(1 / 3)
    four = ratio_over_runs([110] * 4, [100] * 4, exact=True, margin=0.01)
    assert four.verdict == HIGHER and four.p_value == pytest.approx(2 / 70)


# ---------------------------------------------------------------------------------------------
# The arithmetic


def test_the_smallest_p_and_the_runs_a_verdict_needs() -> None:
    assert smallest_p(3, 3) == pytest.approx(0.1) and smallest_p(4, 4) == pytest.approx(2 / 70)
    assert repeats_for_a_verdict(1) == 4  # 2 / 70 = 0.029 < 0.05 <= 2 / 20
    assert repeats_for_a_verdict(3) == 5  # three pairs: 3 x 2 / 70 = 0.086, 3 x 2 / 252 = 0.024
    assert repeats_for_a_verdict(15) == 6  # six strategies: 15 x 2 / 252 = 0.12, 15 x 2 / 924 = 0.032


def test_holm_multiplies_the_smallest_by_the_family_and_keeps_the_order() -> None:
    # Holm (1979): sorted 0.01, 0.03, 0.04 of three become 0.03, max(0.06, 0.03), max(0.04, 0.06).
    assert holm([0.04, 0.01, 0.03]) == pytest.approx([0.06, 0.03, 0.06])
    assert holm([None, 0.02]) == [None, 0.02] and holm([0.9, 0.8]) == pytest.approx([1.0, 1.0])
