"""The calibration on real runs (`python -m analysis.calibration --runs OUT`), in process on run folders written
as train.py writes them: a planted two-mode pool whose splits must give false verdicts, the split generator's
two branches, the header and the small claims of the command line."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from analysis import calibration
from analysis.calibration import calibrate_real, default_target, distinct_splits, pooled_runs, splits
from tests.analysis_fixtures import FakeRun, write_run
from tests.test_statistics import make_run

# Equal losses make scipy's moment-based statistics warn about nearly identical data; that is the point here.
pytestmark = pytest.mark.filterwarnings("ignore:Precision loss occurred:RuntimeWarning")
POOL = 8
LIMIT = 40  # n = 2 and 3 drawn at random (210 and 280 distinct), n = 4 every one of its 35


def two_mode_pool(root: Path, runs: int = POOL) -> Path:
    """`runs` complete ddp runs in an experiment's layout, every second one on a device 20% faster: same seed,
    same losses, so the tokens to a target tie and only the seconds (and the throughput) tell the modes apart."""
    for k in range(runs):
        arm = "ddp" if k % 2 == 0 else "ddp#2"
        write_run(
            root / "runs" / arm / f"r{k // 2 + 1}",
            FakeRun("ddp", 2, tokens_per_s=40_000.0 * (1.2 if k < runs // 2 else 1.0)),
        )
    return root


def test_a_two_mode_pool_gives_false_verdicts_on_disjoint_distinct_splits(tmp_path: Path, monkeypatch) -> None:
    runs = pooled_runs(two_mode_pool(tmp_path))
    seen: list[tuple[tuple[int, ...], ...]] = []

    def recording(pool: int, n: int, limit: int, rng: np.random.Generator):
        for split in splits(pool, n, limit, rng):
            seen.append(split)
            yield split

    monkeypatch.setattr(calibration, "splits", recording)
    counts = {(c.figure, c.repeats): c for c in calibrate_real(runs, default_target(runs), limit=LIMIT)}
    for n in (2, 3, 4):
        mine = [s for s in seen if len(s[0]) == n]
        assert len(mine) == len(set(mine)) == min(LIMIT, distinct_splits(POOL, n))  # no split twice
        assert all(not set(a) & set(b) and len(b) == n for a, b in mine)  # a side never shares a run with the other
    # The modes split 4/4 at n=4: the one split that puts all fast runs on one side (exact p 2/70) is called, on
    # the time to the target (the log-rank's sooner/later) as on the throughput.
    seconds, tokens = counts[("to target: seconds", 4)], counts[("to target: tokens", 4)]
    assert seconds.splits == 35 and seconds.false_verdicts == 1, seconds
    assert tokens.false_verdicts == 0  # equal tokens are never a verdict
    assert counts[("tokens_per_s", 4)].false_verdicts >= 1
    # Fewer runs each allow no verdict on the time (3 vs 3: smallest exact p 0.1), whatever the split.
    assert counts[("to target: seconds", 2)].false_verdicts == counts[("to target: seconds", 3)].false_verdicts == 0


def test_a_pool_of_one_mode_gives_no_false_verdict_on_equal_figures(tmp_path: Path) -> None:
    for k in range(6):
        write_run(tmp_path / "runs" / f"r{k}", FakeRun("ddp", 2))
    runs = pooled_runs(tmp_path)
    assert all(c.false_verdicts == 0 for c in calibrate_real(runs, default_target(runs)))


@pytest.mark.parametrize("pool, n, limit", [(10, 5, 50), (12, 4, 300), (10, 2, 629)])
def test_random_splits_are_disjoint_distinct_reproducible(pool: int, n: int, limit: int) -> None:
    assert distinct_splits(pool, n) > limit  # the random branch
    drawn = list(splits(pool, n, limit, np.random.default_rng(7)))
    assert len(drawn) == len(set(drawn)) == limit
    assert all(len(a) == len(b) == n and not set(a) & set(b) and a < b for a, b in drawn)
    assert drawn == list(splits(pool, n, limit, np.random.default_rng(7)))
    assert drawn != list(splits(pool, n, limit, np.random.default_rng(8)))


@pytest.mark.parametrize("limit", [630, 631, 10**6])
def test_a_limit_at_or_above_the_distinct_splits_enumerates_them_all(limit: int) -> None:
    drawn = list(splits(10, 2, limit, np.random.default_rng(0)))
    assert len(drawn) == len(set(drawn)) == 630 == distinct_splits(10, 2)


@pytest.mark.parametrize(
    "pool, n, expected", [(4, 2, 3), (6, 3, 10), (10, 2, 630), (10, 5, 126), (12, 6, 462), (12, 5, 8316)]
)
def test_distinct_splits_count_unordered_pairs_of_disjoint_groups(pool: int, n: int, expected: int) -> None:
    assert distinct_splits(pool, n) == expected
    assert len(list(splits(pool, n, expected, np.random.default_rng(0)))) == expected


def test_the_header_names_the_splits_taken_of_the_distinct_ones(tmp_path: Path, capsys) -> None:
    two_mode_pool(tmp_path)
    assert calibration.main(["--runs", str(tmp_path), "--splits", "40"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("8 complete ddp runs of")
    assert lines[1] == "splits per n (of the distinct splits): n=2: 40 (of 210), n=3: 40 (of 280), n=4: 35 (of 35)"


def test_bad_splits_is_a_one_line_error(tmp_path: Path, capsys) -> None:
    assert calibration.main(["--runs", str(tmp_path), "--splits", "0"]) == 2
    err = capsys.readouterr().err
    assert err == "error: --splits must be at least 1\n"


def test_a_pool_of_three_complete_runs_is_refused_and_incomplete_runs_are_left_out(tmp_path: Path, capsys) -> None:
    for k in range(3):
        write_run(tmp_path / "runs" / f"r{k}", FakeRun("ddp", 2))
    write_run(tmp_path / "runs" / "r3", FakeRun("ddp", 2, complete=False))  # interrupted: not in the pool
    with pytest.raises(calibration.PoolError, match=r"holds 3 complete runs; an A/A split needs at least 4$"):
        pooled_runs(tmp_path)
    assert calibration.main(["--runs", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "needs at least 4" in err and len(err.strip().splitlines()) == 1
    write_run(tmp_path / "runs" / "r4", FakeRun("ddp", 2))
    assert sorted(run.path.name for run in pooled_runs(tmp_path)) == ["r0", "r1", "r2", "r4"]


def test_runs_accepts_the_experiment_folder_or_its_runs_folder(tmp_path: Path) -> None:
    two_mode_pool(tmp_path)
    names = [r.path for r in pooled_runs(tmp_path)]
    assert len(names) == POOL and names == [r.path for r in pooled_runs(tmp_path / "runs")]


def test_the_default_target_is_halfway_between_the_first_runs_first_and_last_validation(tmp_path: Path) -> None:
    fake = FakeRun("ddp", 2, epochs=3)
    for k in range(4):
        write_run(tmp_path / f"r{k}", fake)
    first, last = (fake.loss(epoch * fake.steps_per_epoch) + 0.1 for epoch in (1, fake.epochs))
    assert default_target(pooled_runs(tmp_path)) == pytest.approx((first + last) / 2, abs=1e-12)


@pytest.mark.parametrize("repeats, hits, total", [(3, 0, 20), (4, 2, 70), (5, 12, 252)])
def test_the_exact_log_rank_size_is_enumerated_over_every_relabelling(repeats: int, hits: int, total: int) -> None:
    # 12 of 252 ordered relabellings are the 6 of 126 unordered splits: 4.76%, within the 5% goal, exactly.
    assert calibration.exact_target_rate(repeats) == (hits, total)
    assert hits / total <= calibration.FALSE_RATE_BOUND


def test_an_a_a_experiment_is_predicted_to_take_twice_one_arm(tmp_path: Path) -> None:
    from analysis.experiment import ExperimentSpec, predicted_wall_time
    from tests.test_experiment_repeats import BATCH

    def spec(*strategies: str) -> ExperimentSpec:
        return ExperimentSpec(preset="tiny", out=tmp_path, max_steps=4, seed=7, experiment="e", strategies=strategies)

    one, _ = predicted_wall_time(spec("ddp"), {"ddp": 2}, BATCH)
    two, line = predicted_wall_time(spec("ddp", "ddp"), {"ddp": 2}, BATCH)
    assert one is not None and two is not None, line
    # The step time on this CPU is a measurement that may differ between calls: compare the steps x runs it scales.
    assert two.runs == {"ddp": 2 * one.runs["ddp"]}
    assert two.seconds["ddp"] / two.step_s["ddp"] == pytest.approx(2 * one.seconds["ddp"] / one.step_s["ddp"])


# ---------------------------------------------------------------------------------------------
# Every split, counted exactly


def test_by_default_every_split_is_counted_once(tmp_path: Path, monkeypatch) -> None:
    runs = pooled_runs(two_mode_pool(tmp_path))
    seen: list[tuple[tuple[int, ...], ...]] = []

    def recording(pool: int, n: int, limit: int | None, rng: np.random.Generator):
        for split in splits(pool, n, limit, rng):
            seen.append(split)
            yield split

    monkeypatch.setattr(calibration, "splits", recording)
    counts = calibrate_real(runs, default_target(runs))
    for n, expected in ((2, 210), (3, 280), (4, 35)):
        mine = [s for s in seen if len(s[0]) == n]
        assert len(mine) == len(set(mine)) == expected == distinct_splits(POOL, n)
        assert all(a < b and not set(a) & set(b) and len(b) == n for a, b in mine)
        # Every figure is compared on every split: its count's denominator is the binomial coefficient.
        assert {c.splits for c in counts if c.repeats == n} == {expected}
    assert {c.figure for c in counts} >= {"tokens_per_s", "to target: seconds", "to target: tokens"}


def _screened_and_every(runs: list, monkeypatch) -> tuple[list, list]:
    """The real calibration's counts as the command takes them (splits screened by their batched p) and with
    every split sent through the report's functions (nothing screened out)."""
    screened = calibrate_real(runs, default_target(runs))
    with monkeypatch.context() as patch:
        patch.setattr(calibration, "SCREEN", math.inf)
        every = calibrate_real(runs, default_target(runs))
    return screened, every


