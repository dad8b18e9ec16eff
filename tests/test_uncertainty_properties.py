"""Properties of analysis/uncertainty.py that the worked cases of tests/test_statistics.py leave open: a pair
read the other way round, the bootstrap's percentiles, the block length's bounds, where a censored run was
last seen, and report.json's fields. In this process, on runs built in memory."""

from __future__ import annotations

import json
import math
from dataclasses import fields

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import t as t_dist
from scipy.stats import ttest_ind

from analysis.permutation import MONTE_CARLO_RESAMPLES, SIGNIFICANCE
from analysis.uncertainty import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    EXACT,
    HIGHER,
    LOWER,
    MAX_REPEATS,
    MIN_STEPS,
    NO_VERDICT,
    ONE_RUN_EACH,
    RUN_SIGMA,
    SAME,
    SINGLE,
    STEP_BOOTSTRAP,
    STEP_PEAK,
    THROUGHPUT,
    TRAIN_TIME,
    WELCH_LOG_RATIO,
    WELCH_TEST,
    Comparison,
    _target_verdict,
    block_length,
    bootstrap_median_interval,
    bootstrap_medians,
    build_statistics,
    censored_at,
    compare_figure,
    json_ready,
    ratio_over_runs,
    repeats_needed,
    run_figures,
    step_bootstrap_comparison,
    step_peak_bytes,
    step_rates,
    step_ratio,
    summarize_figure,
    time_to_target,
    verdict,
    warmup_steps,
)
from tests.test_statistics import make_run, target_run
from training.config import RunConfig

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


def test_json_ready_turns_every_non_finite_number_into_null_at_any_depth() -> None:
    value = {"a": [1.0, float("nan"), (float("inf"), -float("inf"))], "b": {"c": 2, "d": "x", "e": None}}
    assert json_ready(value) == {"a": [1.0, None, [None, None]], "b": {"c": 2, "d": "x", "e": None}}


def _repeats() -> list:
    runs = []
    for name, rates in (("ddp", [1000.0, 1040.0, 990.0]), ("fsdp", [700.0, 720.0, 705.0])):
        for k, rate in enumerate(rates):
            run = make_run(name, tokens_per_s=rate, name=f"r{k}", train_time_s=10.0 + k, final_val_loss=float("nan"))
            runs.append(run)
    return runs


def test_report_json_holds_every_field_of_every_summary_and_comparison() -> None:
    stats = build_statistics(_repeats(), mlperf=True)
    report = json.loads(json.dumps(stats.to_dict(), allow_nan=False))  # strict JSON: nothing non-finite left
    assert set(report) == {"figures", "comparisons", "time_to_target", "time_to_target_comparisons"}
    for figure, by_strategy in stats.figures.items():
        for strategy, summary in by_strategy.items():
            entry = report["figures"][figure][strategy]
            assert entry["mlperf_mean"] == stats.mlperf[figure][strategy]
            assert {k: entry[k] for k in ("n", "median", "min", "max", "mean", "geometric_mean", "method")} == {
                "n": summary.n,
                "median": summary.median,
                "min": summary.minimum,
                "max": summary.maximum,
                "mean": summary.mean,
                "geometric_mean": summary.geometric_mean,
                "method": summary.method,
            }
            assert entry["ci95"] == (list(summary.ci95) if summary.ci95 else None)
            assert entry["block_steps"] == summary.block
    assert report["figures"][THROUGHPUT]["ddp"]["mlperf_mean"] == pytest.approx(1000.0)  # 990 and 1040 dropped
    written = {(c["figure"], c["a"], c["b"]): c for c in report["comparisons"]}
    assert len(written) == len(stats.comparisons) > 0
    for c in stats.comparisons:
        entry = written[(c.figure, c.a, c.b)]
        expected = {f.name: getattr(c, f.name) for f in fields(Comparison)}
        expected["ci95"] = list(c.ci95) if c.ci95 is not None else None
        assert entry == expected
    assert "mlperf_mean" not in json.dumps(build_statistics(_repeats()).to_dict())  # only when asked for


