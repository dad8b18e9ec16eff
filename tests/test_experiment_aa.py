"""A/A experiments: one strategy under two labels (`--strategies ddp ddp` trains ddp and ddp#2), interleaved like
any two strategies, continued like them, and compared as two arms; one real A/A experiment of 2 x 2 tiny DDP
runs, whose report establishes nothing between the arms, and whose runs the A/A calibration splits."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from filelock import FileLock

from analysis.compare import load_comparison
from analysis.experiment import ExperimentSpec, SetupError, build_launches, main
from analysis.uncertainty import build_statistics
from lab import aa_calibration
from tests.analysis_fixtures import FakeRun, write_launch_configs, write_run
from tests.launch import REPO, free_port, launch_env
from tests.test_experiment_repeats import BATCH, LAUNCHER, PORT_PER_RUN_LAUNCHER, flag

# A stand-in for `accelerate launch ... train.py`: a finished run, its arm recorded as train.py records --arm.
FAKE_TRAIN = """
    import json, sys
    from pathlib import Path
    sys.path.insert(0, {repo!r})
    from tests.analysis_fixtures import FakeRun, write_run

    argv = sys.argv[1:]
    out, strategy = Path(argv[argv.index("--output_dir") + 1]), argv[argv.index("--strategy") + 1]
    with open(out.parent / "launched.jsonl", "a") as f:
        f.write(json.dumps(argv) + "\\n")
    write_run(out, FakeRun(strategy, 2, global_batch_tokens=int(argv[argv.index("--global_batch_tokens") + 1])))
    if "--arm" in argv:
        config = json.loads((out / "config.json").read_text())
        config["run"]["arm"] = argv[argv.index("--arm") + 1]
        (out / "config.json").write_text(json.dumps(config))
