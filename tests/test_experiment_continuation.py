"""An interrupted experiment run again with the same arguments: finished runs are kept, the run cut short
resumes from its checkpoint (on the world size of the new launch), only what is missing is launched, and the
report covers every run. One real launch: the shared DDP run cut back to a checkpoint, resumed by the driver."""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from analysis.continuation import RunProgress, continue_experiment, run_progress
from analysis.experiment import (
    Batch,
    ExperimentSpec,
    Launch,
    Outcome,
    build_launches,
    default_launcher,
    main,
    write_run_order,
)
from tests.analysis_fixtures import FakeRun, write_launch_configs, write_run
from tests.launch import SHARED_STEPS, copy_cut_at_checkpoint, train_lines

REPO = Path(__file__).resolve().parents[1]

# A stand-in for `accelerate launch ... train.py`: it records its command line and writes a finished run.
FAKE_TRAIN = """
    import json, sys
    from pathlib import Path
    sys.path.insert(0, {repo!r})
    from tests.analysis_fixtures import FakeRun, write_run

    argv = sys.argv[1:]
    out, strategy = Path(argv[argv.index("--output_dir") + 1]), argv[argv.index("--strategy") + 1]
    with open(out.parents[1] / "launched.jsonl", "a") as f:
        f.write(json.dumps(argv) + "\\n")
    out.mkdir(parents=True, exist_ok=True)
    world = 1 if strategy == "single" else 2
    write_run(out, FakeRun(strategy, world, global_batch_tokens=int(argv[argv.index("--global_batch_tokens") + 1])))
"""


@pytest.fixture
def configs(tmp_path: Path) -> Path:
    return write_launch_configs(tmp_path)


@pytest.fixture
def fake_launcher(tmp_path: Path) -> tuple[str, ...]:
    script = tmp_path / "fake_train.py"
    script.write_text(textwrap.dedent(FAKE_TRAIN.format(repo=str(REPO))))
    return (sys.executable, str(script))


def _checkpointed(run_dir: Path, step: int) -> None:
    """A run stopped after a complete checkpoint of `step` (an empty file list: nothing to verify)."""
    folder = run_dir / "checkpoints" / f"step_{step:07d}"
    folder.mkdir(parents=True)
    (folder / "complete.json").write_text(json.dumps({"step": step, "files": {}}))
    (run_dir / "config.json").write_text(json.dumps({"run": {"experiment": "first-attempt"}}))


def _interrupted(out: Path) -> None:
    """single finished, ddp stopped after a checkpoint of step 4, fsdp never started."""
    write_run(out / "runs" / "single", FakeRun("single", 1))
    _checkpointed(out / "runs" / "ddp", 4)


def _launched(out: Path) -> dict[str, list[str]]:
    lines = (out / "launched.jsonl").read_text().splitlines() if (out / "launched.jsonl").exists() else []
    return {argv[argv.index("--strategy") + 1]: argv for argv in map(json.loads, lines)}


def test_how_far_a_run_got_is_read_from_its_folder(tmp_path: Path) -> None:
    assert run_progress(tmp_path / "none") is RunProgress.ABSENT
    write_run(tmp_path / "done", FakeRun("single", 1))
    assert run_progress(tmp_path / "done") is RunProgress.FINISHED
    write_run(tmp_path / "cut", FakeRun("single", 1, complete=False))
    assert run_progress(tmp_path / "cut") is RunProgress.STARTED  # no checkpoint: nothing to resume
    _checkpointed(tmp_path / "cut", 3)
    assert run_progress(tmp_path / "cut") is RunProgress.CHECKPOINTED


def test_a_second_run_keeps_what_finished_resumes_what_was_cut_and_launches_the_rest(
    tmp_path: Path, configs: Path, fake_launcher, capsys
) -> None:
    out = tmp_path / "exp"
    _interrupted(out)
    argv = ["--preset", "tiny", "--max_steps", "20", "--out", str(out)]
    assert main(argv, launcher=fake_launcher, config_dir=configs, echo=False) == 0
    printed = capsys.readouterr().out.splitlines()
    assert "kept: single" in printed and "resumed: ddp (from step 4)" in printed and "launched: fsdp" in printed
    launched = _launched(out)
    assert sorted(launched) == ["ddp", "fsdp"]
    assert launched["ddp"][-1] == "--resume" and "--resume" not in launched["fsdp"]
    # The group of the first attempt, not a new name after the time.
    assert launched["ddp"][launched["ddp"].index("--experiment") + 1] == "first-attempt"
    table = (out / "table.csv").read_text()
    assert all(strategy in table for strategy in ("single", "ddp", "fsdp"))
    # Once everything has finished, running again launches nothing and writes the report again.
    (out / "launched.jsonl").unlink()
    assert main(argv, launcher=fake_launcher, config_dir=configs, echo=False) == 0
    assert "kept: single, ddp, fsdp" in capsys.readouterr().out and _launched(out) == {}


def test_on_another_number_of_gpus_the_cut_run_resumes_on_the_new_world_size(
    tmp_path: Path, configs: Path, capsys
) -> None:
    out = tmp_path / "exp"
    _interrupted(out)
    argv = ["--preset", "tiny", "--max_steps", "20", "--out", str(out), "--num_processes", "4", "--dry_run"]
    assert main(argv, launcher=("accelerate", "launch"), config_dir=configs) == 0
    commands = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("accelerate launch")]
    assert [c[c.index("--strategy") + 1] for c in commands] == ["ddp", "fsdp"]  # single is kept: not launched
    ddp = commands[0]
    assert ddp[ddp.index("--num_processes") + 1] == "4" and ddp[-1] == "--resume"