def test_the_step_bootstrap_comparison_puts_the_step_ratio_interval_around_the_recorded_ratio() -> None:
    # One run each: the recorded throughputs' ratio, with the relative width of the median step rates' ratio.
    steps_a, steps_b = list(1 / _steps(4, 40)), list(1 / _steps(5, 40))
    a = make_run("ddp", tokens_per_s=1200.0, step_times=steps_a, warmup=3)
    b = make_run("fsdp", tokens_per_s=1000.0, step_times=steps_b, warmup=3)
    figure = next(f for f in run_figures([a, b]) if f.name == THROUGHPUT)
    c = step_bootstrap_comparison(figure, "ddp", [a], "fsdp", [b])
    middle, (low, high) = step_ratio(step_rates(a), step_rates(b))
    assert (c.a, c.b, c.figure, c.method) == ("ddp", "fsdp", THROUGHPUT, STEP_BOOTSTRAP)
    assert c.ratio == pytest.approx(1.2) and c.ci95 == pytest.approx((1.2 * low / middle, 1.2 * high / middle))
    assert c.verdict == verdict(c.ci95)
    short = make_run("fsdp", tokens_per_s=1000.0, step_times=steps_b[:7], warmup=3)  # 4 steps after warm-up
    assert step_bootstrap_comparison(figure, "ddp", [a], "fsdp", [short]) is None
    assert step_bootstrap_comparison(figure, "ddp", [a], "fsdp", [make_run("fsdp", step_times=steps_b[:8])])


def _welch_decides(n: int, gap: float, sigma: float = RUN_SIGMA) -> bool:
    """docs/statistics.md's power arithmetic: (t(0.975) + t(0.80)) x sigma x sqrt(2 / n) <= |ln ratio|, df 2n - 2."""
    df = 2 * n - 2
    return (t_dist.ppf(0.975, df) + t_dist.ppf(0.80, df)) * sigma * math.sqrt(2 / n) <= gap


@settings(max_examples=60, deadline=None)
@given(st.floats(1.007, 3.0), st.booleans())  # beyond 1.0063, 1000 runs each decide
def test_the_repeats_needed_are_the_fewest_that_meet_the_power_arithmetic(ratio: float, slower: bool) -> None:
    ratio = 1 / ratio if slower else ratio
    n = repeats_needed(ratio)
    gap = abs(math.log(ratio))
    assert n is not None and n >= 2 and _welch_decides(n, gap)
    assert n == 2 or not _welch_decides(n - 1, gap)


def test_no_repeats_decide_no_difference_or_one_beyond_the_cap() -> None:
    assert repeats_needed(1.0) is None and repeats_needed(0.0) is None and repeats_needed(-2.0) is None
    # Half way between the gaps that 999 and 1000 runs each decide: 1000, the cap, is still an answer; half
    # way between 1000 and 1001: beyond the cap, None.
    at_cap = math.exp((_gap_decided(999) + _gap_decided(1000)) / 2)
    beyond = math.exp((_gap_decided(1000) + _gap_decided(1001)) / 2)
    assert repeats_needed(at_cap) == MAX_REPEATS == 1000 and repeats_needed(beyond) is None
    assert repeats_needed(2.0) == 2  # a doubling: the fewest runs that have a variance
    # Twice the noise needs the same runs as half the gap on the log scale.
    assert repeats_needed(1.1, sigma=2 * RUN_SIGMA) == repeats_needed(math.sqrt(1.1))


def _gap_decided(n: int) -> float:
    df = 2 * n - 2
    return (t_dist.ppf(0.975, df) + t_dist.ppf(0.80, df)) * RUN_SIGMA * math.sqrt(2 / n)


