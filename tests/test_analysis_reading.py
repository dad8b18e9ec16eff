"""The automatic reading follows the data: fastest, least memory, loss agreement, fairness."""

from __future__ import annotations

from pathlib import Path

from analysis.report import agreement_lines, build_reading, fairness, fairness_lines, loss_agreement
from analysis.runs import Run, assign_labels, load_run, sort_runs
from analysis.uncertainty import THROUGHPUT, build_statistics
from tests.analysis_fixtures import three_strategies


def runs_of(root: Path, **overrides: dict) -> list[Run]:
    runs = [load_run(path) for path in three_strategies(root, **overrides)]
    assign_labels(runs)
    return sort_runs(runs)


def repeated_runs_of(root: Path, repeats: int = 5, **overrides: dict) -> list[Run]:
    """`repeats` runs of each strategy, their throughputs 1% apart (the fixture's figure, then 1% up, 2% up, ...)."""
    runs = []
    for k in range(repeats):
        base = {name: {"tokens_per_s": tokens_per_s} for name, tokens_per_s in BASE_THROUGHPUT.items()}
        for name, changes in overrides.items():
            base[name] = {**base[name], **changes}
        jittered = {name: {**c, "tokens_per_s": c["tokens_per_s"] * (1 + 0.01 * k)} for name, c in base.items()}
        runs += [load_run(path) for path in three_strategies(root / f"r{k}", **jittered)]
    assign_labels(runs)
    return sort_runs(runs)


BASE_THROUGHPUT = {"single": 40_000, "ddp": 72_000, "fsdp": 60_000}  # tests/analysis_fixtures.three_strategies


def answer(runs: list[Run]) -> str:
    return " ".join(build_reading(runs, []).answer)


def test_one_run_each_names_the_leader_and_what_would_establish_it(tmp_path: Path) -> None:
    text = answer(runs_of(tmp_path))
    assert text.startswith("Speed: **ddp** leads, 72,720 tokens/s; ") and "use **ddp**" not in text.split("Memory")[0]
    # 1.2 and 1.8 apart at the assumed 5% run-to-run spread: the report's rule over three pairs establishes them
    # in 80% of experiments at 4 and 3 runs each.
    assert "1.20x fsdp (1 run each): not established: 4 runs each would establish it" in text
    assert "1.80x single (1 run each): not established: 3 runs each would establish it" in text
    assert "(run-to-run spread 5.0%, assumed: no strategy has 2 runs to measure it)" in text


def test_one_run_each_has_no_interval_and_at_most_three_answer_lines(tmp_path: Path) -> None:
    """Without --target_loss too: one run's step-time noise makes no interval, and the answer stays three lines."""
    runs = runs_of(tmp_path)
    assert all(summary.ci95 is None for summary in build_statistics(runs).summaries[THROUGHPUT].values())
    assert 1 <= len(build_reading(runs, []).answer) <= 3


def test_fastest_strategy_over_repeats(tmp_path: Path) -> None:
    text = answer(repeated_runs_of(tmp_path, repeats=3))
    assert text.startswith("Speed: use **ddp**, ") and "1.20x fsdp (95% CI" in text and "1.80x single (95% CI" in text


def test_fastest_follows_the_data(tmp_path: Path) -> None:
    text = answer(repeated_runs_of(tmp_path, repeats=3, single={"tokens_per_s": 90_000}))
    assert text.startswith("Speed: use **single**, ") and "1.25x ddp" in text


def test_equal_throughputs_are_equivalent_only_inside_the_margin(tmp_path: Path) -> None:
    """Every strategy's repeats 1% apart in step: ddp and fsdp at 0.1% are no tie unless the interval says so."""
    text = answer(repeated_runs_of(tmp_path, repeats=3, fsdp={"tokens_per_s": 71_900}))
    assert "1.00x fsdp (95% CI" in text and "tied" not in text
    assert "equivalent within the 2% margin" in text or "not established" in text


def test_least_memory_strategy_follows_the_data(tmp_path: Path) -> None:
    assert "Memory: use **fsdp**, step peak 1,800.0 MiB" in answer(runs_of(tmp_path / "a"))
    flipped = runs_of(tmp_path / "b", single={"peak_alloc_mib": 1000})
    assert "Memory: use **single**, step peak 1,000.0 MiB" in answer(flipped)


