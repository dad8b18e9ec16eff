"""Keeping checkpoints: ordered by their integer step, a damaged one set aside and never counted or chosen,
and the checkpoint just written and the newest verified one never deleted, whatever --keep_checkpoints says.

In-process with the real save (a tiny model saves in milliseconds), including a stateful property test of
random saves, damage, resumes and keep settings; one launch test of the issue's keep-1 case.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from model import GPT2, GPT2Config
from tests.launch import SHARED_STEPS, train, train_lines
from training.checkpoints.store import (
    checkpoint_path,
    checkpoint_problem,
    complete_checkpoints,
    load_model_state_dict,
    newest_good_checkpoint,
    save_checkpoint,
)
from training.config import RunConfig, RunError
from training.run_folder import claim_output_dir

CONFIG = GPT2Config.from_preset("tiny", vocab_size=256, n_positions=32)
MARKED = "transformer.wte.weight"  # its [0, 0] holds the step a checkpoint was saved at


def _prepared() -> tuple[Accelerator, torch.nn.Module, torch.optim.Optimizer]:
    """One process on CPU, a model and its optimizer prepared as training prepares them (one for the module),
    made again after a test elsewhere in the process reset accelerate's state (test_checkpoint.py's fp16 case
    does), which leaves an earlier Accelerator without a process index."""
    if not AcceleratorState._shared_state:
        _prepare_once.cache_clear()
    return _prepare_once()


@functools.cache
def _prepare_once() -> tuple[Accelerator, torch.nn.Module, torch.optim.Optimizer]:
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = GPT2(CONFIG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


@pytest.fixture()
def prepared() -> tuple[Accelerator, torch.nn.Module, torch.optim.Optimizer]:
    return _prepared()


def save(prepared, out: Path, step: int, keep: int) -> Path:
    """A checkpoint whose weights say which step wrote it."""
    accelerator, model, optimizer = prepared
    with torch.no_grad():
        model.transformer.wte.weight[0, 0] = step
    return save_checkpoint(accelerator, model, optimizer, out, step, CONFIG.to_dict(), keep=keep)


def damage(checkpoint: Path) -> None:
    """One changed byte in the weights, same size: what a bad disk leaves (twice is still damaged)."""
    shard = sorted((checkpoint / "model").glob("*.distcp"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] = (data[len(data) // 2] + 1) % 256
    shard.write_bytes(bytes(data))


def saved_step(checkpoint: Path) -> int:
    return int(load_model_state_dict(checkpoint)[MARKED][0, 0].item())


def steps(out: Path) -> list[int]:
    return [int(p.name.removeprefix("step_")) for p in complete_checkpoints(out)]


def test_checkpoints_are_ordered_by_their_step_as_a_number(prepared, tmp_path: Path) -> None:
    # Past 10^7 steps the zero-padded names grow a digit: as strings, step_10000000 sorts before step_9999999.
    for step in (9_999_999, 10_000_000):
        save(prepared, tmp_path, step, keep=1)
    assert steps(tmp_path) == [10_000_000]
    assert newest_good_checkpoint(tmp_path) == checkpoint_path(tmp_path, 10_000_000)


def test_a_damaged_newest_checkpoint_is_set_aside_and_the_next_save_under_keep_1_leaves_a_verified_one(
    prepared, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's case: step 6 damaged, --resume falls back to 4, the next save (5) under keep 1."""
    for step in (4, 6):
        save(prepared, tmp_path, step, keep=2)
    damage(checkpoint_path(tmp_path, 6))
    assert newest_good_checkpoint(tmp_path) == checkpoint_path(tmp_path, 4)
    (warning,) = capsys.readouterr().err.strip().splitlines()
    assert (
        warning.startswith("warning: checkpoint step_0000006 is damaged (model/") and "step_0000006.damaged" in warning
    )
    assert (tmp_path / "checkpoints" / "step_0000006.damaged").is_dir()  # kept for a person to look at
    save(prepared, tmp_path, 5, keep=1)
    assert steps(tmp_path) == [5]
    resumed = newest_good_checkpoint(tmp_path)
    assert checkpoint_problem(resumed) is None and saved_step(resumed) == 5