def test_the_splits_left_out_of_the_report_are_those_that_cannot_give_a_verdict(tmp_path: Path, monkeypatch) -> None:
    # The screen (a batched exact p at least 0.10, a log-rank p at least 0.10) against every split through the
    # report's functions: the same counts, on a pool whose splits do give verdicts (the one of 35 that puts the
    # fast mode on one side) and on one of distinct levels.
    monkeypatch.setattr(calibration, "REAL_REPEATS", (4,))
    two_mode = pooled_runs(two_mode_pool(tmp_path / "modes"))
    levels = [40_000.0 * math.exp(v) for v in (0.03, -0.05, 0.08, 0.0, -0.02, 0.11, -0.09, 0.05)]
    for k, level in enumerate(levels):
        write_run(tmp_path / "levels" / f"r{k}", FakeRun("ddp", 2, tokens_per_s=level))
    distinct = pooled_runs(tmp_path / "levels")
    for runs in (two_mode, distinct):
        screened, every = _screened_and_every(runs, monkeypatch)
        assert screened == every
        assert sum(c.false_verdicts for c in every if c.figure in ("tokens_per_s", "to target: seconds")) >= 2


def test_at_five_runs_each_the_screen_leaves_out_only_splits_without_a_verdict(tmp_path: Path, monkeypatch) -> None:
    # At 5 and 5 the exact p comes down to 2/252 and a verdict is possible at 4, 6, 8, 10 and 12 of 252: a screen
    # below 0.10 that cut at any of them would count fewer. Runs with their own loss noise reach the target at
    # different tokens, in an order other than their seconds', so the tokens' own screen is exercised too.
    monkeypatch.setattr(calibration, "REAL_REPEATS", (5,))
    rng = np.random.default_rng(5)
    for k, level in enumerate(40_000.0 * np.exp(rng.normal(0.0, 0.1, 10))):
        write_run(tmp_path / f"r{k}", FakeRun("ddp", 2, tokens_per_s=float(level), noise_seed=k, loss_noise=0.2))
    screened, every = _screened_and_every(pooled_runs(tmp_path), monkeypatch)
    assert screened == every
    counts = {c.figure: c for c in every}
    assert all(c.splits == 126 for c in every)
    # Both figures of the time to target decide some splits, and not the same ones: each screen is needed.
    assert counts["to target: seconds"].false_verdicts > 0 and counts["to target: tokens"].false_verdicts > 0
    assert counts["tokens_per_s"].false_verdicts > 0


