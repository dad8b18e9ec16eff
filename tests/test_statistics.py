"""The report's statuses (analysis/uncertainty.py) on hand-made figures whose answer is known."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from analysis.answer import answer_lines
from analysis.runs import Run
from analysis.uncertainty import (
    EQUIVALENT,
    ESTABLISHED,
    EXACT,
    FINAL_VAL_LOSS,
    HIGHER,
    LOWER,
    NOT_ESTABLISHED,
    ONE_UNIT,
    SEED,
    STEP_PEAK,
    TARGET_SECONDS,
    TARGET_TOKENS,
    THROUGHPUT,
    WELCH,
    Figure,
    build_statistics,
    compare_figure,
    holm,
    inside,
    json_ready,
    summarize,
    time_to_target,
    units,
    units_for_power,
)
from training.records.record import EvalLine, TrainLine


def make_run(
    strategy: str,
    *,
    tokens_per_s: float = 1000.0,
    step_peak: list[int] | None = None,
    device_type: str = "cpu",
    precision: str = "fp32",
    seed: int = 1337,
    name: str = "r0",
    evals: list[tuple[int, float]] | None = None,
    step_seconds: float = 1.0,
    **totals: Any,
) -> Run:
    """A run as analysis.runs reads it, built in memory: only what the statistics read. `evals`: (step,
    validation loss) pairs, each step `step_seconds` long and 1,000 tokens."""
    summary = {
        "strategy": strategy,
        "device_type": device_type,
        "precision": precision,
        "seed": seed,
        "world_size": 1,
        "global_batch_tokens": 1000,
        "memory": {"step_peak_bytes": step_peak} if step_peak is not None else None,
        "total": {"tokens_per_s": tokens_per_s, "peak_mem_allocated_mib_max": 900.0, **totals},
    }
    run = Run(path=Path(strategy) / name, summary=summary, config={"run": {}}, label=f"{strategy}-{name}")
    steps = max((s for s, _ in evals or []), default=0)
    run.train = [
        TrainLine.from_dict({"step": s, "elapsed_s": s * step_seconds, "loss": 5.0}) for s in range(1, steps + 1)
    ]
    run.evals = [EvalLine.from_dict({"step": s, "tokens": 1000 * s, "val_loss": loss}) for s, loss in evals or []]
    return run


def throughputs(strategy: str, values: list[float], **kwargs: Any) -> list[Run]:
    return [make_run(strategy, tokens_per_s=v, name=f"r{i}", **kwargs) for i, v in enumerate(values)]


def pair(statistics: Any, figure: str, a: str, b: str) -> Any:
    found = statistics.comparison(figure, a, b)
    assert found is not None
    return found


# ---------------------------------------------------------------------------------------------
# Continuous figures: Welch's t-test of the logarithms


def test_a_large_gap_with_small_spread_is_established_at_two_and_three_runs_each() -> None:
    for n in (2, 3):
        fast = throughputs("ddp", [1830 * (1 + 0.02 * k) for k in range(n)])
        slow = throughputs("single", [1000 * (1 - 0.01 * k) for k in range(n)])
        c = pair(build_statistics([*slow, *fast]), THROUGHPUT, "ddp", "single")
        assert (c.status, c.direction, c.method) == (ESTABLISHED, HIGHER, WELCH)
        assert c.ci95[0] > 1.7 and c.p_adjusted < 0.05


def test_the_ratio_and_interval_are_welchs_on_the_logarithms() -> None:
    a, b = [1100.0, 1180.0, 1050.0], [1000.0, 1010.0]
    c = pair(build_statistics([*throughputs("ddp", a), *throughputs("single", b)]), THROUGHPUT, "ddp", "single")
    welch = stats.ttest_ind(np.log(a), np.log(b), equal_var=False)
    low, high = welch.confidence_interval(0.95)
    assert c.ratio == pytest.approx(math.exp(np.log(a).mean() - np.log(b).mean()), rel=1e-12)
    assert c.ci95 == pytest.approx((math.exp(low), math.exp(high)), rel=1e-12)
    assert c.p_value == pytest.approx(welch.pvalue, rel=1e-12)
    # Student's pooled interval differs here (unequal variances, unequal n): the test would see a swap.
    student = stats.ttest_ind(np.log(a), np.log(b)).confidence_interval(0.95)
    assert c.ci95[0] != pytest.approx(math.exp(student.low), rel=1e-6)


def test_a_gap_inside_the_noise_is_not_established_never_equivalent() -> None:
    """Cannot decide is not a tie: a 5% gap inside a wide spread says 'not established' and what would decide."""
    runs = [*throughputs("ddp", [1050.0, 1120.0, 990.0]), *throughputs("fsdp", [1000.0, 1060.0, 950.0])]
    c = pair(build_statistics(runs), THROUGHPUT, "ddp", "fsdp")
    assert c.status == NOT_ESTABLISHED and c.direction is None
    assert c.units_needed is not None and c.units_needed > 3 and c.spread_measured
    assert c.units_needed == units_for_power(c.ratio, c.spread, 1, 0.02)  # from the spread it reports, measured


def test_a_ratio_inside_the_margin_whose_interval_is_not_is_not_established_and_says_so() -> None:
    """Equivalence needs the whole interval inside the margin, not the ratio: 1.005x with 0.84-1.20 is not."""
    runs = [*throughputs("ddp", [1000.0, 1060.0]), *throughputs("fsdp", [1005.0, 1045.0])]
    statistics = build_statistics(runs)
    c = pair(statistics, THROUGHPUT, "ddp", "fsdp")
    assert inside(c.ratio, 0.02) and not inside(c.ci95[1], 0.02)
    assert (c.status, c.direction) == (NOT_ESTABLISHED, None)
    speed = answer_lines(json_ready(statistics.to_dict()))[0]
    assert "not established (the ratio is inside the 2% margin, its interval is not)" in speed, speed


def test_a_significant_ratio_inside_the_margin_with_an_interval_beyond_it_is_not_established() -> None:
    """p < 5% is not enough: 1.0198x is inside the 2% margin, its interval 1.006-1.034 is not wholly inside, so
    neither 'established' nor 'equivalent' is earned."""
    runs = [
        *throughputs("ddp", [1010.0, 1030.0, 1025.0, 1015.0]),
        *throughputs("fsdp", [1000.0, 1001.0, 999.0, 1000.5]),
    ]
    c = pair(build_statistics(runs), THROUGHPUT, "ddp", "fsdp")
    assert c.p_adjusted < 0.05 and inside(c.ratio, 0.02) and not inside(c.ci95[1], 0.02)
    assert (c.status, c.direction) == (NOT_ESTABLISHED, None)


def test_equivalent_only_when_the_whole_interval_lies_inside_the_margin() -> None:
    tight = [
        *throughputs("ddp", [1000.0, 1001.0, 1002.0, 1000.5]),
        *throughputs("fsdp", [1000.2, 1001.2, 1001.5, 1000.9]),
    ]
    c = pair(build_statistics(tight), THROUGHPUT, "ddp", "fsdp")
    assert c.status == EQUIVALENT and inside(c.ci95[0], 0.02) and inside(c.ci95[1], 0.02)
    loose = [*throughputs("ddp", [1000.0, 1030.0]), *throughputs("fsdp", [1001.0, 985.0])]
    c = pair(build_statistics(loose), THROUGHPUT, "ddp", "fsdp")
    assert c.status == NOT_ESTABLISHED and not inside(c.ci95[1], 0.02)


def test_a_significant_gap_inside_the_margin_is_not_called_established() -> None:
    runs = [*throughputs("ddp", [1010.0, 1010.1, 1010.2]), *throughputs("fsdp", [1000.0, 1000.1, 1000.2])]
    c = pair(build_statistics(runs), THROUGHPUT, "ddp", "fsdp")
    assert c.p_value < 0.001 and c.status == EQUIVALENT and c.direction is None


def test_one_run_each_gives_the_ratio_and_no_interval_from_its_steps() -> None:
    c = pair(build_statistics([make_run("ddp", tokens_per_s=1830), make_run("single")]), THROUGHPUT, "ddp", "single")
    assert (c.status, c.method, c.ci95, c.p_value) == (NOT_ESTABLISHED, ONE_UNIT, None, None)
    assert c.ratio == pytest.approx(1.83) and c.units_needed == units_for_power(1.83, 0.05, 1, 0.02)
    assert c.spread == 0.05 and not c.spread_measured


def test_each_status_is_read_from_the_holm_adjusted_p() -> None:
    """Three pairs whose raw p sit just under 5% are not all established once corrected."""
    rng = np.random.default_rng(3)
    base = rng.normal(0, 0.03, 4)
    runs = [
        *throughputs("a", list(1000 * np.exp(base))),
        *throughputs("b", list(1050 * np.exp(base[::-1] * 1.1))),
        *throughputs("c", list(1100 * np.exp(-base))),
    ]
    comparisons = build_statistics(runs).comparisons
    throughput = [c for c in comparisons if c.figure == THROUGHPUT]
    assert [c.p_adjusted for c in throughput] == holm([c.p_value for c in throughput])
    for c in throughput:
        expected = c.p_adjusted < 0.05 and not inside(c.ratio, 0.02)
        assert (c.status == ESTABLISHED) == expected


def test_holm_multiplies_by_the_pairs_left_and_keeps_the_order() -> None:
    assert holm([0.01, 0.04, None, 0.03]) == pytest.approx([0.03, 0.06, None, 0.06])
    assert holm([0.5, 0.9]) == [1.0, 1.0]


# ---------------------------------------------------------------------------------------------
# Exact figures: compared on their values at any number of runs


@pytest.mark.parametrize("repeats", [1, 3, 6])
def test_a_count_every_run_repeats_is_established_at_any_number_of_runs(repeats: int) -> None:
    runs = [
        *[make_run("fsdp", step_peak=[330 * 2**20, 320 * 2**20], name=f"r{i}") for i in range(repeats)],
        *[make_run("ddp", step_peak=[350 * 2**20, 350 * 2**20], name=f"r{i}") for i in range(repeats)],
    ]
    c = pair(build_statistics(runs), STEP_PEAK, "fsdp", "ddp")
    assert (c.status, c.direction, c.method, c.p_value) == (ESTABLISHED, LOWER, EXACT, None)
    assert c.ratio == 330 / 350


def test_a_count_that_repeats_runs_apart_is_tested_not_declared() -> None:
    runs = [
        *[make_run("fsdp", step_peak=[v], name=f"r{v}") for v in (330, 331)],
        *[make_run("ddp", step_peak=[v], name=f"r{v}") for v in (350, 352)],
    ]
    assert pair(build_statistics(runs), STEP_PEAK, "fsdp", "ddp").method == WELCH


def test_cpu_fp32_losses_are_exact_and_gpu_losses_are_not() -> None:
    """One seed a side: equal within the margin is equivalent, exactly; a gap is that seed's, not established."""
    same = [make_run("ddp", final_val_loss=6.0), make_run("single", final_val_loss=6.0 + 1e-6)]
    c = pair(build_statistics(same), FINAL_VAL_LOSS, "ddp", "single")
    assert (c.status, c.method) == (EQUIVALENT, EXACT)
    cpu = [make_run("ddp", final_val_loss=6.0), make_run("single", final_val_loss=6.1)]
    c = pair(build_statistics(cpu), FINAL_VAL_LOSS, "ddp", "single")
    assert (c.status, c.direction, c.method) == (NOT_ESTABLISHED, None, EXACT) and "one seed a side" in c.reason
    gpu = [
        make_run("ddp", final_val_loss=6.0, device_type="cuda"),
        make_run("single", final_val_loss=6.1, device_type="cuda"),
    ]
    assert pair(build_statistics(gpu), FINAL_VAL_LOSS, "ddp", "single").status == NOT_ESTABLISHED
    fp16 = [make_run(s, final_val_loss=v, precision="fp16") for s, v in (("ddp", 6.0), ("single", 6.1))]
    assert pair(build_statistics(fp16), FINAL_VAL_LOSS, "ddp", "single").method == ONE_UNIT


