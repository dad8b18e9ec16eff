"""The calibration on real runs (`python -m analysis.calibration --runs OUT`), in process on run folders written
as train.py writes them: a planted two-mode pool whose splits must give false verdicts, the split generator's
two branches, the header and the small claims of the command line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from analysis import calibration
from analysis.calibration import calibrate_real, default_target, distinct_splits, pooled_runs, splits
from tests.analysis_fixtures import FakeRun, write_run

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