def test_memory_on_cpu_notes_the_resident_set_beside_the_step_peak(tmp_path: Path) -> None:
    runs = runs_of(tmp_path)
    for run in runs:
        run.summary["device_type"] = "cpu"
    (line,) = [line for line in build_reading(runs, []).notes if line.startswith("Resident set")]
    # One run each: the resident set's gaps are figures, not established.
    assert line.startswith("Resident set (per process): **fsdp** least, 1,800 MiB; ")
    assert "not established" in line and "established;" not in line


def test_fairness_warning_only_when_global_batches_differ(tmp_path: Path) -> None:
    equal = runs_of(tmp_path / "equal")
    assert fairness(equal).fair
    assert "Fair comparison" in fairness_lines(fairness(equal), equal)[0]

    unequal = runs_of(tmp_path / "unequal", ddp={"global_batch_tokens": 16384})
    check = fairness(unequal)
    assert not check.fair and "global_batch_tokens" in check.differing
    text = " ".join(fairness_lines(check, unequal))
    assert "Unfair comparison: global batch (tokens) differs" in text and "ddp 16,384" in text
    assert "loss and grad-norm comparison is not like for like" in text


def test_fairness_also_checks_seed_and_precision(tmp_path: Path) -> None:
    runs = runs_of(tmp_path, fsdp={"seed": 7, "precision": "fp32"})
    assert {"seed", "precision"} <= set(fairness(runs).differing)


def test_runs_on_different_data_are_not_compared_as_fair(tmp_path: Path) -> None:
    runs = runs_of(tmp_path, ddp={"data_key": "9" * 32})
    check = fairness(runs)
    assert set(check.differing) == {"data_key"}
    text = " ".join(fairness_lines(check, runs))
    assert "Unfair comparison: data (content key) differs" in text and "ddp 999999999999," in text


def test_loss_curves_with_only_noise_between_them_agree(tmp_path: Path) -> None:
    result = loss_agreement(runs_of(tmp_path))
    assert result.verdict == "agree"
    assert 0.03 < result.sigma < 0.07  # the fixture's noise is 0.05 nats
    assert all(rms < 2 * result.sigma for rms in result.rms.values())


def test_loss_curves_that_diverge_differ(tmp_path: Path) -> None:
    result = loss_agreement(runs_of(tmp_path, fsdp={"loss_end": 6.5}))
    assert result.verdict == "differ"
    assert result.rms["fsdp"] > 2 * result.sigma and result.rms["ddp"] < 2 * result.sigma


def agreement_text(runs: list[Run]) -> str:
    return " ".join(agreement_lines(loss_agreement(runs), fairness(runs)))


def test_curves_apart_by_less_than_the_noise_are_read_as_agreeing(tmp_path: Path) -> None:
    # fsdp ends 0.02 nats higher, less than half the 0.05 nats of step-to-step noise: not a real difference.
    runs = runs_of(tmp_path, fsdp={"loss_end": 6.02})
    result = loss_agreement(runs)
    assert result.verdict == "agree"
    assert 0 < result.rms["fsdp"] < 2 * result.sigma
    text = agreement_text(runs)
    assert text.startswith("Loss curves agree within noise against single") and "more than noise" not in text


def test_curves_apart_by_more_than_the_noise_are_read_as_differing(tmp_path: Path) -> None:
    # fsdp ends 0.2 nats higher, four times the noise: the reading must say so, not call it agreement.
    runs = runs_of(tmp_path, fsdp={"loss_end": 6.2})
    result = loss_agreement(runs)
    assert result.verdict == "differ"
    assert result.rms["fsdp"] > 2 * result.sigma > result.rms["ddp"]
    text = agreement_text(runs)
    assert text.startswith("Loss curves **differ by more than noise** (more than 2 sigma) against single")
    assert "agree" not in text


def test_identical_curves_agree_even_without_noise(tmp_path: Path) -> None:
    same = {"loss_noise": 0.0}
    result = loss_agreement(runs_of(tmp_path, single=same, ddp=same, fsdp=same))
    assert result.verdict == "agree" and max(result.rms.values()) == 0.0


