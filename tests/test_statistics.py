"""Intervals and verdicts (analysis/uncertainty.py) on hand-made figures whose answer is known."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analysis.report import memory_reading
from analysis.runs import Run
from analysis.uncertainty import (
    EXACT,
    EXACT_PERMUTATION,
    HIGHER,
    LOG_T_INTERVAL,
    LOWER,
    NEGLIGIBLE,
    NO_VERDICT,
    RESIDENT,
    SAME,
    SINGLE,
    STEP_BOOTSTRAP,
    STEP_PEAK,
    T_INTERVAL,
    THROUGHPUT,
    TOO_CORRELATED,
    TOO_FEW,
    WELCH_LOG_RATIO,
    Comparison,
    Ratio,
    block_length,
    bootstrap_median_interval,
    build_statistics,
    mlperf_mean,
    ratio_over_runs,
    step_rates,
    step_ratio,
    summarize,
    time_to_target,
    verdict,
)
from training.record import EvalLine, TrainLine

MIB = 2**20


def make_run(
    strategy: str,
    *,
    tokens_per_s: float = 1000.0,
    step_times: list[float] | None = None,
    device_type: str = "cpu",
    step_peak: list[int] | None = None,
    rss_mib: float = 900.0,
    world_size: int = 1,
    warmup: int = 3,
    name: str = "r0",
    **totals: Any,
) -> Run:
    """A run as analysis.runs reads it, built in memory: only what the statistics read."""
    summary = {
        "strategy": strategy,
        "device_type": device_type,
        "world_size": world_size,
        "global_batch_tokens": 1000,
        "memory": {"step_peak_bytes": step_peak} if step_peak is not None else None,
        "total": {
            "tokens_per_s": tokens_per_s,
            "peak_mem_allocated_mib_max": rss_mib,
            "peak_mem_reserved_mib_max": rss_mib,
            **totals,
        },
        "step_times_s": step_times if step_times is not None else [],
    }
    return Run(
        path=Path(strategy) / name, summary=summary, config={"run": {"perf_warmup_steps": warmup}}, label=strategy
    )


# ---------------------------------------------------------------------------------------------
# The numbers


def test_summary_of_positive_runs_is_the_t_interval_of_the_geometric_mean() -> None:
    summary = summarize([1.0, 2.0, 4.0])
    assert (summary.n, summary.median, summary.minimum, summary.maximum) == (3, 2.0, 1.0, 4.0)
    # Logarithms 0, ln 2, 2 ln 2: mean ln 2 (geometric mean 2), sd ln 2; half width t(0.975, 2) x sd / sqrt(n).
    half = 4.3027 * math.log(2) / math.sqrt(3)
    assert summary.geometric_mean == pytest.approx(2.0) and summary.mean == pytest.approx(7 / 3)
    assert summary.ci95 == pytest.approx((2.0 * math.exp(-half), 2.0 * math.exp(half)), rel=1e-3)
    assert summary.method == LOG_T_INTERVAL


def test_a_widely_spread_positive_figure_keeps_its_interval_above_zero() -> None:
    # Three throughputs on a busy machine: the plain mean's t-interval, 2033 +- 4.30 x 2658 / sqrt(3), would
    # reach below zero; the geometric mean's stays positive.
    summary = summarize([100.0, 1000.0, 5000.0])
    low, high = summary.ci95
    assert 0 < low < summary.geometric_mean < high
    assert summary.mean - 4.3027 * 2658.3 / math.sqrt(3) < 0


def test_a_figure_not_all_positive_gets_the_t_interval_of_the_mean() -> None:
    summary = summarize([-1.0, 0.0, 1.0])
    half = 4.3027 * 1.0 / math.sqrt(3)  # t(0.975, 2) x sd / sqrt(n)
    assert summary.ci95 == pytest.approx((-half, half), abs=1e-3)
    assert summary.method == T_INTERVAL and summary.geometric_mean is None
    with_zero = summarize([0.0, 1.0, 2.0])  # zero has no logarithm: the plain mean's interval, as for negatives
    assert with_zero.method == T_INTERVAL and with_zero.geometric_mean is None
    assert with_zero.ci95 == pytest.approx((1.0 - half, 1.0 + half), abs=1e-3)


def test_one_run_has_no_interval_unless_it_is_a_count() -> None:
    assert summarize([5.0]).ci95 is None
    exact = summarize([5.0], exact=True)
    assert exact.ci95 == (5.0, 5.0) and exact.method == EXACT
    assert summarize([]) is None and summarize([math.nan]) is None
    one = summarize([5.0])
    assert (one.n, one.median, one.minimum, one.maximum, one.mean, one.geometric_mean) == (1, 5.0, 5.0, 5.0, 5.0, 5.0)
    assert one.method == SINGLE and summarize([-5.0]).geometric_mean is None  # no logarithm of a negative


def test_identical_runs_are_a_point_exactly_and_runs_one_apart_an_interval() -> None:
    """exp(mean(log 0.1)) is 0.10000000000000002: identical runs give their value itself, not that residue.
    Runs exactly 1 apart are not identical."""
    assert summarize([0.1, 0.1, 0.1]).ci95 == (0.1, 0.1)
    low, high = summarize([1.0, 2.0]).ci95
    assert low < 1.0 and high > 2.0


def test_t_interval_covers_the_true_mean_about_95_percent_of_the_time() -> None:
    rng = np.random.default_rng(7)
    covered = [lo <= 10.0 <= hi for lo, hi in (summarize(rng.normal(10.0, 1.0, 4)).ci95 for _ in range(1000))]
    assert 0.93 <= np.mean(covered) <= 0.97


def test_bootstrap_interval_of_the_median_covers_and_is_deterministic() -> None:
    rng = np.random.default_rng(11)
    samples = [rng.exponential(1.0, 60) for _ in range(150)]
    true_median = math.log(2)
    covered = [lo <= true_median <= hi for _, lo, hi in map(bootstrap_median_interval, samples)]
    assert 0.88 <= np.mean(covered) <= 0.99
    assert bootstrap_median_interval(samples[0]) == bootstrap_median_interval(samples[0])  # fixed seed
    assert bootstrap_median_interval(samples[0], seed=1) != bootstrap_median_interval(samples[0], seed=2)


def test_one_run_interval_uses_blocks_as_long_as_the_steps_autocorrelation() -> None:
    rng = np.random.default_rng(4)
    assert block_length(rng.normal(0.0, 1.0, 400)) == 1  # independent steps: the ordinary bootstrap
    shocks, steps = rng.normal(0.0, 1.0, 400), np.zeros(400)
    for i in range(1, 400):  # AR(1) with lag-1 autocorrelation 0.6: about 4 steps to fall inside the band
        steps[i] = 0.6 * steps[i - 1] + shocks[i]
    block = block_length(steps)
    assert 2 <= block <= 8
    _, low, high = bootstrap_median_interval(steps, block=block)
    _, naive_low, naive_high = bootstrap_median_interval(steps)
    assert high - low > 1.3 * (naive_high - naive_low)  # the step-by-step resample is too narrow
    assert block_length(np.linspace(0.4, 0.6, 60)) is None  # a trend: correlated over the whole run


def test_one_run_whose_steps_drift_gets_no_interval_and_says_why() -> None:
    run = make_run("single", tokens_per_s=2000.0, step_times=[0.4 + 0.004 * i for i in range(63)])
    summary = build_statistics([run]).figures[THROUGHPUT]["single"]
    assert summary.ci95 is None and summary.method == TOO_CORRELATED and summary.block is None


def test_mlperf_mean_drops_the_fastest_and_the_slowest() -> None:
    assert mlperf_mean([10.0, 1.0, 2.0, 3.0]) == 2.5
    assert mlperf_mean([1.0, 2.0]) is None


# ---------------------------------------------------------------------------------------------
# The verdict rule, both ways


def test_the_verdict_is_stated_only_when_the_interval_excludes_1() -> None:
    assert verdict((1.01, 1.2)) == HIGHER and verdict((0.8, 0.99)) == LOWER
    assert verdict((0.99, 1.01)) == SAME and verdict(None) == TOO_FEW


def test_clearly_separated_repeats_are_higher_one_way_and_lower_the_other() -> None:
    fast, slow = [100.0, 101.0, 99.0, 100.5], [80.0, 81.0, 79.5, 80.2]
    up, down = ratio_over_runs(fast, slow), ratio_over_runs(slow, fast)
    assert up.verdict == HIGHER and down.verdict == LOWER
    assert up.ratio == pytest.approx(1.25, rel=0.01) and up.ci95[0] > 1
    assert down.ratio == pytest.approx(1 / up.ratio)


def test_repeats_from_one_distribution_show_no_detectable_difference() -> None:
    rng = np.random.default_rng(3)
    a, b = rng.normal(100.0, 5.0, 5), rng.normal(100.0, 5.0, 5)
    result = ratio_over_runs(a, b)
    assert result.verdict == SAME and result.ci95[0] < 1 < result.ci95[1]
    same = ratio_over_runs([100.0, 102.0, 98.0], [100.0, 102.0, 98.0])
    assert same.verdict == SAME and same.ratio == pytest.approx(1.0)


def test_a_gap_inside_the_noise_of_repeats_is_no_detectable_difference() -> None:
    # 2% apart, runs jittering 10%: the intervals cannot tell.
    result = ratio_over_runs([102.0, 92.0, 112.0], [100.0, 90.0, 110.0])
    assert result.verdict == SAME


def test_one_run_each_rule() -> None:
    assert ratio_over_runs([6.1], [6.1]).verdict == SAME  # identical values
    different = ratio_over_runs([6.1], [6.2])
    assert different.verdict == TOO_FEW and different.ci95 is None and different.ratio == pytest.approx(6.1 / 6.2)
    assert ratio_over_runs([6.1], [6.2, 6.3, 6.25]).verdict == TOO_FEW  # one run on one side is still one run
    # A count repeats exactly: one run each is enough.
    assert ratio_over_runs([100.0], [200.0], exact=True).verdict == LOWER


def test_the_ratio_is_of_geometric_means_and_equal_repeats_give_the_plain_quotient() -> None:
    # Runs that disagree on either side: the geometric means' ratio (2 / 2 here), never the first runs' quotient.
    assert ratio_over_runs([1.0, 4.0], [2.0, 2.0]).ratio == pytest.approx(1.0, rel=1e-12)
    assert ratio_over_runs([2.0, 2.0], [1.0, 4.0]).ratio == pytest.approx(1.0, rel=1e-12)
    # Equal repeats on both sides: a / b to the bit (through logarithms 3 / 7 comes out 1.1e-16 off).
    assert ratio_over_runs([3.0, 3.0], [7.0, 7.0]).ratio == 3.0 / 7.0


def test_an_exact_count_of_one_run_is_judged_against_equal_repeats_but_not_against_runs_that_disagree() -> None:
    point = ratio_over_runs([100.0], [200.0, 200.0], exact=True)
    assert (point.verdict, point.ci95, point.ratio) == (LOWER, (0.5, 0.5), 0.5)
    assert ratio_over_runs([2.0], [1.0, 3.0], exact=True).verdict == TOO_FEW
    # The margin is the pair's: an exact 0.5% apart is no meaningful difference at 1%, lower at 0.
    assert ratio_over_runs([100.0], [100.5], exact=True, margin=0.01).verdict == NEGLIGIBLE
    assert ratio_over_runs([100.0], [100.5], exact=True, margin=0.0).verdict == LOWER


def test_sides_that_each_repeat_one_value_give_a_point_and_the_exact_tests_p() -> None:
    assert ratio_over_runs([5.0, 5.0], [5.0, 5.0]) == Ratio(1.0, (1.0, 1.0), NEGLIGIBLE, WELCH_LOG_RATIO)
    # Two runs each that agree: still a split the test must judge, 1/3 at 2 each (the smallest it can give).
    two = ratio_over_runs([6.0, 6.0], [3.0, 3.0])
    assert (two.ratio, two.ci95, two.verdict, two.method, two.test) == (
        2.0,
        (2.0, 2.0),
        SAME,
        WELCH_LOG_RATIO,
        EXACT_PERMUTATION,
    )
    assert two.p_value == pytest.approx(1 / 3) and two.smallest_p == pytest.approx(1 / 3)
    # Past the enumeration limit the observed split is still the most extreme: its p is the floor, uncounted.
    eight = ratio_over_runs([6.0] * 8, [3.0] * 8)
    assert (eight.verdict, eight.test, eight.ci95) == (HIGHER, EXACT_PERMUTATION, (2.0, 2.0))
    assert eight.p_value == eight.smallest_p == pytest.approx(2 / 12_870)
    # The pair's margin holds here too: 0.5% apart is no meaningful difference at 1%.
    assert ratio_over_runs([100.0] * 8, [100.5] * 8, margin=0.01).verdict == NEGLIGIBLE
    assert ratio_over_runs([100.0] * 8, [100.5] * 8, margin=0.0).verdict == LOWER


def test_one_run_each_gives_the_whole_ratio_of_its_rule() -> None:
    assert ratio_over_runs([6.1], [6.1]) == Ratio(1.0, (1.0, 1.0), SAME, SINGLE)
    assert ratio_over_runs([6.1], [6.2]) == Ratio(6.1 / 6.2, None, TOO_FEW, SINGLE)


def test_welchs_interval_inside_the_pairs_margin_is_no_meaningful_difference() -> None:
    a, b = [100.0, 101.0, 99.0], [100.5, 101.5, 99.5]
    assert ratio_over_runs(a, b, margin=0.05).verdict == NEGLIGIBLE
    assert ratio_over_runs(a, b, margin=0.0).verdict == SAME


def test_a_comparison_without_an_interval_is_written_with_none() -> None:
    written = Comparison("throughput", "ddp", "fsdp", 1.02, None, TOO_FEW, SINGLE).to_dict()
    assert written["ci95"] is None and written["ratio"] == 1.02 and written["verdict"] == TOO_FEW


def test_a_run_without_a_positive_value_is_left_out_and_a_side_with_none_gives_no_ratio() -> None:
    # A zero (a run that measured nothing) has no logarithm: kept, it would make the geometric mean 0 or infinite.
    assert ratio_over_runs([0.0, 2.0, 2.0], [1.0, 1.0]).ratio == 2.0
    assert ratio_over_runs([1.0, 1.0], [0.0, 2.0, 2.0]).ratio == 0.5
    for empty_side in ([0.0, -1.0], [], [math.nan]):
        assert ratio_over_runs(empty_side, [1.0, 2.0]) is None
        assert ratio_over_runs([1.0, 2.0], empty_side) is None


def test_step_times_of_one_run_each_give_a_verdict_both_ways() -> None:
    rng = np.random.default_rng(5)
    fast, slow = 1000 / rng.normal(0.50, 0.02, 80), 1000 / rng.normal(0.60, 0.02, 80)
    ratio, ci = step_ratio(fast, slow)
    assert verdict(ci) == HIGHER and ci[0] < ratio < ci[1]
    assert verdict(step_ratio(slow, fast)[1]) == LOWER
    twin = 1000 / rng.normal(0.50, 0.02, 80)
    assert verdict(step_ratio(fast, twin)[1]) == SAME
    assert step_ratio(fast, slow) == step_ratio(fast, slow)  # fixed seed


# ---------------------------------------------------------------------------------------------
# Runs: repeats, warm-up, memory on CPU


def test_warmup_steps_are_left_out_of_the_step_rates() -> None:
    run = make_run("single", step_times=[9.0, 9.0, 9.0, 0.5, 0.5], warmup=3)
    assert list(step_rates(run)) == [2000.0, 2000.0]  # 1000 tokens per step / 0.5 s


def test_one_run_each_throughput_interval_comes_from_its_steps_and_gives_no_verdict() -> None:
    jitter = [1 + 0.05 * math.sin(i) for i in range(60)]
    runs = [
        make_run("single", tokens_per_s=2000.0, step_times=[0.5 * j for j in jitter]),
        make_run("ddp", tokens_per_s=2500.0, step_times=[0.4 * j for j in jitter]),
    ]
    stats = build_statistics(runs)
    single = stats.figures[THROUGHPUT]["single"]
    assert single.method == STEP_BOOTSTRAP and single.ci95[0] < 2000.0 < single.ci95[1] and single.block >= 1
    comparison = stats.comparison(THROUGHPUT, "ddp", "single")
    # However narrow the step times make it, one run each cannot see drift between runs (tests/test_calibration.py).
    assert comparison.verdict == NO_VERDICT and comparison.ratio == pytest.approx(1.25) and comparison.ci95 is None
    # docs/statistics.md: a 20% gap needs 3 runs each at 5% noise for Welch's power, but no exact test of one
    # pair reaches 5% below 4 runs each.
    assert comparison.repeats_needed == 4


def test_runs_of_one_strategy_are_its_repeats() -> None:
    runs = [make_run("single", tokens_per_s=v, name=f"r{i}") for i, v in enumerate((990.0, 1000.0, 1010.0, 995.0))]
    runs += [make_run("ddp", tokens_per_s=v, name=f"r{i}") for i, v in enumerate((1490.0, 1500.0, 1510.0, 1495.0))]
    stats = build_statistics(runs)
    assert stats.figures[THROUGHPUT]["single"].n == 4 and stats.figures[THROUGHPUT]["single"].median == 997.5
    lower = stats.comparison(THROUGHPUT, "single", "ddp")
    assert lower.verdict == LOWER and lower.p_value == pytest.approx(2 / 70) and lower.test == EXACT_PERMUTATION


def test_three_runs_each_allow_no_verdict_and_say_how_many_would() -> None:
    # However far apart, 3 runs each split 20 ways: the exact p is at least 2 / 20 (Welch's interval alone
    # excludes 1 here, and called it lower before the exact test).
    runs = [make_run("single", tokens_per_s=v, name=f"r{i}") for i, v in enumerate((990.0, 1000.0, 1010.0))]
    runs += [make_run("ddp", tokens_per_s=v, name=f"r{i}") for i, v in enumerate((1490.0, 1500.0, 1510.0))]
    comparison = build_statistics(runs).comparison(THROUGHPUT, "single", "ddp")
    assert comparison.ci95[1] < 1 and comparison.p_value == pytest.approx(0.1) and comparison.verdict == SAME
    assert comparison.smallest_p == pytest.approx(0.1) and comparison.repeats_needed == 4


def test_on_cpu_the_step_peak_is_ranked_and_the_resident_set_is_not() -> None:
    # The resident set sizes point the other way; the live-tensor peak (max over ranks) decides.
    runs = [
        make_run("single", step_peak=[300 * MIB], rss_mib=800.0),
        make_run("fsdp", step_peak=[150 * MIB, 200 * MIB], rss_mib=900.0, world_size=2),
    ]
    stats = build_statistics(runs)
    assert stats.figures[STEP_PEAK]["fsdp"].median == 200 * MIB
    assert stats.comparison(STEP_PEAK, "fsdp", "single").verdict == LOWER
    assert stats.comparison(RESIDENT, "fsdp", "single").verdict == TOO_FEW
    peak, beside = memory_reading(runs, stats)
    assert peak.startswith(
        "Peak memory (live tensors at the step peak, per process, max over processes): "
        "**fsdp** uses least, 200 MiB: 33% less than single"
    )
    assert "resident set size" in beside and "not ranked" in beside and "**" not in beside


def test_resident_set_is_ranked_only_outside_its_noise() -> None:
    runs = [
        make_run("single", rss_mib=v, step_peak=[300 * MIB], name=f"r{i}") for i, v in enumerate((800, 805, 810, 803))
    ]
    runs += [
        make_run("fsdp", rss_mib=v, step_peak=[200 * MIB], name=f"r{i}") for i, v in enumerate((600, 604, 608, 602))
    ]
    beside = memory_reading(runs, build_statistics(runs))[1]
    assert "outside its noise: single / fsdp" in beside and "higher" in beside
    noisy = [make_run("single", rss_mib=v, step_peak=[300 * MIB], name=f"r{i}") for i, v in enumerate((600, 800, 1000))]
    noisy += [make_run("fsdp", rss_mib=v, step_peak=[200 * MIB], name=f"r{i}") for i, v in enumerate((700, 780, 860))]
    assert "not ranked (no pair's 95% interval excludes 1)" in memory_reading(noisy, build_statistics(noisy))[1]


# ---------------------------------------------------------------------------------------------
# Time to a target loss


def target_run(evals: list[tuple[int, int, float]], logged: list[tuple[int, float]], world_size: int = 1) -> Run:
    run = make_run("single", world_size=world_size)
    run.evals = [EvalLine.from_dict({"step": s, "tokens": t, "val_loss": v}) for s, t, v in evals]
    run.train = [TrainLine.from_dict({"step": s, "elapsed_s": e}) for s, e in logged]
    return run


def test_time_to_target_is_interpolated_between_evaluations() -> None:
    # Loss 8.0 at step 10 and 6.0 at step 20: 7.0 is half way, step 15, 1,500 tokens. Train lines every
    # 5 steps: 7.0 s at step 15. Two devices at 2.0 per device-hour: 2 x 2.0 x 7.0 / 3600.
    run = target_run([(10, 1000, 8.0), (20, 2000, 6.0)], [(5, 3.0), (10, 5.0), (15, 7.0), (20, 9.0)], world_size=2)
    point = time_to_target(run, 7.0, price=2.0)
    assert point.seconds == pytest.approx(7.0) and point.tokens == pytest.approx(1500.0)
    assert point.cost == pytest.approx(2 * 2.0 * 7.0 / 3600)
    quarter = time_to_target(run, 7.5)  # a quarter of the way: step 12.5, elapsed 5 + 0.5 x 2 = 6.0 s
    assert quarter.seconds == pytest.approx(6.0) and quarter.tokens == pytest.approx(1250.0) and quarter.cost is None


def test_time_to_target_not_reached_or_reached_at_the_first_evaluation() -> None:
    run = target_run([(10, 1000, 8.0), (20, 2000, 6.0)], [(10, 5.0), (20, 9.0)])
    assert time_to_target(run, 5.0) is None
    first = time_to_target(run, 8.5)  # no earlier evaluation to interpolate from: the first one's point
    assert first.seconds == pytest.approx(5.0) and first.tokens == pytest.approx(1000.0)


def test_time_to_target_over_repeats_is_the_kaplan_meier_median_with_its_spread() -> None:
    runs = [target_run([(10, 1000, 8.0), (20, 2000, 6.0)], [(10, e), (20, 2 * e)]) for e in (4.0, 5.0, 6.0)]
    runs.append(target_run([(10, 1000, 8.0), (20, 2000, 7.5)], [(10, 5.0), (20, 10.0)]))
    for i, run in enumerate(runs):
        run.path = Path("single") / f"r{i}"
    entry = build_statistics(runs, target_loss=7.0).time_to_target["single"]
    # Reached at step 15 by the first three (6.0, 7.5, 9.0 s); the fourth stops at 7.5, not before 10.0 s. Of
    # the four, half reached it by 7.5 s and the median lies between 7.5 and 9.0 s: 8.25 s, where the median of
    # the three that reached it (7.5 s) would drop the slow run and flatter the strategy.
    assert entry["runs"] == 4 and entry["reached"] == 3 and entry["seconds"] == pytest.approx(8.25)
    assert entry["tokens"] == pytest.approx(1500.0) and entry["not_reached_before"] == [
        {"seconds": 10.0, "tokens": 2000.0}
    ]
    assert entry["spread"]["seconds"]["min"] == pytest.approx(6.0)
    assert entry["spread"]["seconds"]["max"] == pytest.approx(9.0)


def test_time_to_target_is_not_reached_when_fewer_than_half_reach_it() -> None:
    reached = target_run([(10, 1000, 8.0), (20, 2000, 6.0)], [(10, 4.0), (20, 8.0)])
    stopped = [target_run([(10, 1000, 8.0), (20, 2000, 7.5)], [(10, 5.0), (20, 10.0)]) for _ in range(2)]
    for i, run in enumerate([reached, *stopped]):
        run.path = Path("single") / f"r{i}"
    entry = build_statistics([reached, *stopped], target_loss=7.0).time_to_target["single"]
    assert entry["reached"] == 1 and entry["seconds"] is None and entry["tokens"] is None
    assert entry["spread"]["seconds"]["n"] == 1  # the one that did, still shown


@pytest.mark.parametrize("repeats", [3, 4])
def test_strategies_are_compared_on_time_to_target_by_the_exact_log_rank_test(repeats: int) -> None:
    # fsdp's runs reach 7.0 at 6.0-6.3 s, single's at 9.0-9.3 s: every fsdp run before any single one.
    runs = []
    for name, base in (("single", 6.0), ("fsdp", 4.0)):
        for k in range(repeats):
            run = target_run([(10, 1000, 8.0), (20, 2000, 6.0)], [(10, base + 0.1 * k), (20, 2 * (base + 0.1 * k))])
            run.summary["strategy"], run.path = name, Path(name) / f"r{k}"
            runs.append(run)
    stats = build_statistics(runs, target_loss=7.0)
    by_figure = {c["figure"]: c for c in stats.target_comparisons}
    seconds = by_figure["seconds"]
    assert (seconds["a"], seconds["b"], seconds["direction"]) == ("single", "fsdp", "later")
    assert seconds["p_value"] == pytest.approx(2 / math.comb(2 * repeats, repeats)) == seconds["p_adjusted"]
    if repeats == 3:  # the most extreme split of 3 and 3 is p = 0.10: no verdict, and 4 each would allow one
        assert seconds["verdict"] == "no detectable difference" and seconds["repeats_needed"] == 4
    else:
        assert seconds["verdict"] == "later" and seconds["repeats_needed"] is None
    tokens = by_figure["tokens"]  # both at 1,500 tokens: identical, never a verdict
    assert tokens["verdict"] == "no detectable difference" and tokens["p_value"] == 1.0


# ---------------------------------------------------------------------------------------------
# Figures: a strategy's repeats as one median with its range, partial epochs marked


def test_epoch_series_is_the_median_with_min_max_and_marks_partial_epochs() -> None:
    from analysis.plots import epoch_series
    from training.run_schema import EPOCH_THROUGHPUT

    runs = []
    for i, (rate, partial) in enumerate(((100.0, False), (110.0, False), (130.0, True))):
        run = make_run("single", name=f"r{i}")
        run.summary["epochs"] = [
            {"epoch": 1, "tokens_per_s": rate},
            {"epoch": 2, "tokens_per_s": rate * 2, "partial": partial},
        ]
        runs.append(run)
    series = epoch_series(runs, EPOCH_THROUGHPUT)
    assert series.epochs == [1, 2] and series.runs == 3
    assert series.median == [110.0, 220.0] and series.low == [100.0, 200.0] and series.high == [130.0, 260.0]
    assert series.partial == [False, True]


def test_the_better_median_comes_first_in_the_schemas_direction_and_ties_keep_their_order() -> None:
    from analysis.uncertainty import Summary, best_first
    from training.run_schema import PEAK_ALLOCATED, THROUGHPUT

    medians = {"single": 2.0, "ddp": 3.0, "fsdp": 2.0, "hsdp": 1.0}
    summaries = {name: Summary(1, m, m, m, m, None, "none") for name, m in medians.items()}
    assert best_first(summaries, THROUGHPUT.better) == ["ddp", "single", "fsdp", "hsdp"]
    assert best_first(summaries, PEAK_ALLOCATED.better) == ["hsdp", "single", "fsdp", "ddp"]