def test_the_warm_up_left_out_is_the_one_the_run_recorded() -> None:
    default = next(f.default for f in fields(RunConfig) if f.name == "perf_warmup_steps")
    recorded = default + 4  # anything but the default, so reading the default instead shows
    run = make_run("ddp", step_times=[1.0] * recorded + [0.5] * 6, warmup=recorded)
    assert warmup_steps(run) == recorded
    assert list(step_rates(run)) == [1000 / 0.5] * 6  # global batch 1000 tokens over the steps after it
    for config in (None, {}, {"run": None}, {"run": {"perf_warmup_steps": True}}, {"run": {"perf_warmup_steps": -1}}):
        run.config = config
        assert warmup_steps(run) == default
    run.config = {"run": {"perf_warmup_steps": 0}}
    assert warmup_steps(run) == 0


def test_step_rates_need_a_positive_batch_and_skip_steps_of_no_time() -> None:
    run = make_run("ddp", step_times=[1.0] * 3 + [0.5, 0.0, 0.25], warmup=3)
    assert list(step_rates(run)) == [2000.0, 4000.0]  # a step of 0 s has no rate: left out, not infinite
    run.summary["global_batch_tokens"] = 1
    assert list(step_rates(run)) == [2.0, 4.0]
    for tokens in (0, -5, None):
        run.summary["global_batch_tokens"] = tokens
        assert step_rates(run).size == 0


def test_a_time_to_target_verdict_needs_p_below_5_percent() -> None:
    pair = {"direction": "sooner", "median_a": 1.0, "median_b": 2.0, "margin": 0.02}
    assert _target_verdict(pair, 0.049) == "sooner"
    assert _target_verdict(pair, SIGNIFICANCE) == SAME and _target_verdict(pair, None) == SAME
    assert _target_verdict({**pair, "direction": None}, 0.01) == SAME
    assert _target_verdict({**pair, "median_b": 1.01}, 0.01) == SAME  # 1% apart: inside the 2% margin
    assert _target_verdict({**pair, "median_b": None}, 0.01) == "sooner"  # no median to weigh: the test decides


def test_the_ratio_interval_is_welchs_not_students() -> None:
    # Unequal spreads and numbers of runs, where Welch's interval and the pooled-variance one differ; one side
    # of identical runs still has an interval (the other side varies).
    a, b = [1000.0, 1010.0, 990.0], [700.0, 900.0, 650.0, 820.0, 760.0]
    for x, y in ((a, b), ([1000.0] * 3, b)):
        logs_x, logs_y = np.log(x), np.log(y)
        welch = ttest_ind(logs_x, logs_y, equal_var=False).confidence_interval(0.95)
        student = ttest_ind(logs_x, logs_y, equal_var=True).confidence_interval(0.95)
        assert not np.isclose(welch.low, student.low)
        result = ratio_over_runs(x, y)
        assert result.ci95 == pytest.approx((math.exp(welch.low), math.exp(welch.high)))
        assert result.method == WELCH_LOG_RATIO
    # Eight runs each: beyond the exact test's limit, Welch's interval still, but the p is a permutation test's of
    # Welch's t over drawn relabellings, (b + 1) / (R + 1) per tail: never the t distribution's.
    many_a, many_b = [1000.0 + 7 * k for k in range(8)], [950.0 + 31 * k for k in range(8)]
    result = ratio_over_runs(many_a, many_b)
    expected = ttest_ind(np.log(many_a), np.log(many_b), equal_var=False)
    assert result.test == WELCH_TEST and result.test.startswith("Monte Carlo permutation, R=9999")
    tail_count = result.p_value * (MONTE_CARLO_RESAMPLES + 1) / 2
    assert tail_count == pytest.approx(round(tail_count), abs=1e-6) and result.p_value != pytest.approx(expected.pvalue)
    assert result.smallest_p is None


def test_medians_of_zero_or_below_one_are_weighed_by_the_margin_only_when_they_can_be() -> None:
    pair = {"direction": "later", "median_a": 0.5, "median_b": 0.501, "margin": 0.02}
    assert _target_verdict(pair, 0.01) == SAME  # 0.2% apart, below 1 s: inside the margin all the same
    assert _target_verdict({**pair, "median_a": 0.0, "median_b": 0.0}, 0.01) == "later"  # no ratio of zeros