# ---------------------------------------------------------------------------------------------
# The unit of replication: a seed for losses


def _seeded(strategy: str, seeds: dict[int, float], repeats: int) -> list[Run]:
    return [
        make_run(strategy, seed=seed, final_val_loss=loss, device_type="cuda", name=f"s{seed}-r{k}")
        for seed, loss in seeds.items()
        for k in range(repeats)
    ]


def test_a_seeds_repeats_are_one_unit_of_a_loss_and_decide_nothing_more() -> None:
    """2 seeds x 3 identical repeats say what the 2 seeds say: pooled as 6 runs each they would give p < 0.01."""
    a, b = {1: 6.00, 2: 6.20}, {1: 6.25, 2: 6.45}
    repeated = build_statistics([*_seeded("ddp", a, 3), *_seeded("fsdp", b, 3)])
    alone = build_statistics([*_seeded("ddp", a, 1), *_seeded("fsdp", b, 1)])
    c, c1 = pair(repeated, FINAL_VAL_LOSS, "ddp", "fsdp"), pair(alone, FINAL_VAL_LOSS, "ddp", "fsdp")
    assert (c.units_a, c.units_b) == (2, 2)
    assert (c.status, c.p_value, c.ci95) == (c1.status, c1.p_value, c1.ci95)
    assert c.status == NOT_ESTABLISHED
    pooled = stats.ttest_ind(np.log([6.0, 6.0, 6.0, 6.2, 6.2, 6.2]), np.log([6.25] * 3 + [6.45] * 3), equal_var=False)
    assert pooled.pvalue < 0.01  # what counting the copies as runs would have called a difference
    assert repeated.summaries[THROUGHPUT]["ddp"].units == 6  # time and memory: every run counts


