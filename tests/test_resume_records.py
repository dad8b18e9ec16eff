"""What a resume keeps of a run's records: metrics.jsonl with a torn last line (dropped with one warning) or a
broken line before it (refused in one line, nothing written), and every trained step's record across a
checkpoint taken between two log lines, at any --log_interval and --checkpoint_interval.

In-process: the loop's own logging, checkpointing and resume (training/loop.py, training/trainer.py) on the tiny
model of tests/test_checkpoint_keeping.py, driven with made-up losses and step times, at the presets' log
intervals; one launch test resumes a real run at --checkpoint_interval 3 --log_interval 4 and compares its
summary.json with the shared uninterrupted run's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import subprocess
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.launch import CONFIGS, REPO, accelerate_command, launch_env, run
from tests.test_checkpoint_keeping import CONFIG, _prepared
from tests.test_resume_refusal import SAVED
from training import loop
from training import trainer as session
from training.checkpoints import resume
from training.checkpoints.resume import origin_record, pending_rollback
from training.checkpoints.store import TrainState, checkpoint_path, save_checkpoint
from training.config import PRESETS, ModelChoice, OptimConfig, RunConfig, RunError, TrainConfig
from training.records.metrics import MetricsTracker, RunTimes, StepRecord, ThroughputFacts, eval_line
from training.records.record import ResumedFromRecord
from training.records.sinks import JsonlSink, WandbSink
from training.run_folder import claim_output_dir, truncate_metrics
from training.step import StepHealth

# --------------------------------------------------------------------------------------------- metrics.jsonl


def _lines(steps: range) -> str:
    return "".join(json.dumps({"kind": "train", "step": s, "loss": 10.0 - s}) + "\n" for s in steps)


def test_a_torn_last_line_is_dropped_when_a_resume_cuts_the_metrics_back(tmp_path: Path) -> None:
    """A kill or a full disk in the middle of an append leaves a last line cut short: the resume drops it."""
    path = tmp_path / "metrics.jsonl"
    path.write_text(_lines(range(1, 6)) + '{"kind": "train", "step": 6, "lo')
    truncate_metrics(path, 4)
    assert path.read_text() == _lines(range(1, 5))


def test_a_broken_line_before_the_last_is_refused_in_one_line_naming_the_file(tmp_path: Path) -> None:
    """Not a cut write (something else changed the file): refused, the file as it was."""
    path = tmp_path / "metrics.jsonl"
    before = _lines(range(1, 3)) + '{"kind": "train", "st\n' + _lines(range(4, 6))
    path.write_text(before)
    with pytest.raises(RunError) as refused:
        truncate_metrics(path, 4)
    message = str(refused.value)
    assert "\n" not in message and str(path) in message and "line 3" in message, message
    assert path.read_text() == before


def _resumable(out: Path, later: int | None = None) -> Path:
    """A verified checkpoint of step 3 whose origin the identity SAVED continues (and one of step `later`)."""
    accelerator, model, optimizer = _prepared()
    origin = origin_record("fsdp", 2, SAVED)
    for step in (3, *([later] if later else [])):
        save_checkpoint(accelerator, model, optimizer, out, step, CONFIG.to_dict(), 3, {"state": {}}, origin)
    return checkpoint_path(out, 3)


def test_a_torn_last_line_is_told_when_it_is_dropped_not_when_the_resume_is_decided(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The decision reads metrics.jsonl and writes nothing; the line is dropped, and said so, once loaded (a resume
    that then fails to load must not have said it dropped a line it kept)."""
    checkpoint = _resumable(tmp_path)
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(_lines(range(1, 5)) + '{"kind": "tr')
    capsys.readouterr()
    origin = ResumedFromRecord.from_dict(session._resume_origin(checkpoint, SAVED))
    assert capsys.readouterr().out == ""
    assert metrics.read_text() == _lines(range(1, 5)) + '{"kind": "tr'  # cut once the checkpoint has loaded
    session._rewrite_after_load(tmp_path, checkpoint, origin)
    (warning,) = capsys.readouterr().out.splitlines()
    assert warning.startswith(f"warning: {metrics}: line 5 ") and "dropped" in warning, warning
    assert metrics.read_text() == _lines(range(1, 4))


