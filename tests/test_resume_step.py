"""--resume_step N: a run continues from an older verified checkpoint than its newest (rolling back past a loss
spike); the newer checkpoints are renamed step_M.rolled_back, never deleted, counted, kept or resumed from, and
a step that is not a verified checkpoint is refused in one line that lists those that are, touching nothing.

In-process with the real save (tests/test_checkpoint_keeping.py's tiny model), a stateful property test that adds
roll-backs to that file's random saves, damage, resumes and keep settings, and one launch that rolls the shared
single run back from step 12 to 9 and checks that it trains to the end with the uninterrupted run's losses.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from tests.launch import SHARED_STEPS, train, train_lines
from tests.test_checkpoint_keeping import CONFIG, CheckpointFolder, _digest, _prepared, damage, save, saved_step, steps
from training import trainer as session
from training.checkpoints import store as checkpoint
from training.checkpoints.resume import ROLLED_BACK_SUFFIX, checkpoint_at_step, roll_back_past, rolled_back_warning
from training.checkpoints.store import checkpoint_path, checkpoint_problem
from training.config import RunConfig, RunError
from training.run_folder import check_output_dir, claim_output_dir


@pytest.fixture()
def three(tmp_path: Path) -> Path:
    """A run folder with verified checkpoints at steps 2, 4 and 6."""
    for step in (2, 4, 6):
        save(_prepared(), tmp_path, step, keep=3)
    return tmp_path


def test_the_named_step_is_the_checkpoint_to_resume_from(three: Path) -> None:
    assert check_output_dir(three, resume=False, overwrite=False, resume_step=4) == checkpoint_path(three, 4)
    assert check_output_dir(three, resume=True, overwrite=False, resume_step=2) == checkpoint_path(three, 2)


@pytest.mark.parametrize("step", [5, 8])
def test_a_step_without_a_checkpoint_is_refused_in_one_line_listing_the_verified_ones(three: Path, step: int) -> None:
    before = _digest(three)
    with pytest.raises(RunError) as refused:
        check_output_dir(three, resume=False, overwrite=False, resume_step=step)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"--resume_step {step}: no complete checkpoint of step {step}")
    assert message.endswith("verified checkpoints to resume from: steps 2, 4, 6")
    assert _digest(three) == before


def test_a_damaged_checkpoint_is_refused_and_neither_it_nor_the_newer_one_is_renamed(three: Path) -> None:
    damage(checkpoint_path(three, 4))
    before = _digest(three)
    with pytest.raises(RunError, match=r"step_0000004 fails verification \(model/.*; .* steps 2, 6$"):
        checkpoint_at_step(three, 4)
    assert _digest(three) == before
    assert steps(three) == [2, 4, 6]


def test_rolling_back_renames_the_newer_checkpoints_aside_and_keep_1_never_deletes_them(three: Path) -> None:
    rolled = roll_back_past(checkpoint_at_step(three, 2))
    assert [p.name for p in rolled] == ["step_0000004.rolled_back", "step_0000006.rolled_back"]
    aside = {p.name: _digest(p) for p in rolled}
    assert steps(three) == [2]
    for step in (3, 4):  # step 4 is written again beside its rolled-back namesake
        save(_prepared(), three, step, keep=1)
    assert steps(three) == [4] and saved_step(checkpoint_path(three, 4)) == 4
    assert {p.name: _digest(p) for p in rolled} == aside
    # A second roll-back past the same step keeps both folders of it.
    save(_prepared(), three, 6, keep=2)
    again = roll_back_past(checkpoint_at_step(three, 4))
    assert [p.name for p in again] == ["step_0000006.rolled_back.1"] and saved_step(again[0]) == 6
    assert steps(three) == [4] and {p.name: _digest(p) for p in rolled} == aside


def test_the_warning_names_every_renamed_folder(three: Path) -> None:
    checkpoint = checkpoint_at_step(three, 2)
    line = rolled_back_warning(checkpoint, roll_back_past(checkpoint))
    assert line.startswith("warning: --resume_step 2: rolled back past 2 newer checkpoint(s), renamed ")
    assert "step_0000004.rolled_back, step_0000006.rolled_back" in line and "\n" not in line


@pytest.mark.parametrize(
    ("settings_", "message"),
    [
        ({"resume_step": 0}, "--resume_step must be > 0"),
        ({"resume_step": 3, "overwrite": True}, "--resume_step and --overwrite contradict"),
        ({"resume_step": 3, "auto_resume": True}, "--resume_step and --auto_resume contradict"),
    ],
)
def test_settings_that_contradict_resume_step_are_refused(settings_: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RunConfig(**settings_)


# --------------------------------------------------------------------------------------------- stateful


class CheckpointFolderWithRollBacks(CheckpointFolder):
    """tests/test_checkpoint_keeping.py's machine, with --resume_step among its rules: rolling back to a verified
    step makes it the newest checkpoint; to a damaged or missing one is refused and changes nothing; a folder
    rolled aside is never touched again, whatever the later saves keep."""

    def __init__(self) -> None:
        super().__init__()
        self.aside: dict[Path, dict[str, str]] = {}

    @precondition(lambda self: bool(steps(self.out)))
    @rule(data=st.data())
    def resume_step(self, data: st.DataObject) -> None:
        step = data.draw(st.sampled_from([*steps(self.out), self.position + 1]))
        if step not in self.intact():
            before = _digest(self.out)
            with pytest.raises(RunError, match=f"--resume_step {step}: "):
                checkpoint_at_step(self.out, step)
            assert _digest(self.out) == before
            return
        checkpoint = checkpoint_at_step(self.out, step)
        for renamed in roll_back_past(checkpoint):
            assert renamed.name.split(".")[1] == ROLLED_BACK_SUFFIX[1:]
            self.aside[renamed] = _digest(renamed)
            # A folder deleted rather than renamed would digest to {} now and later, and pass the check below.
            assert renamed.is_dir() and self.aside[renamed], f"{renamed.name} is gone or empty"
        assert steps(self.out)[-1] == step and checkpoint_problem(checkpoint) is None
        self.position = step
        self.newest_before = None  # the newest verified checkpoint moved back on purpose

    @rule()
    def rolled_aside_folders_are_never_touched(self) -> None:
        assert all(path.is_dir() and digest for path, digest in self.aside.items())
        assert {path: _digest(path) for path in self.aside} == self.aside


TestCheckpointFolderWithRollBacks = CheckpointFolderWithRollBacks.TestCase
TestCheckpointFolderWithRollBacks.settings = settings(max_examples=25, stateful_step_count=10, deadline=None)


# --------------------------------------------------------------------------------------------- launch


@pytest.mark.multiprocess
def test_resume_step_rolls_the_finished_run_back_and_trains_to_the_end_with_its_losses(
    tmp_path: Path, base_args: list[str], shared_runs
) -> None:
    """The shared single run (checkpoints at 9 and 12, finished) rolled back to step 9: step 12's checkpoint renamed
    aside in one warning line, metrics.jsonl cut back to 9, and steps 10-12 trained again with the uninterrupted
    run's losses and grad norms, each logged once."""
    reference = shared_runs["single"]
    run_dir = tmp_path / "run"
    shutil.copytree(reference, run_dir, ignore=shutil.ignore_patterns(".lock", "wandb", "hf"))
    args = [*base_args, "--strategy", "single", "--wandb_mode", "disabled", "--no-export_hf", "--resume_step", "9"]
    result = train("single_gpu.yaml", run_dir, args)
    output = result.stdout + result.stderr
    warnings = [line for line in output.splitlines() if line.startswith("warning: --resume_step")]
    assert len(warnings) == 1 and "renamed step_0000012.rolled_back" in warnings[0], output[-3000:]
    assert "resumed from" in output and "step_0000009 at step 9" in output
    aside = run_dir / "checkpoints" / f"step_{SHARED_STEPS:07d}{ROLLED_BACK_SUFFIX}"
    assert checkpoint_problem(aside) is None  # kept whole, through the run's own saves under --keep_checkpoints 2
    assert steps(run_dir) == [9, SHARED_STEPS]
    got, want = train_lines(run_dir), train_lines(reference)  # each step once: the cut was made
    assert sorted(got) == list(range(1, SHARED_STEPS + 1))
    for step in range(1, SHARED_STEPS + 1):
        assert (got[step]["loss"], got[step]["grad_norm"]) == (want[step]["loss"], want[step]["grad_norm"]), step
    resumed = json.loads((run_dir / "config.json").read_text())["launch"]["resumed_from"]
    assert resumed["step"] == 9 and resumed["rolled_back"] == [aside.name]