def test_one_seeds_gpu_repeats_give_one_unit_of_the_validation_loss() -> None:
    """Three repeats of one seed on a GPU differ by their kernels' noise only: still one seed a side."""
    runs = [*_seeded("ddp", {1: 6.0}, 1), *_seeded("fsdp", {1: 6.3}, 1)]
    runs += [
        make_run(s, seed=1, final_val_loss=v, device_type="cuda", name=f"s1-r{k}")
        for s, v, k in (("ddp", 6.01, 1), ("ddp", 5.99, 2), ("fsdp", 6.31, 1), ("fsdp", 6.29, 2))
    ]
    c = pair(build_statistics(runs), FINAL_VAL_LOSS, "ddp", "fsdp")
    assert (c.units_a, c.units_b, c.status) == (1, 1, NOT_ESTABLISHED)


def test_units_average_a_seeds_repeats() -> None:
    figure = Figure("x", "x", "nats", lambda run: run.total.final_val_loss, False, 0.005, replication=SEED)
    runs = [make_run("ddp", seed=s, final_val_loss=v, name=f"{s}{v}") for s, v in ((1, 6.0), (1, 6.2), (2, 7.0))]
    assert list(units(figure, runs)) == pytest.approx([6.1, 7.0])


# ---------------------------------------------------------------------------------------------
# Same runs, same answer: names and order do not matter