def test_an_evaluation_exactly_at_the_target_reaches_it() -> None:
    run = target_run([(10, 1000, 8.0), (20, 2000, 7.0)], [(10, 5.0), (20, 9.0)])
    point = time_to_target(run, 7.0)
    assert point is not None and (point.seconds, point.tokens) == (9.0, 2000.0)


def test_one_throughput_run_each_is_named_as_such_and_keeps_the_figures_margin() -> None:
    """report.json says why a one-run-each pair has no verdict (its method) and the margin the runs needed
    would have to beat."""
    runs = [make_run("single", tokens_per_s=2000.0), make_run("ddp", tokens_per_s=2500.0)]
    figure = next(f for f in run_figures(runs) if f.name == THROUGHPUT)
    comparison = build_statistics(runs).comparison(THROUGHPUT, "ddp", "single")
    assert comparison.method == ONE_RUN_EACH and comparison.verdict == NO_VERDICT
    assert comparison.margin == figure.margin > 0


def test_a_pair_over_repeats_carries_its_method_and_its_own_p_until_corrected() -> None:
    """compare_figure is one pair alone (analysis/calibration.py reads it so): Welch's method, and its p as the
    adjusted one, since a family of one needs no correction."""
    runs = [
        make_run(s, tokens_per_s=v, name=f"{s}{i}") for s in ("single", "ddp") for i, v in enumerate((990.0, 1010.0))
    ]
    runs_a, runs_b = runs[2:], runs[:2]
    figure = next(f for f in run_figures(runs) if f.name == THROUGHPUT)
    pair = compare_figure(figure, "ddp", runs_a, "single", runs_b)
    assert pair.method == WELCH_LOG_RATIO and pair.p_value is not None and pair.p_adjusted == pair.p_value
    assert pair.margin == figure.margin > 0  # the margin its verdict was read against


def test_on_a_gpu_without_a_probe_record_the_step_peak_is_the_max_allocated() -> None:
    """An older GPU run has no memory.step_peak_bytes: torch.cuda's max allocated over the epochs (MiB) is
    the same quantity; on a CPU that figure is the resident set, not a tensor peak, so there is none."""
    assert step_peak_bytes(make_run("ddp", device_type="cuda", rss_mib=100.0)) == 100 * 2**20
    assert step_peak_bytes(make_run("ddp", device_type="cpu", rss_mib=100.0)) is None


def test_one_runs_exact_figure_is_its_value_and_only_its_throughput_takes_the_steps_interval() -> None:
    """The step peak is a count with no run-to-run noise: one run's interval is its value. The step times
    give an interval to the throughput alone, not to the other figures of the same run."""
    jitter = [0.5 * (1 + 0.05 * math.sin(i)) for i in range(60)]
    run = make_run("single", step_times=jitter, step_peak=[1000, 1200], train_time_s=30.0)
    figures = build_statistics([run]).figures
    peak = figures[STEP_PEAK]["single"]
    assert peak.method == EXACT and peak.ci95 == (1200.0, 1200.0)
    assert figures[THROUGHPUT]["single"].method == STEP_BOOTSTRAP
    assert figures[TRAIN_TIME]["single"].method == SINGLE and figures[TRAIN_TIME]["single"].ci95 is None


def test_one_runs_throughput_takes_the_block_bootstrap_of_its_steps_from_exactly_min_steps_on() -> None:
    """MIN_STEPS steps after warm-up are enough for the steps' interval, one fewer is not; steps correlated
    over a few neighbours are resampled in blocks of the length block_length found, not one by one."""
    figure = next(f for f in run_figures([make_run("single")]) if f.name == THROUGHPUT)
    uneven = [0.50, 0.55, 0.45, 0.60, 0.52, 0.48]
    enough = summarize_figure(figure, [make_run("single", step_times=[1.0] * 3 + uneven[:MIN_STEPS], warmup=3)])
    assert enough.method == STEP_BOOTSTRAP and enough.block == 1
    short = summarize_figure(figure, [make_run("single", step_times=[1.0] * 3 + uneven[: MIN_STEPS - 1], warmup=3)])
    assert short.method == SINGLE and short.ci95 is None
    drifting = [0.5 * (1 + 0.05 * math.sin(i / 2)) for i in range(60)]  # correlated over about 3 steps
    run = make_run("single", step_times=[1.0] * 3 + drifting, warmup=3, tokens_per_s=1900.0)
    rates = step_rates(run)
    block = block_length(rates)
    assert block is not None and block > 1
    middle, low, high = bootstrap_median_interval(rates, block=block)
    summary = summarize_figure(figure, [run])
    assert summary.block == block and summary.ci95 == pytest.approx((1900.0 * low / middle, 1900.0 * high / middle))
    assert (summary.n, summary.median, summary.minimum, summary.maximum, summary.mean) == (1, *[1900.0] * 4)
    assert summary.geometric_mean == 1900.0 and summary.method == STEP_BOOTSTRAP
    assert bootstrap_median_interval(rates)[1:] != pytest.approx((low, high))  # steps one by one differ