def test_the_resume_decision_refuses_a_broken_line_before_anything_is_renamed(tmp_path: Path) -> None:
    """--resume_step 3 past a checkpoint of step 6, over a metrics.jsonl broken in its middle: one line, and step 6
    is not rolled aside."""
    checkpoint = _resumable(tmp_path, later=6)
    (tmp_path / "metrics.jsonl").write_text('{"kind": "train", "step": 1\n' + _lines(range(2, 5)))
    with pytest.raises(RunError, match=r"metrics\.jsonl: line 1 "):
        session._resume_origin(checkpoint, SAVED, roll_back=True)
    assert checkpoint_path(tmp_path, 6).is_dir()


def test_a_roll_back_renames_nothing_until_the_checkpoint_has_loaded(tmp_path: Path) -> None:
    """The decision names the folders a --resume_step will set aside; renaming them is left to after the load."""
    checkpoint = _resumable(tmp_path, later=6)
    record = session._resume_origin(checkpoint, SAVED, roll_back=True)
    assert record["rolled_back"] == ["step_0000006.rolled_back"]
    assert checkpoint_path(tmp_path, 6).is_dir()


@pytest.mark.parametrize(
    "index",
    [b"", b"not a pickle", b"cno_such_module_anywhere\nThing\n.", b"cos\nno_such_function\n.", b"\x80\x09"],
    ids=["empty", "not-a-pickle", "missing-module", "missing-name", "newer-protocol"],
)
def test_a_dcp_index_that_cannot_be_unpickled_is_refused_in_one_line(tmp_path: Path, index: bytes) -> None:
    """The main process decides alone while the others wait for its outcome: whatever unpickling a changed .metadata
    raises must become its one line, not a traceback of the main process alone."""
    checkpoint = _resumable(tmp_path)
    (checkpoint / "model" / ".metadata").write_bytes(index)
    with pytest.raises(RunError) as refused:
        session._resume_origin(checkpoint, SAVED)
    message = str(refused.value)
    assert "\n" not in message and "model/.metadata cannot be read" in message, message


@pytest.mark.parametrize("unlogged", [-1, 3])
def test_a_train_state_whose_unlogged_steps_are_not_among_its_records_is_refused(unlogged: int) -> None:
    """Two records, `unlogged` of them not yet in metrics.jsonl: only 0, 1 or 2 can be."""
    tracker = MetricsTracker(_prepared()[0], ThroughputFacts(TOKENS_PER_STEP, 1, 1, 1.0, 1.0), perf_warmup_steps=1)
    records = [StepRecord(s, 0, 64 * s, 1.0, 1.0, 1e-3, 0.1, False) for s in (1, 2)]
    tracker.restore(records, 2)
    with pytest.raises(ValueError, match=f"says {unlogged} of its 2 step records unlogged"):
        tracker.restore(records, unlogged)


@pytest.mark.parametrize("dies", ["before-the-decision", "after-the-decision"])
def test_a_restart_after_a_launch_that_failed_before_its_load_finishes_the_roll_back(tmp_path: Path, dies: str) -> None:
    """--resume_step 3 past a checkpoint of step 6: the first attempt claims the folder, then fails before the load
    (building the data, before or after deciding the resume; prepare, out of memory, preempted). Its restart, which
    ignores --resume_step, continues step 3, not step 6, and sets step 6 aside once loaded; the restart after that
    continues the newest again."""
    run = RunConfig(output_dir=str(tmp_path), resume_step=3)
    checkpoint = _resumable(tmp_path, later=6)
    assert claim_output_dir(tmp_path, run, restart=0) == checkpoint
    if dies == "after-the-decision":
        session._resume_origin(checkpoint, SAVED, roll_back=True)
    assert checkpoint_path(tmp_path, 6).is_dir()  # nothing renamed before the load
    assert claim_output_dir(tmp_path, run, restart=1) == checkpoint
    record = session._resume_origin(checkpoint, SAVED, roll_back=False)  # the restart's own decision
    assert record["rolled_back"] == ["step_0000006.rolled_back"]
    session._rewrite_after_load(tmp_path, checkpoint, ResumedFromRecord.from_dict(record))
    assert (checkpoint.parent / "step_0000006.rolled_back").is_dir() and not checkpoint_path(tmp_path, 6).exists()
    save_checkpoint(*_prepared(), tmp_path, 9, CONFIG.to_dict(), 3, {"state": {}}, origin_record("fsdp", 2, SAVED))
    assert claim_output_dir(tmp_path, run, restart=2) == checkpoint_path(tmp_path, 9)