@settings(max_examples=40, deadline=None)
@given(
    st.permutations(list(range(18))),
    st.lists(st.text("abcdefgh", min_size=1, max_size=6), min_size=18, max_size=18, unique=True),
)
def test_the_runs_order_and_names_never_change_a_p_value_or_a_status(order: list[int], names: list[str]) -> None:
    rng = np.random.default_rng(11)
    values = {"ddp": 1000 * np.exp(rng.normal(0.03, 0.04, 9)), "fsdp": 1000 * np.exp(rng.normal(0, 0.04, 9))}
    runs = [make_run(s, tokens_per_s=float(v), name=f"r{i}") for s in values for i, v in enumerate(values[s])]
    reference = {(c.figure, c.a, c.b): (c.p_value, c.p_adjusted, c.status) for c in build_statistics(runs).comparisons}
    shuffled = [runs[i] for i in order]
    for run, name in zip(shuffled, names):
        run.path, run.label = Path(run.strategy) / name, name
    again = build_statistics(shuffled)
    for (figure, a, b), said in reference.items():
        c = pair(again, figure, a, b)
        assert (c.p_value, c.p_adjusted, c.status) == said


# ---------------------------------------------------------------------------------------------
# How many runs would establish it


@pytest.mark.parametrize(("ratio", "spread"), [(1.15, 0.05), (0.9, 0.03), (1.83, 0.05)])
def test_the_runs_needed_establish_the_ratio_in_80_percent_of_simulated_reports(ratio: float, spread: float) -> None:
    """Three strategies, one `ratio` away from two equal ones, `spread` between runs: at the units the answer
    gives, the report's own rule (Welch, Holm over the three pairs, the 2% margin) establishes the gap in at
    least 80% of 600 simulated experiments (within 3 standard errors); Bonferroni's rule, which the count is
    worked out for, not at one unit fewer."""
    n = units_for_power(ratio, spread, pairs=3, margin=0.02)
    assert n is not None and n >= 2
    figure = Figure(THROUGHPUT, "t", "tokens/s", lambda run: run.total.tokens_per_s, True, 0.02, timed=True)
    rng = np.random.default_rng(17)

    def power(units: int, adjust: str) -> float:
        hits = 0
        for _ in range(600):
            logs = rng.normal(0.0, spread, (3, units)) + np.array([[math.log(ratio)], [0.0], [0.0]])
            groups = {name: throughputs(name, list(np.exp(row))) for name, row in zip("abc", logs)}
            c = compare_figure(figure, groups, advise=False)[0]
            p = c.p_adjusted if adjust == "holm" else min(1.0, 3 * c.p_value)
            hits += p < 0.05 and not inside(c.ratio, 0.02)
        return hits / 600

    error = 3 * math.sqrt(0.8 * 0.2 / 600)
    assert power(n, "holm") >= 0.8 - error
    if n > 2:
        assert power(n - 1, "bonferroni") < 0.8 + error