def test_the_correction_keeps_every_pair_of_a_figure_whatever_pair_comes_first() -> None:
    """Three strategies of one run each: every pair of every figure is kept, those with no p (one run each,
    exact counts) before others as well. A one-run-each pair too close for any number of repeats to decide
    keeps no count of repeats; the others need at least the runs the exact test needs over three pairs."""
    from analysis.permutation import repeats_for_a_verdict

    runs = [
        make_run("single", tokens_per_s=1000.0, step_peak=[1000]),
        make_run("ddp", tokens_per_s=1000.1, step_peak=[1000]),
        make_run("fsdp", tokens_per_s=1500.0, step_peak=[1200]),
    ]
    stats = build_statistics(runs)
    pairs = [("single", "ddp"), ("single", "fsdp"), ("ddp", "fsdp")]
    for figure in (THROUGHPUT, STEP_PEAK):
        assert [(c.a, c.b) for c in stats.comparisons if c.figure == figure] == pairs
    throughput = [c for c in stats.comparisons if c.figure == THROUGHPUT]
    assert all(c.verdict == NO_VERDICT and c.p_value is None for c in throughput)
    assert repeats_needed(1000.0 / 1000.1) is None and throughput[0].repeats_needed is None
    assert [c.repeats_needed for c in throughput[1:]] == [
        max(repeats_needed(r), repeats_for_a_verdict(3)) for r in (1000 / 1500, 1000.1 / 1500)
    ]
    assert [c.method for c in stats.comparisons if c.figure == STEP_PEAK] == [EXACT] * 3


def _runs_of(throughputs: dict[str, list[float]]) -> list:
    return [
        make_run(s, tokens_per_s=v, name=f"{s}{i}", step_peak=[1000])
        for s, vs in throughputs.items()
        for i, v in enumerate(vs)
    ]


def test_each_verdict_is_read_from_its_holm_adjusted_p() -> None:
    """Three strategies of four runs each, far apart: each pair alone is at the exact test's floor, 2 / 70,
    below 5%; Holm over the three pairs makes it 3 x 2 / 70, so no pair gets a verdict, and each says the
    runs that would let the test reach 5% over three pairs."""
    from analysis.permutation import repeats_for_a_verdict, smallest_p

    runs = _runs_of(
        {s: [base * (1 + 0.01 * k) for k in range(4)] for s, base in (("a", 1000.0), ("b", 2000.0), ("c", 4000.0))}
    )
    throughput = [c for c in build_statistics(runs).comparisons if c.figure == THROUGHPUT]
    assert len(throughput) == 3
    for c in throughput:
        assert c.p_value == pytest.approx(smallest_p(4, 4)) and c.p_value < SIGNIFICANCE
        assert c.p_adjusted == pytest.approx(3 * smallest_p(4, 4))
        assert c.verdict == SAME and c.repeats_needed == repeats_for_a_verdict(3)
        assert c.ci95[1] < 1  # the interval alone would say lower