def test_a_refused_resume_step_leaves_no_roll_back_for_a_later_launch(tmp_path: Path) -> None:
    """The claim notes the roll-back; a decision that refuses the checkpoint drops the note with it, so that a later
    --resume continues the newest checkpoint as if the refused launch had never run."""
    run = RunConfig(output_dir=str(tmp_path), resume_step=3)
    checkpoint = _resumable(tmp_path, later=6)
    claim_output_dir(tmp_path, run, restart=0)
    assert pending_rollback(tmp_path) == 3
    with pytest.raises(RunError, match="seed"):
        session._resume_origin(checkpoint, dataclasses.replace(SAVED, seed=SAVED.seed + 1), roll_back=True)
    assert pending_rollback(tmp_path) is None
    assert claim_output_dir(tmp_path, RunConfig(output_dir=str(tmp_path), resume=True), 0) == checkpoint_path(
        tmp_path, 6
    )


@pytest.mark.parametrize("also_resume", [False, True], ids=["resume_step", "resume-and-resume_step"])
def test_an_unreadable_roll_back_note_is_replaced_by_the_resume_step_its_error_asks_for(
    tmp_path: Path, also_resume: bool
) -> None:
    """A rollback.json cut short stops a plain --resume in one line that asks for --resume_step N; that launch
    (with --resume too or not) then claims, decides and notes its own roll-back instead of refusing the note
    again."""
    checkpoint = _resumable(tmp_path, later=6)
    (checkpoint.parent / "rollback.json").write_text('{"step": ')
    with pytest.raises(RunError, match=r"rollback\.json cannot be read .*resume again with --resume_step N"):
        claim_output_dir(tmp_path, RunConfig(output_dir=str(tmp_path), resume=True), restart=0)
    again = RunConfig(output_dir=str(tmp_path), resume=also_resume, resume_step=3)
    assert claim_output_dir(tmp_path, again, restart=0) == checkpoint
    assert session._resume_origin(checkpoint, SAVED, roll_back=True)["rolled_back"] == ["step_0000006.rolled_back"]
    assert pending_rollback(tmp_path) == 3