@pytest.mark.parametrize("restart", [0, 1])
def test_only_the_jobs_first_launch_rolls_back(three: Path, restart: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A torchrun restart reruns `--resume_step 2`: it continues the job's own newest checkpoint, and a partial
    or complete later folder it saved since the roll-back must not be renamed aside."""
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(restart))
    launch = SimpleNamespace(run=RunConfig(output_dir=str(three), resume_step=2))
    claim = session._claim_and_source(_prepared()[0], launch, three, CONFIG)
    assert (claim.resume_from, claim.roll_back) == (
        (checkpoint_path(three, 2), True) if restart == 0 else (checkpoint_path(three, 6), False)
    )


@pytest.mark.parametrize("kill_at", ["sync_folder", "rmtree"])
def test_an_overwrite_killed_while_deleting_leaves_no_checkpoint_its_restart_would_continue(
    three: Path, monkeypatch: pytest.MonkeyPatch, kill_at: str
) -> None:
    """--overwrite clears the old, finished run; a kill part-way (once its folders are renamed, before summary.json
    is deleted; or during the first folder's deletion), then the job's restart (which continues the newest
    checkpoint it finds, and refuses a finished run): it must start afresh, not continue the run the user asked
    to replace nor refuse it as finished."""
    from training import run_folder as rundir

    def killed(*_args: object, **_kwargs: object) -> None:
        raise KeyboardInterrupt

    (three / "metrics.jsonl").write_text("{}\n")
    (three / "summary.json").write_text("{}")
    with monkeypatch.context() as patched:
        patched.setattr(rundir.shutil if kill_at == "rmtree" else rundir, kill_at, killed)
        with pytest.raises(KeyboardInterrupt):
            claim_output_dir(three, RunConfig(output_dir=str(three), overwrite=True), restart=0)
    assert claim_output_dir(three, RunConfig(output_dir=str(three), overwrite=True), restart=1) is None
    assert sorted(os.listdir(three)) == []  # the leftovers swept by the claim


def test_a_folder_set_aside_is_synced_so_a_power_loss_cannot_bring_its_name_back(
    three: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[tuple[Path, list[str]]] = []
    monkeypatch.setattr(checkpoint, "sync_folder", lambda folder: synced.append((folder, sorted(os.listdir(folder)))))
    rolled = roll_back_past(checkpoint_at_step(three, 2))
    root = checkpoint_path(three, 2).parent
    # After each rename, the folder that holds it, as it is after the rename.
    assert synced[-1] == (root, sorted(["step_0000002", *(p.name for p in rolled)]))
    synced.clear()
    damage(checkpoint_path(three, 2))
    checkpoint.set_aside_damaged(checkpoint_path(three, 2), "a test")
    assert synced == [(root, sorted(["step_0000002.damaged", *(p.name for p in rolled)]))]