def test_over_every_split_of_twelve_runs_an_exact_test_decides_at_most_twelve_of_252(monkeypatch) -> None:
    # 12 distinct throughputs: each 10 of them split 126 ways, of which at most 6 (12 of 252 relabellings) have an
    # exact p below 0.05, so at most 6 x 66 = 396 of the 8,316 splits, counted exactly, not sampled. (The resident
    # set is equal in every run: a point, never a verdict.)
    monkeypatch.setattr(calibration, "REAL_REPEATS", (5,))
    levels = 40_000 * np.exp(np.random.default_rng(11).normal(0, 0.1, 12))
    runs = [make_run("ddp", tokens_per_s=float(t), name=f"r{k}", world_size=2) for k, t in enumerate(levels)]
    counts = {c.figure: c for c in calibrate_real(runs, None)}
    assert set(counts) == {"tokens_per_s", "peak_rss_mib"} and counts["peak_rss_mib"].false_verdicts == 0
    throughput = counts["tokens_per_s"]
    assert throughput.splits == throughput.distinct == 8316
    assert 0 < throughput.false_verdicts <= 396 and throughput.false_rate <= 12 / 252


# ---------------------------------------------------------------------------------------------
# What the splits cannot see: the arms as run and drift over the launch order

# Launch order of a 12-run A/A experiment's folders, each half 3 of each arm (not the folders' order, nor a plain
# interleaving), and the levels of the runs by launch position, the second half a repeat of the first.
LAUNCHED = [
    ("ddp#2", 3), ("ddp", 1), ("ddp", 5), ("ddp#2", 6), ("ddp", 2), ("ddp#2", 1),
    ("ddp", 4), ("ddp#2", 2), ("ddp", 6), ("ddp#2", 5), ("ddp", 3), ("ddp#2", 4),
]  # fmt: skip
LEVELS = [1.00, 1.03, 1.01, 1.04, 1.02, 1.05]