def test_the_runs_a_verdict_needs_are_given_where_three_times_the_floor_reaches_5_percent_and_only_there() -> None:
    """3 runs against 7: the exact test's floor is 2 / C(10, 3) = 1 / 60, and three pairs make it exactly 5%,
    which is not below 5%: the runs that could decide are given. 7 against 7 (2 / 3432) can decide at these
    runs: none given. Holm's adjusted p is what each pair carries."""
    from analysis.permutation import holm, repeats_for_a_verdict, smallest_p

    assert 3 * smallest_p(3, 7) == SIGNIFICANCE
    runs = _runs_of(
        {
            "a": [1000.0 * (1 + 0.01 * k) for k in range(3)],
            "b": [2000.0 * (1 + 0.01 * k) for k in range(7)],
            "c": [4000.0 * (1 + 0.01 * k) for k in range(7)],
        }
    )
    ab, ac, bc = [c for c in build_statistics(runs).comparisons if c.figure == THROUGHPUT]
    assert (ab.repeats_needed, ac.repeats_needed, bc.repeats_needed) == (repeats_for_a_verdict(3),) * 2 + (None,)
    expected = holm([ab.p_value, ac.p_value, bc.p_value])
    assert [ab.p_adjusted, ac.p_adjusted, bc.p_adjusted] == pytest.approx(expected)
    assert ab.p_adjusted == pytest.approx(2 * smallest_p(3, 7)) != pytest.approx(ab.p_value)
    assert (ab.verdict, bc.verdict) == (LOWER, LOWER)


def test_a_figure_no_run_has_leaves_the_figures_after_it() -> None:
    """CPU runs without the probe's record have no step peak (the second figure): the resident set, the
    training time and the losses after it are still summarized and compared."""
    from analysis.uncertainty import RESIDENT

    runs = [make_run(s, train_time_s=t) for s, t in (("single", 10.0), ("ddp", 12.0))]
    stats = build_statistics(runs)
    assert STEP_PEAK not in stats.figures
    assert {RESIDENT, TRAIN_TIME} <= set(stats.figures)
    assert {c.figure for c in stats.comparisons} >= {RESIDENT, TRAIN_TIME}


def test_the_report_ranks_warm_up_free_throughput_when_every_run_has_it_and_reserved_memory_off_the_cpu() -> None:
    """The throughput figure is the warm-up-free one when every run records it, the whole job's otherwise;
    the memory beside the step peak is the resident set only when every run is a CPU run."""
    from analysis.uncertainty import RESERVED, RESIDENT

    def figures(*runs) -> dict:
        return {f.name: f for f in run_figures(list(runs))}

    gpu = [make_run(s, device_type="cuda", tokens_per_s=1000.0, tokens_per_s_excl_warmup=1500.0) for s in ("a", "b")]
    by_name = figures(*gpu)
    assert RESERVED in by_name and RESIDENT not in by_name
    assert "warm-up steps excluded" in by_name[THROUGHPUT].title and by_name[THROUGHPUT].value(gpu[0]) == 1500.0
    whole = figures(gpu[0], make_run("c", device_type="cuda", tokens_per_s=900.0))  # one without it: all whole-job
    assert "excluded" not in whole[THROUGHPUT].title and whole[THROUGHPUT].value(gpu[0]) == 1000.0
    assert RESERVED in figures(gpu[0], make_run("c")) and RESIDENT in figures(make_run("c"), make_run("d"))
    assert RESERVED in figures()  # no run: nothing says CPU


def test_build_statistics_prices_the_time_to_target_and_titles_every_figure() -> None:
    """The price reaches each strategy's time-to-target entry (its cost median); without a target there is
    no entry and no pair; report.json's titles are those of the figures."""
    runs = [target_run([(10, 1000, 8.0), (20, 2000, 6.0)], [(10, e), (20, 2 * e)]) for e in (4.0, 5.0)]
    for i, run in enumerate(runs):
        run.path = run.path.parent / f"r{i}"
    priced = build_statistics(runs, target_loss=7.0, price=3600.0)
    assert priced.time_to_target["single"]["cost"] == pytest.approx(priced.time_to_target["single"]["seconds"])
    unpriced = build_statistics(runs)
    assert unpriced.time_to_target == {} and unpriced.target_comparisons == []
    assert unpriced.titles == {f.name: f.title for f in run_figures(runs)} != {}