def test_the_newest_verified_checkpoint_outlives_keep_1_when_the_one_written_is_older(prepared, tmp_path) -> None:
    """A run resumed from an older step writes below a newer verified checkpoint: both stay."""
    for step in (3, 9):
        save(prepared, tmp_path, step, keep=2)
    save(prepared, tmp_path, 6, keep=1)
    assert steps(tmp_path) == [6, 9]


def test_a_write_error_inside_dcp_leaves_the_checkpoint_before_as_the_newest(
    prepared, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GPT2S_FAULT's save_error fires inside DCP's storage writer, as a full disk would: no shard of the failed
    save is written, the error is this process's own OSError, and the checkpoint before is the one to resume."""
    from training.distributed import faults

    save(prepared, tmp_path, 3, keep=2)
    monkeypatch.setenv("GPT2S_FAULT", "save_error:step=6")
    faults._this_process_fault.cache_clear()
    try:
        with pytest.raises(OSError, match="No space left on device"):
            save(prepared, tmp_path, 6, keep=2)
    finally:
        monkeypatch.delenv("GPT2S_FAULT")
        faults._this_process_fault.cache_clear()
    failed = checkpoint_path(tmp_path, 6)
    assert not list(failed.glob("**/*.distcp")) and not (failed / "complete.json").exists()
    assert steps(tmp_path) == [3] and newest_good_checkpoint(tmp_path) == checkpoint_path(tmp_path, 3)


# --------------------------------------------------------------------------------------------- stateful


class CheckpointFolder(RuleBasedStateMachine):
    """Random saves, damage, resumes and keep settings on one run folder. After every step the newest verified
    checkpoint is resumable (it verifies, a resume chooses it, it holds its step's weights); a save deletes
    neither the checkpoint it wrote, nor the newest verified one unless it wrote a newer one, nor any of the
    newest `keep`."""

    def __init__(self) -> None:
        super().__init__()
        self.out = Path(tempfile.mkdtemp(prefix="keeping-"))
        self.keep = 2
        self.position = 0  # the step the run has reached (a resume moves it back)
        self.damaged: set[int] = set()  # steps whose checkpoint was damaged after it was written
        self.newest_before: int | None = None
        self.damaged_since_last_check = False

    def intact(self) -> list[int]:
        return [s for s in steps(self.out) if s not in self.damaged]

    def newest_intact(self) -> int | None:
        found = self.intact()
        return found[-1] if found else None

    @initialize(first=st.integers(1, 3), second=st.integers(1, 3))
    def two_saves(self, first: int, second: int) -> None:
        """Where the cases worth trying start: something to damage and an older one to fall back on."""
        self.save(first)
        self.save(second)

    @rule(advance=st.integers(1, 3))
    def save(self, advance: int) -> None:
        listed = steps(self.out)
        self.position += advance
        self.damaged.discard(self.position)  # a leftover folder of this step is replaced
        save(_prepared(), self.out, self.position, self.keep)
        now = steps(self.out)
        assert self.position in now, "the checkpoint just written was deleted"
        newest = sorted({*listed, self.position})[-self.keep :]
        assert set(newest) <= set(now), f"keep {self.keep}: {newest} should all be there, found {now}"

    @precondition(lambda self: bool(steps(self.out)))
    @rule(data=st.data())
    def damage_one(self, data: st.DataObject) -> None:
        step = data.draw(st.sampled_from(steps(self.out)[::-1]))  # newest first: the case that matters most
        self.damage_step(step)

    def damage_step(self, step: int) -> None:
        damage(checkpoint_path(self.out, step))
        self.damaged.add(step)
        self.damaged_since_last_check = True

    @rule(keep=st.integers(1, 3))
    def set_keep(self, keep: int) -> None:
        self.keep = keep

    @rule()
    def resume(self) -> None:
        expected = self.newest_intact()
        if expected is None:
            with pytest.raises(RunError):
                newest_good_checkpoint(self.out)
            return
        resumed = newest_good_checkpoint(self.out)
        assert resumed == checkpoint_path(self.out, expected)
        assert all(s <= expected for s in steps(self.out)), "a damaged newer checkpoint is still counted"
        self.position = expected

    @invariant()
    def the_newest_verified_checkpoint_is_resumable_and_only_ever_moves_forward(self) -> None:
        newest = self.newest_intact()
        if newest is not None:
            path = checkpoint_path(self.out, newest)
            assert checkpoint_problem(path) is None and saved_step(path) == newest
        if not self.damaged_since_last_check and self.newest_before is not None:
            assert newest is not None and newest >= self.newest_before, (
                f"the newest verified checkpoint went from step {self.newest_before} to {newest}"
            )
        self.newest_before, self.damaged_since_last_check = newest, False

    def teardown(self) -> None:
        shutil.rmtree(self.out, ignore_errors=True)


TestCheckpointFolder = CheckpointFolder.TestCase
TestCheckpointFolder.settings = settings(max_examples=60, stateful_step_count=10, deadline=None)


class CheckpointFolderWithRelaunches(CheckpointFolder):
    """The machine above, with the launches that claim the folder by themselves (--auto_resume, torchrun restarts,
    also of an --overwrite job) and a disk that damages every checkpoint at once. A relaunch continues the newest
    verified checkpoint; with none it starts afresh only over a folder that holds no checkpoint set aside, and
    otherwise stops in one line naming them. A folder set aside as damaged is never deleted or changed."""

    def __init__(self) -> None:
        super().__init__()
        self.aside: dict[Path, dict[str, str]] = {}

    @precondition(lambda self: bool(steps(self.out)))
    @rule()
    def damage_every_one(self) -> None:
        for step in steps(self.out):
            self.damage_step(step)

    @rule(restart=st.integers(0, 2), overwrite=st.booleans())
    def relaunch(self, restart: int, overwrite: bool) -> None:
        # --auto_resume with --overwrite is refused by the parser; a restart of an --overwrite job is not.
        run = RunConfig(output_dir=str(self.out), auto_resume=restart == 0, overwrite=overwrite and restart > 0)
        expected = self.newest_intact()
        try:
            resumed = claim_output_dir(self.out, run, restart)
        except RunError as refused:
            message = str(refused)
            assert expected is None and "\n" not in message, message
            assert all(p.name in message for p in _set_aside(self.out)), message
            return
        if expected is not None:
            assert resumed == checkpoint_path(self.out, expected)
            self.position = expected
            return
        assert resumed is None and not (self.out / "checkpoints").exists(), "a fresh start left checkpoints"
        self.position, self.damaged = 0, set()

    @invariant()
    def folders_set_aside_are_never_touched(self) -> None:
        assert {path: _digest(path) for path in self.aside} == self.aside, "a damaged folder set aside was changed"
        self.aside.update({path: _digest(path) for path in _set_aside(self.out) if path not in self.aside})


def _set_aside(out: Path) -> list[Path]:
    root = out / "checkpoints"
    return sorted(p for p in root.glob("step_*.damaged*")) if root.is_dir() else []


def _digest(folder: Path) -> dict[str, str]:
    """Each file of a folder by its path in it, with its SHA-256; {} for a folder that is gone."""
    import hashlib

    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


TestCheckpointFolderWithRelaunches = CheckpointFolderWithRelaunches.TestCase
TestCheckpointFolderWithRelaunches.settings = settings(max_examples=25, stateful_step_count=10, deadline=None)


# --------------------------------------------------------------------------------------------- launches


@pytest.mark.multiprocess
def test_after_a_damaged_newest_checkpoint_keep_1_still_leaves_a_run_that_resumes_to_the_end(
    tmp_path: Path, base_args: list[str], shared_runs
) -> None:
    """The shared single run (checkpoints at 9 and 12) with step 12 damaged: --resume falls back to 9 and
    stops at 10 under --keep_checkpoints 1; the next --resume continues to the end with the uninterrupted
    run's losses."""
    reference = shared_runs["single"]
    run_dir = tmp_path / "run"
    shutil.copytree(reference, run_dir, ignore=shutil.ignore_patterns(".lock"))
    damage(checkpoint_path(run_dir, SHARED_STEPS))
    args = [*base_args, "--strategy", "single", "--wandb_mode", "disabled", "--no-export_hf"]
    first = train(
        "single_gpu.yaml", run_dir, [*args, "--resume", "--keep_checkpoints", "1", "--stop_after_steps", "10"]
    )
    assert "step_0000009 at step 9" in first.stdout
    assert [line for line in first.stderr.splitlines() if "damaged" in line] == [
        line for line in first.stderr.splitlines() if line.startswith("warning: checkpoint step_0000012 is damaged")
    ]
    assert steps(run_dir) == [10]
    second = train("single_gpu.yaml", run_dir, [*args, "--resume"])
    assert "step_0000010 at step 10" in second.stdout
    got, want = train_lines(run_dir), train_lines(reference)
    assert sorted(got) == list(range(1, SHARED_STEPS + 1))
    for step in range(11, SHARED_STEPS + 1):
        assert (got[step]["loss"], got[step]["grad_norm"]) == (want[step]["loss"], want[step]["grad_norm"]), step


def test_a_step_set_aside_again_gets_the_next_free_number_and_keeps_every_earlier_one(tmp_path: Path) -> None:
    """A resumed run can damage the same step again: each folder set aside stays, under .damaged, .damaged.1, ..."""
    from training.checkpoints.store import set_aside

    names = []
    for attempt in range(3):
        folder = checkpoint_path(tmp_path, 3)
        folder.mkdir(parents=True)
        (folder / "attempt").write_text(str(attempt))
        names.append(set_aside(folder, ".damaged").name)
    assert names == ["step_0000003.damaged", "step_0000003.damaged.1", "step_0000003.damaged.2"]
    held = [(folder.parent / name / "attempt").read_text() for name in names]
    assert held == ["0", "1", "2"] and not checkpoint_path(tmp_path, 3).exists()


def _listed(folder: Path, files: dict[str, bytes], marker: object = None) -> Path:
    """A checkpoint folder written by hand: the files, and complete.json listing each with its size and CRC-32
    (or `marker` instead of that listing)."""
    import json
    import zlib

    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    listing = {"step": 1, "files": {name: [len(data), zlib.crc32(data)] for name, data in files.items()}}
    (folder / "complete.json").write_text(json.dumps(listing if marker is None else marker))
    return folder


def test_each_kind_of_damage_is_named_and_an_intact_folder_has_none(tmp_path: Path) -> None:
    """A file over the 4 MiB read chunk checks the running CRC; then each way a listed file can be wrong."""
    big = bytes(range(256)) * (5 * 2**20 // 256)  # 5 MiB: two chunks
    files = {"big.bin": big, "small.json": b"{}"}
    assert checkpoint_problem(_listed(tmp_path / "intact", files)) is None
    missing = _listed(tmp_path / "missing", files)
    (missing / "small.json").unlink()
    assert checkpoint_problem(missing) == "small.json is missing"
    cut = _listed(tmp_path / "cut", files)
    (cut / "big.bin").write_bytes(big[:-100])
    assert checkpoint_problem(cut) == f"big.bin has {len(big) - 100} bytes, {len(big)} were written"
    flipped = _listed(tmp_path / "flipped", files)
    (flipped / "big.bin").write_bytes(big[: len(big) - 1] + b"\x00")  # the last byte, in the second chunk
    assert checkpoint_problem(flipped) == "big.bin is corrupted (checksum differs from the one written)"


def test_a_marker_that_cannot_be_read_or_lists_no_files_is_named(tmp_path: Path) -> None:
    unreadable = _listed(tmp_path / "unreadable", {})
    (unreadable / "complete.json").write_text("{not json")
    assert checkpoint_problem(unreadable) == "complete.json is unreadable"
    for name, marker in (("old", {"step": 1}), ("list", [1]), ("files list", {"step": 1, "files": []})):
        problem = checkpoint_problem(_listed(tmp_path / name, {}, marker))
        assert problem.startswith("written by an earlier version of this project (no file list to verify)"), name


def test_a_stray_file_named_like_a_checkpoint_is_not_one(tmp_path: Path) -> None:
    from training.checkpoints.store import checkpoint_folders

    real = checkpoint_path(tmp_path, 2)
    real.mkdir(parents=True)
    (real.parent / "step_0000003").write_text("not a folder")
    assert checkpoint_folders(tmp_path) == [real] and checkpoint_folders(tmp_path / "none") == []


@settings(max_examples=200, deadline=None)
@given(
    count=st.integers(0, 8),
    keep=st.integers(1, 10),
    written=st.integers(0, 7),
    verified=st.one_of(st.none(), st.integers(0, 7)),
)
def test_keep_deletes_the_oldest_beyond_keep_but_never_the_written_or_the_verified(
    count: int, keep: int, written: int, verified: int | None
) -> None:
    """The decision alone, against its statement: of `count` complete checkpoints, those older than the newest
    `keep`, less the one just written and the newest verified; each deleted once, oldest first."""
    from training.checkpoints.store import keep_decision

    complete = [Path(f"step_{n:07d}") for n in range(count)]
    just_written = Path(f"step_{written:07d}")
    newest_verified = None if verified is None else Path(f"step_{verified:07d}")
    deleted = keep_decision(complete, just_written, newest_verified, keep)
    kept = [p for p in complete if p not in deleted]
    assert deleted == [p for p in complete if p in deleted]  # oldest first, each once
    assert just_written not in deleted and newest_verified not in deleted
    assert complete[max(count - keep, 0) :] == [p for p in kept if p in complete[max(count - keep, 0) :]]
    assert len(deleted) == len(
        [p for p in complete[: max(count - keep, 0)] if p not in (just_written, newest_verified)]
    )


def test_only_the_main_process_warns_of_a_damaged_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every rank sets aside what it verified; the warning line comes once, from rank 0."""
    from training.checkpoints.store import set_aside_damaged

    for rank, step in (("1", 1), ("0", 2)):
        monkeypatch.setenv("RANK", rank)
        folder = checkpoint_path(tmp_path, step)
        folder.mkdir(parents=True)
        set_aside_damaged(folder, "model/x is missing")
        said = capsys.readouterr().err
        expected = f"warning: checkpoint {folder.name} is damaged (model/x is missing); set aside as {folder.name}"
        assert said == ("" if rank == "1" else f"{expected}.damaged, never resumed from\n"), rank


def test_a_deletion_cut_short_leaves_no_checkpoint_that_counts_over_half_its_files(
    prepared, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """keep 1 deletes step 2 after step 4 is complete; the process dies when half of step 2's shards are gone.
    Its complete.json must not stand under a checkpoint's name, and the next prune clears what is left."""
    from training.checkpoints import store as checkpoint

    save(prepared, tmp_path, 2, keep=2)

    def cut_short(path, ignore_errors: bool = False) -> None:
        for shard in sorted(Path(path).rglob("*.distcp"))[:1]:
            shard.unlink()
        raise KeyboardInterrupt  # killed mid-deletion

    monkeypatch.setattr(checkpoint.shutil, "rmtree", cut_short)
    with pytest.raises(KeyboardInterrupt):
        save(prepared, tmp_path, 4, keep=1)
    monkeypatch.undo()
    assert steps(tmp_path) == [4]
    assert all(checkpoint_problem(p) is None for p in complete_checkpoints(tmp_path))
    save(prepared, tmp_path, 6, keep=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_0000004", "step_0000006"]


def test_a_launch_that_continues_sweeps_what_a_deletion_cut_short_left(prepared, tmp_path: Path) -> None:
    """A deletion cut short (step_N.deleting) is removed when the next launch claims the folder, not at its first
    save; a folder set aside as damaged stays."""
    for step in (2, 4, 6):
        save(prepared, tmp_path, step, keep=3)
    root = tmp_path / "checkpoints"
    checkpoint_path(tmp_path, 2).rename(root / "step_0000002.deleting")
    damage(checkpoint_path(tmp_path, 6))
    resumed = claim_output_dir(tmp_path, RunConfig(output_dir=str(tmp_path), resume=True), restart=0)
    assert resumed == checkpoint_path(tmp_path, 4)
    assert sorted(p.name for p in root.iterdir()) == ["step_0000004", "step_0000006.damaged"]
