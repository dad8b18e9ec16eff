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