def test_a_roll_back_note_that_cannot_be_written_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk while the claim notes the roll-back: one line (every process stops with it), nothing renamed."""
    checkpoint = _resumable(tmp_path, later=6)

    def full(*_args: object, **_kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(resume, "write_atomic", full)
    with pytest.raises(RunError, match=r"rollback\.json cannot be written \(OSError: .*No space left") as refused:
        claim_output_dir(tmp_path, RunConfig(output_dir=str(tmp_path), resume_step=3), restart=0)
    assert "\n" not in str(refused.value)
    assert checkpoint_path(tmp_path, 6).is_dir() and checkpoint.is_dir()


# --------------------------------------------------------------------------------------------- every step's record

# --log_interval as each preset sets it, the default (the gpt2 presets leave it to the default), and 4 (the issue's).
LOG_INTERVALS = sorted({RunConfig().log_interval, 4, *(p.values.get("log_interval", 10) for p in PRESETS.values())})
STEPS, STEPS_PER_EPOCH, CHECKPOINT_INTERVAL, TOKENS_PER_STEP = 12, 5, 3, 64


def _session(out: Path, log_interval: int) -> session.Trainer:
    """A trainer over the tiny model, with what logging, checkpointing and resuming read and no data, its parts
    given rather than built (Trainer.__init__ builds a whole run)."""
    accelerator, model, optimizer = _prepared()
    run = RunConfig(
        output_dir=str(out),
        log_interval=log_interval,
        checkpoint_interval=CHECKPOINT_INTERVAL,
        checkpoint_async=False,
        keep_checkpoints=STEPS,
    )
    cfg = TrainConfig(preset="tiny", model=ModelChoice(), data=None, optim=OptimConfig(), run=run)
    out.mkdir(exist_ok=True)
    trainer = object.__new__(session.Trainer)
    trainer._start_loop_state()
    vars(trainer).update(
        cfg=cfg,
        out=out,
        accelerator=accelerator,
        model=model,
        model_config=CONFIG,
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0),
        sampler=None,
        train_loader=None,
        val_loader=None,
        geometry=SimpleNamespace(tokens_per_step=TOKENS_PER_STEP),
        schedule=session.Schedule(STEPS_PER_EPOCH, STEPS, STEPS, 3),
        state=TrainState(),
        tracker=MetricsTracker(accelerator, ThroughputFacts(TOKENS_PER_STEP, 1, 1, 1.0, 1.0), perf_warmup_steps=1),
        times=RunTimes(),
        launch=SimpleNamespace(effective=SimpleNamespace(strategy="single")),
        jsonl=JsonlSink(out / "metrics.jsonl"),
        wandb=WandbSink(accelerator, enabled=False),
        signals=None,
        wall_start=0.0,
        identity=SAVED,
        memory=None,
    )
    return trainer


def _train_to(s: session.Trainer, stop: int) -> None:
    """Steps to `stop` as the loop takes them (training/loop.py _optimizer_step, _after_step), each with a loss and
    a step time of its own, and no model work; validation gives a fixed line, and summary.json is not written."""
    progress = loop._NoProgress()
    while s.state.step < stop:
        step = s.state.step + 1
        s.tracker.add_micro_batch(torch.tensor(10.0 - step / 7), TOKENS_PER_STEP)
        s.times.train_s += step / 100
        s.state.step, s.state.steps_in_epoch = step, s.state.steps_in_epoch + 1
        s.tracker.end_step(step, s.state.epoch, step * TOKENS_PER_STEP, torch.tensor(1.0 + step), 1e-3, step / 100)
        loop._after_step(s, progress, StepHealth(signal=0, nonfinite=False))


@pytest.fixture()
def without_model_work(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop, "evaluate_now", lambda s: eval_line(s.state.step, s.state.epoch, 0, 1.0, 0.0))
    monkeypatch.setattr(loop, "_write_summary", lambda *args, **kwargs: None)


def _records(s: session.Trainer) -> list[tuple[int, float, float]]:
    return [(r.step, r.loss, r.step_time_s) for r in s.tracker.records]


def _logged(out: Path) -> list[dict]:
    """The train lines of metrics.jsonl, without the figures read from the process (elapsed time, memory)."""
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in line.items() if "mem" not in k and k != "elapsed_s"} for line in lines]


def _epochs(s: session.Trainer) -> list[dict]:
    return [{k: e[k] for k in ("epoch", "steps", "tokens", "loss_mean", "time_s")} for e in s.state.epochs]


@pytest.mark.parametrize("log_interval", LOG_INTERVALS)
def test_every_step_survives_a_resume_from_any_checkpoint(
    tmp_path: Path, log_interval: int, without_model_work: None
) -> None:
    """A run of 12 steps (5 per epoch) checkpointed every 3 steps, resumed from each of its checkpoints in turn
    (a copy of the run folder as the checkpoint left it), which fall before, on and after log lines and epoch ends:
    the resumed run ends with the uninterrupted run's step records, metrics lines and epoch figures."""
    whole = _session(tmp_path / "whole", log_interval)
    copies = {}
    for checkpoint in range(CHECKPOINT_INTERVAL, STEPS, CHECKPOINT_INTERVAL):
        _train_to(whole, checkpoint)
        copies[checkpoint] = shutil.copytree(whole.out, tmp_path / f"cut-{checkpoint}")
    _train_to(whole, STEPS)
    for checkpoint, out in copies.items():
        resumed = _session(out, log_interval)
        path = checkpoint_path(out, checkpoint)
        origin = ResumedFromRecord.from_dict(session._resume_origin(path, SAVED))
        session._resume(resumed, path, dataclasses.replace(origin, random_states_exact=True))
        _train_to(resumed, STEPS)
        assert _records(resumed) == _records(whole), f"resumed from step {checkpoint}"
        assert _logged(out) == _logged(whole.out), f"resumed from step {checkpoint}"
        assert _epochs(resumed) == _epochs(whole), f"resumed from step {checkpoint}"


class _MainOfTwo:
    """The main process of a job of two, whose other process's answers the test gives."""

    num_processes = 2

    def __init__(self, accelerator: object) -> None:
        self._accelerator = accelerator

    def __getattr__(self, name: str) -> object:
        return getattr(self._accelerator, name)