def test_each_report_figure_has_its_title_unit_exactness_margin_and_value() -> None:
    """report.json's figures as the reading names them: the CPU's resident set (summary.json's allocated
    maximum, which a CPU run fills with it) or the GPU's reserved memory beside the step peak."""
    from training import run_schema as schema

    totals = {"tokens_per_s": 1000.0, "train_time_s": 30.0, "final_val_loss": 4.0, "loss_mean": 4.5}
    memory = {"peak_mem_allocated_mib_max": 700.0, "peak_mem_reserved_mib_max": 800.0}
    for device, beside in (
        (
            "cpu",
            ("peak_rss_mib", "peak resident set size (per process, max over processes)", schema.PEAK_ALLOCATED, 700.0),
        ),
        (
            "cuda",
            ("peak_reserved_mib", "peak memory reserved (per device, max over devices)", schema.PEAK_RESERVED, 800.0),
        ),
    ):
        run = make_run("single", device_type=device, step_peak=[5000], **totals, **memory)
        got = [(f.name, f.title, f.unit, f.exact, f.margin, f.value(run)) for f in run_figures([run])]
        name, title, metric, value = beside
        assert got == [
            ("tokens_per_s", "throughput (whole job)", "tokens/s", False, schema.THROUGHPUT.margin, 1000.0),
            (
                "step_peak_bytes",
                "live-tensor step peak (per device, max over devices)",
                "bytes",
                True,
                schema.STEP_PEAK_MARGIN,
                5000.0,
            ),
            (name, title, "MiB", False, metric.margin, value),
            ("train_time_s", "training time", "s", False, schema.TRAIN_TIME.margin, 30.0),
            ("final_val_loss", "final validation loss", "nats", False, schema.FINAL_VAL_LOSS.margin, 4.0),
            ("avg_loss", "mean training loss", "nats", False, schema.LOSS_MEAN.margin, 4.5),
        ]
        assert all(f.margin > 0 for f in run_figures([run]))


def test_inside_the_margin_is_inclusive_either_way_round_and_never_at_or_below_zero() -> None:
    from analysis.uncertainty import inside

    assert inside(1.02, 0.02) and inside(1 / 1.02, 0.02) and inside(0.99, 0.02) and inside(1.0, 0.0)
    assert not inside(1.0201, 0.02) and not inside(1 / 1.0201, 0.02) and not inside(1.03, 0.02)
    assert not inside(0.0, 0.02) and not inside(-1.0, 0.02)


def test_the_verdict_at_the_edges_of_its_rule() -> None:
    """verdict's statement, case by case: the default margin is 0; an interval reaching exactly 1 does not
    exclude it; a p of exactly 5% is not below it; the ratio given (not the interval's centre) is weighed by
    the margin; half an interval inside the margin is not all of it."""
    from analysis.uncertainty import NEGLIGIBLE, TOO_FEW

    assert verdict(None) == TOO_FEW
    assert verdict((1.5, 2.5)) == HIGHER and verdict((1.0, 1.0)) == NEGLIGIBLE  # margin 0 by default
    assert verdict((1.1, 1.3), None, SIGNIFICANCE) == SAME and verdict((1.1, 1.3), None, 0.049) == HIGHER
    assert verdict((1.1, 1.3)) == HIGHER and verdict((0.7, 0.9)) == LOWER  # no test: the interval decides
    assert verdict((1.0, 1.3), 1.1, 0.01) == SAME and verdict((0.7, 1.0), 0.85, 0.01) == SAME
    assert verdict((0.9, 1.1), 1.0, 0.01) == SAME
    half_inside = (1.001, 1.0399)  # its low end inside a 2% margin, its high end outside; centre 1.0203
    assert verdict(half_inside, None, 0.01, 0.02) == HIGHER
    assert verdict(half_inside, 1.01, 0.01, 0.02) == SAME and verdict(half_inside, 1.01, None, 0.02) == SAME