def test_loss_agreement_needs_two_curves(tmp_path: Path) -> None:
    runs = runs_of(tmp_path)[:1]
    assert loss_agreement(runs).verdict == "undetermined"


def with_peaks(runs: list[Run], **peaks: tuple[float, str | None]) -> list[Run]:
    """Give the named runs a measured CPU peak (figure, measurement time), as summary.json records it."""
    for run in runs:
        if run.label in peaks:
            run.summary["peak_flops_per_device"], run.summary["peak_flops_measured_at"] = peaks[run.label]
    return runs


PEAK_LINE = "**MFU is measured against different peaks**"


def test_runs_divided_by_different_peaks_are_named_in_one_line(tmp_path: Path) -> None:
    early, late = "2026-12-03T10:00:00Z", "2026-12-03T11:30:00Z"
    runs = with_peaks(runs_of(tmp_path), single=(48e9, early), ddp=(150e9, late), fsdp=(150e9, late))
    check = fairness(runs)
    assert check.fair  # the loss and throughput comparison is still like for like
    lines = fairness_lines(check, runs)
    (line,) = [line for line in lines if PEAK_LINE in line]
    assert line == (
        f"{PEAK_LINE} (single 48.0 GFLOP/s measured {early}, ddp 150.0 GFLOP/s measured {late}, "
        f"fsdp 150.0 GFLOP/s measured {late}): their MFU figures are not comparable with each other; "
        "throughput is."
    )
    reading = build_reading(runs, [])
    assert line in reading.warnings and line not in reading.notes
    assert any(text.startswith("Fair comparison") for text in reading.notes)


def test_an_equal_figure_measured_at_another_time_is_another_peak(tmp_path: Path) -> None:
    runs = with_peaks(
        runs_of(tmp_path),
        single=(150e9, "2026-12-03T10:00:00Z"),
        ddp=(150e9, "2026-12-03T10:00:00Z"),
        fsdp=(150e9, "2026-12-03T12:00:00Z"),
    )
    assert set(fairness(runs).peaks) == {"single", "ddp", "fsdp"}
    assert sum(PEAK_LINE in line for line in fairness_lines(fairness(runs), runs)) == 1


def test_one_peak_for_every_run_is_not_flagged(tmp_path: Path) -> None:
    table = runs_of(tmp_path / "table")  # the fixture's datasheet figure, no measurement time
    measured = with_peaks(
        runs_of(tmp_path / "measured"),
        single=(150e9, "2026-12-03T10:00:00Z"),
        ddp=(150e9, "2026-12-03T10:00:00Z"),
        fsdp=(150e9, "2026-12-03T10:00:00Z"),
    )
    for runs in (table, measured):
        assert not fairness(runs).peaks
        assert not any(
            PEAK_LINE in line for line in [*fairness_lines(fairness(runs), runs), *build_reading(runs, []).warnings]
        )


def test_a_run_without_a_recorded_peak_time_differs_from_a_measured_one(tmp_path: Path) -> None:
    runs = with_peaks(runs_of(tmp_path), ddp=(150e9, "2026-12-03T10:00:00Z"))
    (line,) = [line for line in fairness_lines(fairness(runs), runs) if PEAK_LINE in line]
    assert "single 65.0 TFLOP/s (no measurement time)" in line and "ddp 150.0 GFLOP/s measured" in line


def test_arms_sort_by_number_and_a_foreign_arm_is_not_believed() -> None:
    import dataclasses

    from analysis.runs import sort_runs
    from tests.test_statistics import make_run

    def armed(arm: str | None, strategy: str = "ddp") -> Run:
        run = make_run(strategy, name=arm or strategy)
        return dataclasses.replace(run, config={"run": {**run.config["run"], "arm": arm}})

    runs = [armed("ddp#10"), armed("ddp#2"), armed(None), armed("ddp#3")]
    assert [r.arm for r in sort_runs(runs)] == ["ddp", "ddp#2", "ddp#3", "ddp#10"]  # not ddp#10 before ddp#2
    assert armed("fsdp").arm == "ddp" and armed("ddp#1").arm == "ddp"  # a hand-edited config names no arm