def test_a_resume_that_fails_on_another_process_changes_nothing_in_the_run_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, without_model_work: None
) -> None:
    """--resume_step 3 past step 6: the main process loads its part, the other fails on its own files (its random
    states, say): the main process must not rename step 6 aside nor cut metrics.jsonl."""
    _train_to(_session(tmp_path, 1), 6)
    checkpoint, before = checkpoint_path(tmp_path, 3), (tmp_path / "metrics.jsonl").read_text()
    s = _session(tmp_path, 1)
    s.accelerator = _MainOfTwo(s.accelerator)
    origin = ResumedFromRecord.from_dict(session._resume_origin(checkpoint, SAVED, roll_back=True))
    monkeypatch.setattr(session, "gather_object", lambda own: [*own, "rank 1: FileNotFoundError: rank_1.json"])
    with pytest.raises(RunError, match=r"did not load on every process \(rank 1: FileNotFoundError"):
        session._resume(s, checkpoint, dataclasses.replace(origin, random_states_exact=True))
    assert (tmp_path / "metrics.jsonl").read_text() == before
    assert checkpoint_path(tmp_path, 6).is_dir()


def _dcp_failure() -> BaseException:
    from torch.distributed.checkpoint.api import CheckpointException

    return CheckpointException("load", {0: (RuntimeError("size mismatch\nfor wte"), traceback.StackSummary())})


@pytest.mark.parametrize(
    "failure",
    [lambda: RuntimeError("Error(s) in loading state_dict:\n\tMissing key(s): wte"), _dcp_failure],
    ids=["torch-multi-line", "dcp-checkpoint-exception"],
)
def test_a_load_that_fails_on_this_process_is_one_line_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, without_model_work: None, failure
) -> None:
    """torch's load errors span lines, and DCP's report of every rank's failures is a BaseException, not an
    Exception: either is one RunError line naming the rank, with metrics.jsonl and the later checkpoint as they
    were."""
    _train_to(_session(tmp_path, 1), 6)
    checkpoint, before = checkpoint_path(tmp_path, 3), (tmp_path / "metrics.jsonl").read_text()
    s = _session(tmp_path, 1)
    origin = ResumedFromRecord.from_dict(session._resume_origin(checkpoint, SAVED, roll_back=True))

    def fails(*_args: object) -> None:
        raise failure()

    monkeypatch.setattr(session, "_restore", fails)
    with pytest.raises(RunError, match=r"did not load on every process \(rank 0: ") as refused:
        session._resume(s, checkpoint, origin)
    message = str(refused.value)
    assert (
        "\n" not in message
        and "Traceback" not in message
        and ("Missing key(s): wte" in message or "RuntimeError: size mismatch for wte" in message)
    ), message
    assert (tmp_path / "metrics.jsonl").read_text() == before
    assert checkpoint_path(tmp_path, 6).is_dir()


def test_a_roll_back_whose_renames_fail_after_the_load_stops_every_process_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, without_model_work: None
) -> None:
    """The renames after the load are the main process's: one that fails is shared with every process (which must not
    train on without it) as one line, and the note stays for the next launch to finish the roll-back."""
    _train_to(_session(tmp_path, 1), 6)
    checkpoint = checkpoint_path(tmp_path, 3)
    s = _session(tmp_path, 1)
    origin = ResumedFromRecord.from_dict(session._resume_origin(checkpoint, SAVED, roll_back=True))
    shared: list[str | None] = []
    monkeypatch.setattr(session, "_share_outcome", lambda failure: shared.append(failure) or failure)

    def refused_rename(_path: Path, _suffix: str) -> Path:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(resume, "set_aside", refused_rename)
    with pytest.raises(RunError, match=r"loaded, but the run folder could not be updated: .*cut short") as refused:
        session._resume(s, checkpoint, origin)
    assert "\n" not in str(refused.value) and shared == [str(refused.value)]
    assert pending_rollback(tmp_path) == 3 and checkpoint_path(tmp_path, 6).is_dir()


# --------------------------------------------------------------------------------------------- launch