def test_a_run_started_without_a_checkpoint_starts_again_and_folder_flags_given_are_obeyed(tmp_path: Path) -> None:
    def launch(name: str, *extra: str) -> Launch:
        run_dir = tmp_path / name
        return Launch(name, 1, ("launch", "--output_dir", str(run_dir), *extra), run_dir, tmp_path / f"{name}.log")

    write_run(tmp_path / "a", FakeRun("single", 1, complete=False))
    (left,) = continue_experiment([launch("a")]).launches
    assert left.argv[-1] == "--overwrite"
    write_run(tmp_path / "b", FakeRun("single", 1))  # finished, but the user asked for a fresh start
    (left,) = continue_experiment([launch("b", "--overwrite")]).launches
    assert left.argv.count("--overwrite") == 1 and "--resume" not in left.argv
    # --auto_resume: train.py decides for the unfinished ones; a finished one is still kept.
    (left,) = continue_experiment([launch("a", "--auto_resume"), launch("b", "--auto_resume")]).launches
    assert left.run_dir.name == "a" and left.argv[-1] == "--auto_resume"


def _driver_args(base_args: list[str], out: Path, strategies: tuple[str, ...], *flags: str) -> list[str]:
    """The experiment whose runs are the shared runs of `strategies` (tests/launch.py shared_args): the same
    preset, steps, seed and data; the rest of their flags through --extra."""
    given = {"--preset", "--data", "--max_steps", "--seed"}
    pairs = list(zip(base_args[::2], base_args[1::2]))
    head = [x for flag, value in pairs if flag in given for x in (flag, value)]
    extra = [x for flag, value in pairs if flag not in given for x in (flag, value)]
    return [*head, "--strategies", *strategies, "--out", str(out), *flags, "--extra", *extra]


@pytest.mark.multiprocess
def test_the_interrupted_run_resumes_exactly_on_the_machine_that_came_back_with_fewer_processes(
    tmp_path: Path, shared_runs, base_args: list[str], capsys
) -> None:
    out = tmp_path / "exp"
    shutil.copytree(shared_runs["single"], out / "runs" / "single")
    # As if the 2-process machine went away after step 9's checkpoint (the later checkpoint, metrics lines and
    # the summary are gone) and the experiment is run again where one process is all there is.
    cut = copy_cut_at_checkpoint(shared_runs["fsdp"], out / "runs" / "fsdp", 9)
    argv = _driver_args(base_args, out, ("single", "fsdp"), "--num_processes", "1")
    assert main(argv, launcher=default_launcher(), echo=False) == 0
    printed = capsys.readouterr().out.splitlines()
    assert "kept: single" in printed and "resumed: fsdp (from step 9)" in printed and "launched: none" in printed
    assert "[1/1] fsdp" in "\n".join(printed)  # one launch only
    launch = json.loads((cut / "config.json").read_text())["launch"]
    assert launch["effective"]["world_size"] == 1 and not launch["resumed_from"]["random_states_exact"]
    assert launch["resumed_from"]["num_processes"] == 2 and launch["resumed_from"]["strategy"] == "fsdp"
    got, want = train_lines(cut), train_lines(shared_runs["fsdp"])
    assert sorted(got) == sorted(want) == list(range(1, SHARED_STEPS + 1))
    for step in want:  # the strategies' agreement (tests/test_strategies.py); 2 -> 1 process measured exact
        assert got[step]["loss"] == pytest.approx(want[step]["loss"], rel=1e-5), step
        assert got[step]["grad_norm"] == pytest.approx(want[step]["grad_norm"], rel=1e-5), step
    assert json.loads((cut / "summary.json").read_text())["complete"]
    assert (out / "report.md").exists() and "fsdp" in (out / "table.csv").read_text()


def test_the_notebook_continues_its_unfinished_experiment_instead_of_naming_a_new_one(tmp_path: Path) -> None:
    from notebooks.support import experiment_name

    assert experiment_name("tiny", tmp_path).startswith("notebook-tiny-")  # nothing there: a new one
    unfinished = "notebook-tiny-20250101-000000"
    (tmp_path / unfinished / "runs").mkdir(parents=True)  # interrupted before its report
    (tmp_path / "notebook-gpt2-20260101-000000").mkdir()  # another preset's: not this one
    assert experiment_name("tiny", tmp_path) == unfinished
    (tmp_path / unfinished / "table.md").write_text("| run |")  # its report is written: the next one is new
    assert experiment_name("tiny", tmp_path) not in (unfinished, "notebook-gpt2-20260101-000000")


def test_a_continued_experiment_keeps_the_shuffled_order_it_recorded(tmp_path: Path) -> None:
    # Interrupted in its second round: run again with the same seed, the launches left are the rest of the
    # recorded order, not a new shuffle (the drift balance of each round holds across the interruption).
    spec = ExperimentSpec(preset="tiny", out=tmp_path / "exp", max_steps=4, seed=7, experiment="e", repeats=4)
    sizes, batch, launcher = {"single": 1, "ddp": 2, "fsdp": 2}, Batch(8, 64, 1024), ("accelerate", "launch")
    first = build_launches(spec, sizes, batch, launcher, cwd=REPO)
    for launch in first[:5]:
        write_run(launch.run_dir, FakeRun(launch.strategy, sizes[launch.strategy]))
    write_run_order(spec, [Outcome(launch, 0, 1.0) for launch in first[:5]])
    left = continue_experiment(build_launches(spec, sizes, batch, launcher, cwd=REPO)).launches
    recorded = json.loads((spec.out / "runs" / "order.json").read_text())
    assert [Path(r["run_dir"]) for r in recorded["runs"]] + [l.run_dir for l in left] == [l.run_dir for l in first]
    assert recorded["order_seed"] == 7 and recorded["order"].startswith("shuffled within each round")