def launched_pool(
    root: Path,
    slowdown: float,
    slower_arm: tuple[str, float] = ("", 1.0),
    launched: Sequence[tuple[str, int]] = LAUNCHED,
    levels: Sequence[float] | None = None,
) -> Path:
    """`launched` (LAUNCHED) as an experiment writes it (arms in config.json, runs/order.json), the second half of
    the launches `slowdown` times slower, and the runs of the arm `slower_arm[0]` `slower_arm[1]` times slower;
    `levels`: each launch's level instead of LEVELS's."""
    rows = []
    for position, (arm, k) in enumerate(launched):
        level = (
            (LEVELS[position % 6] if levels is None else levels[position])
            / (slowdown if position >= 6 else 1.0)
            / (slower_arm[1] if arm == slower_arm[0] else 1.0)
        )
        run = write_run(root / "runs" / arm / f"r{k}", FakeRun("ddp", 2, tokens_per_s=40_000.0 * level))
        config = json.loads((run / "config.json").read_text())
        (run / "config.json").write_text(json.dumps({**config, "run": {**config["run"], "arm": arm}}))
        rows.append({"arm": arm, "run_dir": str(run), "returncode": 0})
    (root / "runs" / "order.json").write_text(json.dumps({"runs": rows}))
    return root


def test_a_machine_ten_percent_slower_in_the_second_half_is_a_drift_verdict(tmp_path: Path) -> None:
    out = launched_pool(tmp_path, slowdown=1.10)
    runs = pooled_runs(out)
    trial = calibration.drift(out, runs, default_target(runs))
    assert trial is not None and trial.name == "drift: last 6 launched vs first 6"
    # The second half's throughput is lower, its training longer and its time to the target later: the most
    # extreme of C(12, 6) = 924 relabellings, p = 2/924; the tokens to the target do not move.
    assert trial.verdicts["tokens_per_s"] == ("lower", pytest.approx(2 / 924))
    assert trial.verdicts["train_time_s"][0] == "higher"
    assert trial.verdicts["to target: seconds"] == ("later", pytest.approx(2 / 924))
    assert sorted(trial.flagged) == ["to target: seconds", "tokens_per_s", "train_time_s"]
    # Each arm has three runs of each half: the arms as run see nothing.
    as_run = calibration.arms_as_run(runs, default_target(runs))
    assert as_run is not None and as_run.name == "as run: ddp#2 vs ddp (6 vs 6)" and as_run.flagged == []