def _summary_by_epoch(out: Path) -> list[dict]:
    """summary.json's epochs in what an interrupted run must not lose: steps, tokens, loss and grad-norm means,
    and one step time per step."""
    summary = json.loads((out / "summary.json").read_text())
    figures = ("epoch", "partial", "steps", "tokens", "loss_mean", "grad_norm_mean")
    return [
        {**{k: e[k] for k in figures}, "step_times": len(summary["step_times_s"]), "run_steps": summary["steps"]}
        for e in summary["epochs"]
    ]


@contextlib.contextmanager
def _without_param_groups(checkpoint: Path) -> Iterator[None]:
    """The checkpoint with its optimizer param groups gone and unlisted, so that it verifies and fails only when
    loaded; put back afterwards."""
    groups, marker = checkpoint / "optimizer_param_groups.json", checkpoint / "complete.json"
    kept = {path: path.read_bytes() for path in (groups, marker)}
    listing = json.loads(kept[marker])
    del listing["files"][groups.name]
    marker.write_text(json.dumps(listing))
    groups.unlink()
    try:
        yield
    finally:
        for path, data in kept.items():
            path.write_bytes(data)


@pytest.mark.multiprocess
def test_a_run_resumed_between_log_lines_has_the_uninterrupted_runs_epochs(
    tmp_path: Path, base_args: list[str], shared_runs
) -> None:
    """The shared single run's flags at --log_interval 4: the run fails after step 5, its newest checkpoint at step
    3 between the log lines of steps 0 and 4. A resume over a metrics.jsonl broken before its last line is refused in
    one line, and one whose checkpoint fails to load stops: each leaves config.json and metrics.jsonl as they were.
    Over a torn last line the resume warns once and continues, and its summary.json's epochs equal the shared
    uninterrupted run's (--log_interval 1, which changes no step)."""
    run_dir = tmp_path / "run"
    args = [*base_args, "--strategy", "single", "--wandb_mode", "disabled", "--no-export_hf", "--log_interval", "4"]
    args += ["--output_dir", str(run_dir)]
    # Launched as the shared run is: accelerate's launcher sets the CPU threads, on which the losses' last bits depend.
    launched = accelerate_command(CONFIGS / "single_gpu.yaml", "train.py", args)
    failed = subprocess.run(
        launched,
        cwd=REPO,
        env={**launch_env(), "GPT2S_FAULT": "raise:step=5"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert failed.returncode != 0 and "failed after step 5" in failed.stdout + failed.stderr, failed.stderr[-3000:]
    metrics, config = run_dir / "metrics.jsonl", run_dir / "config.json"
    written = metrics.read_text()
    assert [json.loads(line)["step"] for line in written.splitlines()] == [4, 4]  # its train and eval lines
    files = {metrics: written.replace('"kind"', '"kind', 1), config: config.read_text()}
    metrics.write_text(files[metrics])  # the first line broken: not a cut write
    # `python train.py`: accelerate's one-process launcher would echo each line of a failure in its own traceback.
    refused = run([sys.executable, "train.py", *args, "--resume"], check=False)
    errors = [line for line in (refused.stdout + refused.stderr).splitlines() if line.startswith("error:")]
    assert refused.returncode == 2 and len(errors) == 1 and f"{metrics}: line 1 " in errors[0], refused.stderr[-3000:]
    assert {path: path.read_text() for path in files} == files
    metrics.write_text(written[: len(written) - 20])  # the last line cut short: dropped once the checkpoint loads
    files[metrics] = metrics.read_text()
    with _without_param_groups(checkpoint_path(run_dir, 3)):  # a checkpoint that verifies but fails to load
        failed_load = run([sys.executable, "train.py", *args, "--resume"], check=False)
    assert failed_load.returncode == 2 and "optimizer_param_groups.json" in failed_load.stderr, failed_load.stderr[
        -3000:
    ]
    assert {path: path.read_text() for path in files} == files
    resumed = run(accelerate_command(CONFIGS / "single_gpu.yaml", "train.py", [*args, "--resume"]))
    warnings = [line for line in (resumed.stdout + resumed.stderr).splitlines() if str(metrics) in line]
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: {metrics}: line 2 "), warnings
    assert "step_0000003 at step 3" in resumed.stdout
    assert _summary_by_epoch(run_dir) == _summary_by_epoch(shared_runs["single"])