"""


def spec(tmp_path: Path, **changes) -> ExperimentSpec:
    values = dict(preset="tiny", out=tmp_path / "exp", max_steps=4, seed=7, experiment="e", strategies=("ddp", "ddp"))
    return ExperimentSpec(**{**values, **changes})


def test_a_strategy_named_twice_runs_as_two_arms_interleaved_each_in_its_folder(tmp_path: Path) -> None:
    runs = build_launches(spec(tmp_path, repeats=2), {"ddp": 2}, BATCH, LAUNCHER, cwd=REPO)
    assert [sorted(l.label for l in runs[k : k + 2]) for k in (0, 2)] == [
        ["ddp#2-r1", "ddp-r1"],
        ["ddp#2-r2", "ddp-r2"],
    ]
    out = tmp_path / "exp" / "runs"
    assert {l.run_dir for l in runs} == {out / arm / f"r{k}" for k in (1, 2) for arm in ("ddp", "ddp#2")}
    assert all(flag(l.argv, "--strategy") == "ddp" for l in runs)  # both arms train the same strategy
    assert [flag(l.argv, "--arm") for l in runs] == [None if l.label.startswith("ddp-") else "ddp#2" for l in runs]
    one = build_launches(spec(tmp_path), {"ddp": 2}, BATCH, LAUNCHER, cwd=REPO)
    assert [l.run_dir.name for l in one] == ["ddp", "ddp#2"] and flag(one[1].argv, "--run_name") == "ddp#2"
    # A label, as the report names the arms, is the same experiment when it is the arm its place makes it.
    assert spec(tmp_path, strategies=("ddp", "ddp#2")).arms == spec(tmp_path).arms


@pytest.mark.parametrize(
    "strategies, message",
    [
        (["ddp#2"], "error: ambiguous label 'ddp#2': mention 1 of ddp in --strategies is the arm 'ddp'"),
        (["ddp", "ddp#3"], "error: ambiguous label 'ddp#3': mention 2 of ddp in --strategies is the arm 'ddp#2'"),
        (["ddp", "dpp"], "error: unknown strategy 'dpp'; choose from single, ddp"),
        (["ddp", "nope#2"], "error: unknown strategy 'nope#2'"),
    ],
)
def test_an_ambiguous_label_or_unknown_strategy_is_one_error_line(tmp_path: Path, capsys, strategies, message) -> None:
    argv = ["--preset", "tiny", "--max_steps", "2", "--out", str(tmp_path), "--dry_run", "--strategies", *strategies]
    assert main(argv, launcher=LAUNCHER, config_dir=REPO / "accelerate_configs") == 2
    printed = capsys.readouterr()
    assert printed.err.startswith(message) and len(printed.err.strip().splitlines()) == 1 and printed.out == ""
    with pytest.raises(SetupError):
        spec(tmp_path, strategies=tuple(strategies))


def test_an_interrupted_a_a_experiment_continues_and_reports_two_arms(tmp_path: Path, capsys) -> None:
    configs = write_launch_configs(tmp_path)
    script = tmp_path / "fake_train.py"
    script.write_text(textwrap.dedent(FAKE_TRAIN.format(repo=str(REPO))))
    out = tmp_path / "exp"
    write_run(out / "runs" / "ddp", FakeRun("ddp", 2))  # the first arm finished before the interruption
    argv = ["--preset", "tiny", "--max_steps", "20", "--out", str(out), "--strategies", "ddp", "ddp"]
    assert main(argv, launcher=(sys.executable, str(script)), config_dir=configs, echo=False) == 0
    printed = capsys.readouterr().out.splitlines()
    assert "kept: ddp" in printed and "launched: ddp#2" in printed
    (launched,) = map(json.loads, (out / "runs" / "launched.jsonl").read_text().splitlines())
    assert flag(tuple(launched), "--arm") == "ddp#2" and flag(tuple(launched), "--strategy") == "ddp"
    report = json.loads((out / "report.json").read_text())
    assert {(c["a"], c["b"]) for c in report["comparisons"]} == {("ddp", "ddp#2")}
    assert set(report["figures"]["tokens_per_s"]["strategies"]) == {"ddp", "ddp#2"}
    assert "ddp#2" in (out / "table.csv").read_text()


def test_the_report_compares_arms_not_strategies(tmp_path: Path) -> None:
    for arm, folder in (("", "ddp"), ("ddp#2", "ddp#2")):
        for k in (1, 2):
            run = write_run(tmp_path / folder / f"r{k}", FakeRun("ddp", 2, tokens_per_s=40_000.0 + k))
            if arm:
                config = json.loads((run / "config.json").read_text())
                (run / "config.json").write_text(json.dumps({**config, "run": {**config["run"], "arm": arm}}))
    runs, _ = load_comparison(sorted(tmp_path.glob("*/r*")))
    assert [r.label for r in runs] == ["ddp (r1)", "ddp (r2)", "ddp#2 (r1)", "ddp#2 (r2)"]
    stats = build_statistics(runs)
    assert {name: s.units for name, s in stats.summaries["tokens_per_s"].items()} == {"ddp": 2, "ddp#2": 2}


# ---------------------------------------------------------------------------------------------
# One real A/A experiment, shared by the tests below (and by every pytest-xdist worker, under a lock)

AA_STEPS, AA_EVAL_INTERVAL = 4, 2


@pytest.fixture(scope="session")
def aa_experiment(shared_dir: Path, corpus: Path, shared_cache: Path) -> Path:
    """`--strategies ddp ddp --repeats 2` at the tiny preset, 4 steps with validations at steps 2 and 4, then its
    report again with a target halfway between those validations."""
    out, done = shared_dir / "aa", shared_dir / "aa.done"
    with FileLock(shared_dir / "aa.lock"):
        if not done.exists():
            script = shared_dir / "aa_launch.py"
            ports = {f"{arm}-r{k}": free_port() for k in (1, 2) for arm in ("ddp", "ddp#2")}
            script.write_text(textwrap.dedent(PORT_PER_RUN_LAUNCHER.format(ports=ports)))
            argv = [
                "--preset",
                "tiny",
                "--max_steps",
                str(AA_STEPS),
                "--strategies",
                "ddp",
                "ddp",
                "--repeats",
                "2",
                "--data",
                str(corpus),
                "--out",
                str(out),
                "--experiment",
                "aa",
                "--extra",
                "--eval_interval",
                str(AA_EVAL_INTERVAL),
                "--eval_blocks",
                "16",
                "--cache_dir",
                str(shared_cache),
                "--no-export_hf",
                "--wandb_mode",
                "disabled",
                "--overwrite",
            ]
            with pytest.MonkeyPatch.context() as patch:
                for name, value in launch_env().items():
                    patch.setenv(name, value)
                status = main(argv, launcher=(sys.executable, str(script)), config_dir=REPO / "accelerate_configs")
            assert status == 0, (out / "runs" / "ddp#2" / "r1.log").read_text()[-3000:]
            runs, _ = load_comparison(sorted((out / "runs").glob("*/r*")))
            losses = sorted(line.val_loss for line in runs[0].evals)
            target = (losses[0] + losses[-1]) / 2
            from analysis.compare import main as compare

            dirs = [str(run.path) for run in runs]
            assert compare([*dirs, "--out", str(out), "--target_loss", repr(target)]) == 0
            done.write_text(repr(target))
    return out


@pytest.mark.multiprocess
def test_a_a_experiment_establishes_nothing_and_repeats_exactly_what_is_exact(aa_experiment: Path) -> None:
    report = json.loads((aa_experiment / "report.json").read_text())
    losses = report["figures"]["final_val_loss"]
    assert set(losses["strategies"]) == {"ddp", "ddp#2"} and losses["unit_of_replication"] == "seed"
    assert all(
        losses["strategies"][arm]["runs"] == 2 and losses["strategies"][arm]["units"] == 1 for arm in ("ddp", "ddp#2")
    )
    by_figure = {c["figure"]: c for c in report["comparisons"]}
    for figure in ("final_val_loss", "avg_loss", "step_peak_bytes", "tokens_to_target"):
        pair = by_figure[figure]
        # Same seed, same program: every run gives the same value, compared as such: equal, so equivalent.
        assert (pair["ratio"], pair["method"], pair["status"]) == (1.0, "exact values", "equivalent"), pair
    # The resident set of a CPU process moves with what runs beside it: in two CI runs the A/A's middle pair and
    # its outer pair (the order is A B B A, so position and arm coincide at two repeats) differed by 8-11% while
    # each pair agreed within 1%, and a Welch test then calls that established. It is a fact of the machine, not
    # of the arms; every other figure must establish nothing.
    confounded = {"peak_rss_mib"}
    assert all(c["status"] != "established" for c in report["comparisons"] if c["figure"] not in confounded)
    order = json.loads((aa_experiment / "runs" / "order.json").read_text())["runs"]
    assert [sorted(r["arm"] for r in order[k : k + 2]) for k in (0, 2)] == [["ddp", "ddp#2"]] * 2


@pytest.mark.multiprocess
def test_the_calibration_splits_real_runs_for_every_figure(aa_experiment: Path, capsys) -> None:
    runs = sorted((aa_experiment / "runs").glob("*/r*"))
    assert aa_calibration.main(["--runs", *map(str, runs), "--splits", "20"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| real figure (4 runs, two arms)")
    rows = {line.split(" | ")[0].strip("| "): line for line in lines[2:]}
    assert set(rows) >= {"tokens_per_s", "step_peak_bytes", "final_val_loss", "avg_loss"}
    # Equal figures are equivalent in every split: no false verdict.
    assert "| 2 | 0.00% |" in rows["step_peak_bytes"] and "| 2 | 0.00% |" in rows["final_val_loss"]


def test_the_calibration_refuses_runs_of_several_strategies(tmp_path: Path, capsys) -> None:
    runs = [
        write_run(tmp_path / f"{strategy}{k}", FakeRun(strategy, 2))
        for k, strategy in enumerate(("ddp", "ddp", "fsdp", "fsdp"))
    ]
    assert aa_calibration.main(["--runs", *map(str, runs)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "runs of ddp, fsdp" in err and len(err.strip().splitlines()) == 1