def test_no_drift_is_no_verdict_and_both_trials_are_printed(tmp_path: Path, capsys) -> None:
    out = launched_pool(tmp_path, slowdown=1.0)
    runs = pooled_runs(out)
    trial = calibration.drift(out, runs, default_target(runs))
    assert trial is not None and trial.flagged == [] and trial.verdicts["tokens_per_s"][1] == 1.0
    assert calibration.main(["--runs", str(out), "--splits", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("single trials (one per experiment: a verdict is this experiment's outcome, not a rate):")
    assert "as run: ddp#2 vs ddp (6 vs 6)" in lines[at + 1] and "drift: last 6 launched vs first 6" in lines[at + 1]
    (row,) = [line for line in lines[at:] if line.startswith("tokens_per_s")]
    assert row.count("no detectable difference, p = ") == 2


def test_without_an_order_naming_every_run_there_is_no_drift_row(tmp_path: Path, capsys) -> None:
    out = launched_pool(tmp_path, slowdown=1.10)
    order = json.loads((out / "runs" / "order.json").read_text())
    (out / "runs" / "order.json").write_text(json.dumps({"runs": order["runs"][1:]}))  # one run not named
    runs = pooled_runs(out)
    assert calibration.launch_order(out, runs) is None and calibration.drift(out, runs, None) is None
    assert calibration.main(["--runs", str(out), "--splits", "5"]) == 0
    assert "drift: none (no runs/order.json naming every run)" in capsys.readouterr().out.splitlines()


def test_the_launch_order_is_order_json_s_whichever_folder_is_given(tmp_path: Path) -> None:
    out = launched_pool(tmp_path, slowdown=1.0)
    for folder in (out, out / "runs"):
        ordered = calibration.launch_order(folder, pooled_runs(folder))
        assert ordered is not None
        assert [(r.arm, r.path.name) for r in ordered] == [(arm, f"r{k}") for arm, k in LAUNCHED]


def test_a_trials_verdict_is_its_primary_figures_the_throughput(tmp_path: Path, capsys) -> None:
    # Throughput, training time and the seconds to the target are one clock read three ways: the drift row's
    # verdict is the throughput's alone, one test, not the most striking of ten uncorrected ones.
    out = launched_pool(tmp_path, slowdown=1.10)
    assert calibration.main(["--runs", str(out), "--splits", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    (drift,) = [line for line in lines if line.startswith("drift: last 6 launched vs first 6: primary figure")]
    assert "tokens_per_s: lower, p = 0.00216 (one trial;" in drift
    (as_run,) = [line for line in lines if line.startswith("as run: ddp#2 vs ddp (6 vs 6): primary figure")]
    assert "tokens_per_s: no detectable difference" in as_run


def test_the_arms_as_run_compare_the_second_arm_against_the_first(tmp_path: Path) -> None:
    # ddp#2 10% slower in every run: every ddp#2 run below every ddp run, so ddp#2 against ddp is `lower`.
    out = launched_pool(tmp_path, slowdown=1.0, slower_arm=("ddp#2", 1.1))
    runs = pooled_runs(out)
    as_run = calibration.arms_as_run(runs, None)
    assert as_run is not None and as_run.name == "as run: ddp#2 vs ddp (6 vs 6)"
    assert as_run.verdicts["tokens_per_s"] == ("lower", pytest.approx(2 / 924))


@pytest.mark.parametrize("text", ["{}", "[]", "not json", '{"runs": [{"arm": "ddp"}]}'])
def test_a_malformed_launch_order_is_no_drift_row(tmp_path: Path, text: str, capsys) -> None:
    out = launched_pool(tmp_path, slowdown=1.0)
    (out / "runs" / "order.json").write_text(text)
    runs = pooled_runs(out)
    assert calibration.launch_order(out, runs) is None and calibration.drift(out, runs, None) is None
    assert calibration.main(["--runs", str(out), "--splits", "3"]) == 0
    assert "drift: none (no runs/order.json naming every run)" in capsys.readouterr().out.splitlines()


def test_a_pool_of_one_arm_has_no_as_run_trial(tmp_path: Path, capsys) -> None:
    two_mode_pool(tmp_path)  # no arm recorded: every run is ddp's
    assert calibration.main(["--runs", str(tmp_path), "--splits", "3"]) == 0
    assert "as run: none (the runs hold 1 arms, not 2)" in capsys.readouterr().out.splitlines()


def test_an_odd_pool_leaves_the_middle_launch_out_of_both_halves(tmp_path: Path) -> None:
    # 7 launches, the last 3 about 10% faster than the first 3: 3 against 3, p = 2/20. The middle launch is far
    # slower; counted in either half it would make that half 4 runs and the p another.
    levels = [1.00, 1.01, 1.02, 0.80, 1.10, 1.11, 1.12]
    out = launched_pool(tmp_path, slowdown=1.0, launched=LAUNCHED[:7], levels=levels)
    runs = pooled_runs(out)
    trial = calibration.drift(out, runs, None)
    assert trial is not None and trial.name == "drift: last 3 launched vs first 3"
    assert trial.verdicts["tokens_per_s"][1] == pytest.approx(2 / 20)


def test_a_run_launched_again_after_an_interruption_is_placed_at_its_last_launch(tmp_path: Path) -> None:
    out = launched_pool(tmp_path, slowdown=1.0)
    order = json.loads((out / "runs" / "order.json").read_text())
    relaunched = order["runs"][0]
    (out / "runs" / "order.json").write_text(json.dumps({"runs": [*order["runs"], relaunched]}))
    ordered = calibration.launch_order(out, pooled_runs(out))
    assert ordered is not None and ordered[-1].path.resolve() == Path(relaunched["run_dir"]).resolve()
    assert ordered[0].path.resolve() == Path(order["runs"][1]["run_dir"]).resolve()