def test_no_run_count_beyond_the_cap_or_inside_the_margin() -> None:
    assert units_for_power(1.001, 0.05) is None
    assert units_for_power(1.015, 0.0001, margin=0.02) is None
    assert units_for_power(2.0, 0.01) == 2
    assert units_for_power(1.3, 0.0) == 2  # no spread at all: two runs each show it


def test_the_spread_is_measured_from_strategies_with_two_runs() -> None:
    runs = [*throughputs("ddp", [1100.0, 1210.0]), make_run("fsdp", tokens_per_s=1000.0)]
    c = pair(build_statistics(runs), THROUGHPUT, "ddp", "fsdp")
    assert c.spread_measured and c.spread == pytest.approx(np.std(np.log([1100, 1210]), ddof=1))


# ---------------------------------------------------------------------------------------------
# One strategy's summary


def test_a_summary_is_the_geometric_mean_with_the_t_interval_of_its_logarithm() -> None:
    figure = Figure(THROUGHPUT, "t", "tokens/s", lambda run: run.total.tokens_per_s, True, 0.02)
    values = [900.0, 1000.0, 1200.0]
    s = summarize(figure, throughputs("ddp", values))
    logs = np.log(values)
    half = stats.t.ppf(0.975, 2) * stats.sem(logs)
    assert s.centre == pytest.approx(math.exp(logs.mean()))
    assert s.ci95 == pytest.approx((math.exp(logs.mean() - half), math.exp(logs.mean() + half)))
    assert (s.runs, s.units, s.exact) == (3, 3, False)


def test_one_run_has_no_interval_unless_it_is_a_count() -> None:
    statistics = build_statistics([make_run("ddp", step_peak=[5, 7])])
    assert statistics.summaries[THROUGHPUT]["ddp"].ci95 is None
    assert statistics.summaries[STEP_PEAK]["ddp"].ci95 == (7, 7)


def test_report_json_has_no_non_finite_number() -> None:
    assert json_ready({"a": [math.nan, {"b": math.inf}], "c": 1.5}) == {"a": [None, {"b": None}], "c": 1.5}


# ---------------------------------------------------------------------------------------------
# Time and tokens to a target


def test_time_to_target_is_interpolated_between_evaluations() -> None:
    run = make_run("ddp", evals=[(10, 7.0), (20, 5.0)], step_seconds=2.0)
    assert time_to_target(run, 6.0) == pytest.approx((30.0, 15_000.0))
    assert time_to_target(run, 7.5) == pytest.approx((20.0, 10_000.0))  # reached at the first evaluation
    assert time_to_target(run, 4.0) is None


def test_time_to_target_is_compared_only_when_every_run_reached_it() -> None:
    fast = [make_run("ddp", evals=[(10, 7.0), (20, 5.0)], step_seconds=s, name=f"{s}") for s in (1.0, 1.02, 0.99)]
    slow = [make_run("single", evals=[(10, 7.0), (20, 5.0)], step_seconds=s, name=f"{s}") for s in (2.0, 2.03, 1.98)]
    c = pair(build_statistics([*fast, *slow], target_loss=6.0), TARGET_SECONDS, "ddp", "single")
    assert (c.status, c.direction) == (ESTABLISHED, LOWER)
    tokens = pair(build_statistics([*fast, *slow], target_loss=6.0), TARGET_TOKENS, "ddp", "single")
    assert (tokens.status, tokens.method) == (EQUIVALENT, EXACT)
    slow[0] = make_run("single", evals=[(10, 7.0), (20, 6.5)], step_seconds=2.0, name="never")
    c = pair(build_statistics([*fast, *slow], target_loss=6.0), TARGET_SECONDS, "ddp", "single")
    assert c.status == NOT_ESTABLISHED and c.reason == "1 of 3 runs of single never reached it"


def test_swapping_the_sides_turns_the_ratio_round() -> None:
    runs = [*throughputs("ddp", [1830.0, 1850.0]), *throughputs("single", [1000.0, 1010.0])]
    statistics = build_statistics(runs)
    there, back = pair(statistics, THROUGHPUT, "ddp", "single"), pair(statistics, THROUGHPUT, "single", "ddp")
    assert back.ratio == pytest.approx(1 / there.ratio) and back.direction == LOWER and there.direction == HIGHER
    assert back.ci95 == pytest.approx((1 / there.ci95[1], 1 / there.ci95[0]))


def test_figure_compares_every_pair_once() -> None:
    figure = Figure("x", "x", "s", lambda run: run.total.tokens_per_s, True, 0.02)
    groups = {name: throughputs(name, [1000.0 + i, 1001.0 + i]) for i, name in enumerate("abc")}
    assert [(c.a, c.b) for c in compare_figure(figure, groups)] == [("a", "b"), ("a", "c"), ("b", "c")]


def test_the_target_counts_seeds_not_their_repeats() -> None:
    """2 seeds x 3 repeats reach the target as 2 seeds do: the tokens per seed, the seconds per seed once a
    strategy has several; one seed's repeats are runs of the seconds (they vary by the machine alone)."""

    def runs(strategy: str, seeds: dict[int, float], repeats: int) -> list[Run]:
        return [
            make_run(strategy, seed=seed, evals=[(10, 7.0), (20, loss)], step_seconds=1 + 0.01 * k, name=f"{seed}-{k}")
            for seed, loss in seeds.items()
            for k in range(repeats)
        ]

    a, b = {1: 5.0, 2: 5.6}, {1: 5.4, 2: 5.9}
    repeated = build_statistics([*runs("ddp", a, 3), *runs("fsdp", b, 3)], target_loss=6.0)
    alone = build_statistics([*runs("ddp", a, 1), *runs("fsdp", b, 1)], target_loss=6.0)
    for figure in (TARGET_TOKENS, TARGET_SECONDS):
        c, c1 = pair(repeated, figure, "ddp", "fsdp"), pair(alone, figure, "ddp", "fsdp")
        assert (c.units_a, c.units_b) == (2, 2) and c.status == c1.status, figure
        assert c.p_value == pytest.approx(c1.p_value, rel=1e-9), figure
    one_seed = build_statistics([*runs("ddp", {1: 5.0}, 3), *runs("fsdp", {1: 5.0}, 3)], target_loss=6.0)
    assert pair(one_seed, TARGET_SECONDS, "ddp", "fsdp").units_a == 3
    assert pair(one_seed, TARGET_TOKENS, "ddp", "fsdp").units_a == 1


def test_repeats_of_a_figure_that_is_no_count_agreeing_by_chance_establish_nothing() -> None:
    runs = [
        make_run(s, name=f"r{k}", peak_mem_allocated_mib_max=v)
        for s, v in (("ddp", 900), ("fsdp", 950))
        for k in (0, 1)
    ]
    c = pair(build_statistics(runs), "peak_rss_mib", "ddp", "fsdp")
    assert c.status == NOT_ESTABLISHED and c.ci95 is None and "no spread to test" in c.reason


def test_a_spread_is_assumed_for_times_only() -> None:
    runs = [
        make_run("ddp", tokens_per_s=1500, peak_mem_allocated_mib_max=900),
        make_run("fsdp", peak_mem_allocated_mib_max=700),
    ]
    statistics = build_statistics(runs)
    speed, memory = pair(statistics, THROUGHPUT, "ddp", "fsdp"), pair(statistics, "peak_rss_mib", "ddp", "fsdp")
    assert speed.spread == 0.05 and not speed.spread_measured and speed.units_needed is not None
    assert memory.spread is None and memory.units_needed is None and memory.status == NOT_ESTABLISHED
