"""Checkpoints written beside training (DCP's async_save): training goes on once the states are in host memory,
the checkpoint counts only once its files are written, each save waits for the one before, and every save's
pause and duration are in summary.json."""

from __future__ import annotations

import json
import math
import re
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator

from model import GPT2, GPT2Config
from tests.launch import SHARED_STEPS, summary
from training import loop
from training.checkpoints import store as checkpoint_module
from training.checkpoints.store import (
    COMPLETE_MARKER,
    PendingSave,
    TrainState,
    checkpoint_problem,
    load_model_state_dict,
    start_checkpoint,
)
from training.records.metrics import RunTimes

CONFIG = GPT2Config.from_preset("tiny", vocab_size=256, n_positions=32)


@pytest.fixture(scope="module")
def prepared() -> tuple[Accelerator, torch.nn.Module, torch.optim.Optimizer]:
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = GPT2(CONFIG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def test_an_async_save_counts_only_once_written_and_holds_the_weights_of_its_step(
    prepared, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write is held up inside DCP's writer while training changes the weights: no complete.json until it
    is released, and then the checkpoint verifies and holds the weights as they were at the save."""
    accelerator, model, optimizer = prepared
    release = threading.Event()
    monkeypatch.setattr(checkpoint_module, "inside_checkpoint_writer", lambda step: release.wait(30))
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    pending = start_checkpoint(
        accelerator, model, optimizer, tmp_path, 4, CONFIG.to_dict(), keep=2, train_state={}, asynchronous=True
    )
    assert pending.asynchronous and not pending.future.done()
    with torch.no_grad():  # training goes on while the write waits
        for parameter in model.parameters():
            parameter.add_(1.0)
    # Watched for about a second with the write held: a checkpoint marked complete early would show up by then.
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        assert not (pending.path / COMPLETE_MARKER).exists() and not pending.future.done()
        time.sleep(0.05)
    release.set()
    pending.wait()
    assert (pending.path / COMPLETE_MARKER).is_file() and checkpoint_problem(pending.path) is None
    listed = json.loads((pending.path / COMPLETE_MARKER).read_text())["files"]
    for folder in ("model", "optimizer"):  # the shards the held writer wrote, not only the small files
        assert any(re.fullmatch(rf"{folder}/__0_\d+\.distcp", name) for name in listed), (folder, sorted(listed))
        assert f"{folder}/.metadata" in listed, (folder, sorted(listed))
    written = load_model_state_dict(pending.path)
    assert all(torch.equal(written[k], saved[k]) for k in written)
    assert 0 < pending.blocked_s and 0 < pending.total_s


def test_a_failed_async_write_is_raised_when_waited_on_and_leaves_no_complete_checkpoint(
    prepared, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from training.distributed import faults

    accelerator, model, optimizer = prepared
    monkeypatch.setenv("GPT2S_FAULT", "save_error:step=6")
    faults._this_process_fault.cache_clear()
    try:
        pending = start_checkpoint(
            accelerator, model, optimizer, tmp_path, 6, CONFIG.to_dict(), keep=2, asynchronous=True
        )
        with pytest.raises(OSError, match="No space left on device"):
            pending.wait()
    finally:
        monkeypatch.delenv("GPT2S_FAULT")
        faults._this_process_fault.cache_clear()
    assert not (pending.path / COMPLETE_MARKER).exists()


def _session(tmp_path: Path) -> SimpleNamespace:
    """What loop.checkpoint_now reads of a run in progress."""
    return SimpleNamespace(
        state=TrainState(),
        tracker=SimpleNamespace(records=[], unlogged=0, settle=lambda: None),
        times=RunTimes(),
        scheduler=SimpleNamespace(state_dict=dict),
        launch=SimpleNamespace(effective=SimpleNamespace(strategy=None)),
        accelerator=SimpleNamespace(num_processes=1),
        identity=None,
        cfg=SimpleNamespace(run=SimpleNamespace(checkpoint_async=True, keep_checkpoints=2, collective_timeout_s=600)),
        model=None,
        optimizer=None,
        out=tmp_path,
        model_config=SimpleNamespace(to_dict=dict),
        save_groups=None,
        pending_save=None,
        checkpoint_saves=[],
        last_checkpoint=None,
    )


def test_each_save_starts_only_once_the_one_before_is_complete_and_the_last_waits_for_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Saves at steps 3 and 6 in the background (each taking 0.2 s), the last at step 9 synchronous: each save
    finds the one before complete when it starts, and after the last nothing is in flight and all are recorded."""
    in_flight_at_start: dict[int, list[bool]] = {}
    started: list[PendingSave] = []

    def fake_start(accelerator, model, optimizer, out, step, *rest, asynchronous, groups) -> PendingSave:
        in_flight_at_start[step] = [not p.future.done() for p in started]
        future: Future[float] = Future()
        if asynchronous:
            threading.Timer(0.2, lambda: future.set_result(time.perf_counter())).start()
        else:
            future.set_result(time.perf_counter())
        started.append(PendingSave(out / str(step), step, time.perf_counter(), 0.01, future, asynchronous))
        return started[-1]

    monkeypatch.setattr(loop, "start_checkpoint", fake_start)
    monkeypatch.setattr(loop, "origin_record", lambda *args: {})
    s = _session(tmp_path)
    for step, last in ((3, False), (6, False), (9, True)):
        s.state.step = step
        loop.checkpoint_now(s, wait=last)
        if not last:
            assert s.pending_save is not None and not s.pending_save.future.done()
    assert in_flight_at_start == {3: [], 6: [False], 9: [False, False]}
    assert s.pending_save is None and s.last_checkpoint == 9
    assert [(c.step, c.asynchronous) for c in s.checkpoint_saves] == [(3, True), (6, True), (9, False)]


@pytest.mark.multiprocess
def test_the_summary_records_each_saves_pause_and_duration(shared_runs) -> None:
    """The shared DDP run (a checkpoint every 3 of 12 steps): the periodic saves in the background, the last one
    synchronous; every figure positive, and a synchronous save pauses training for all of it."""
    saves = summary(shared_runs["ddp"])["checkpoint_saves"]
    assert [(c["step"], c["asynchronous"]) for c in saves] == [(3, True), (6, True), (9, True), (SHARED_STEPS, False)]
    for save in saves:
        assert all(math.isfinite(save[k]) and save[k] > 0 for k in ("blocked_s", "total_s")), save
    assert saves[-1]["blocked_s"] >= saves[-1]["total_s"]


def _real_session(prepared, tmp_path: Path, checkpoint_async: bool = True) -> SimpleNamespace:
    """`_session` around the module's prepared one-process model, so that checkpoint_now writes real checkpoints."""
    accelerator, model, optimizer = prepared
    s = _session(tmp_path)
    s.accelerator, s.model, s.optimizer = accelerator, model, optimizer
    s.cfg.run.checkpoint_async = checkpoint_async
    return s


def test_an_async_save_blocks_training_for_less_than_it_takes_and_the_total_counts_only_the_blocked_seconds(
    prepared, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A periodic save at step 3 whose write is held 0.5 s inside DCP's writer while training goes on, then the
    last save at step 6 (synchronous): step 3's blocked_s is below its total_s, step 6's is all of it, and the
    run's checkpoint time (summary.json's total.checkpoint_time_s) is the sum of the blocked seconds."""
    release = threading.Event()
    monkeypatch.setattr(checkpoint_module, "inside_checkpoint_writer", lambda step: release.wait(30))
    monkeypatch.setattr(loop, "origin_record", lambda *args: {})
    s = _real_session(prepared, tmp_path)
    s.state.step = 3
    loop.checkpoint_now(s, wait=False)
    pending = s.pending_save
    assert pending is not None and pending.asynchronous
    time.sleep(0.5)  # training goes on while the write is held
    release.set()
    pending.future.result(timeout=30)  # written before the next save starts: the next save waits for nothing
    s.state.step = 6
    loop.checkpoint_now(s, wait=True)
    first, last = s.checkpoint_saves
    assert (first.step, first.asynchronous, last.step, last.asynchronous) == (3, True, 6, False)
    assert 0 < first.blocked_s < first.total_s and first.total_s >= 0.5
    assert 0 < last.total_s <= last.blocked_s
    assert s.times.checkpoint_s == pytest.approx(first.blocked_s + last.blocked_s)
    assert s.times.checkpoint_s < first.total_s + last.total_s


def _recording_start(started: list[PendingSave], seconds: float = 0.0):
    """A stand-in for start_checkpoint that records each save and completes it after `seconds` (asynchronous)."""

    def fake_start(accelerator, model, optimizer, out, step, *rest, asynchronous, groups) -> PendingSave:
        future: Future[float] = Future()
        if asynchronous and seconds:
            threading.Timer(seconds, lambda: future.set_result(time.perf_counter())).start()
        else:
            future.set_result(time.perf_counter())
        started.append(PendingSave(out / str(step), step, time.perf_counter(), 0.01, future, asynchronous))
        return started[-1]

    return fake_start


def test_no_checkpoint_async_makes_every_save_synchronous(
    tmp_path: Path, base_args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--no-checkpoint_async: the periodic saves (steps 3, 6) are written while training waits, as the last one
    (9) is; none is left in flight after its step, and summary.json's entries all say asynchronous false."""
    from training.cli import parse_config

    run = parse_config([*base_args, "--output_dir", str(tmp_path / "run"), "--no-checkpoint_async"]).run
    assert run.checkpoint_async is False
    started: list[PendingSave] = []
    monkeypatch.setattr(loop, "start_checkpoint", _recording_start(started, seconds=0.2))
    monkeypatch.setattr(loop, "origin_record", lambda *args: {})
    s = _session(tmp_path)
    s.cfg.run = run
    for step, last in ((3, False), (6, False), (9, True)):
        s.state.step = step
        loop.checkpoint_now(s, wait=last)
        assert s.pending_save is None and s.last_checkpoint == step
    assert [p.asynchronous for p in started] == [False, False, False]
    assert [(c.step, c.asynchronous) for c in s.checkpoint_saves] == [(3, False), (6, False), (9, False)]


def test_a_diverged_stop_waits_for_the_save_in_flight_before_naming_the_newest_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A periodic save of step 3 still being written (0.3 s) when steps 4 and 5 are non-finite under
    --max_nonfinite_steps 2: the stop names step 3 as the newest good checkpoint, and only once it is complete."""
    from training.step import RunStopped, StepHealth

    started: list[PendingSave] = []
    monkeypatch.setattr(loop, "start_checkpoint", _recording_start(started, seconds=0.3))
    monkeypatch.setattr(loop, "origin_record", lambda *args: {})
    monkeypatch.setattr(loop, "_log_interval", lambda s, progress: None)
    s = _session(tmp_path)
    s.cfg.run = SimpleNamespace(
        checkpoint_async=True,
        keep_checkpoints=2,
        log_interval=1,
        eval_interval=0,
        checkpoint_interval=3,
        max_nonfinite_steps=2,
        collective_timeout_s=600,
    )
    s.schedule = SimpleNamespace(steps_per_epoch=100, stop_at=50, total_steps=50)
    s.log = lambda message: None
    s.nonfinite_since = None
    s.state.step, s.state.steps_in_epoch = 3, 3
    assert loop._after_step(s, None, StepHealth(signal=0, nonfinite=False)) is True  # the periodic save starts
    assert s.pending_save is not None and not s.pending_save.future.done() and s.last_checkpoint is None
    s.state.step, s.state.steps_in_epoch = 4, 4
    loop._after_step(s, None, StepHealth(signal=0, nonfinite=True))
    s.state.step, s.state.steps_in_epoch = 5, 5
    with pytest.raises(RunStopped, match=r"the newest checkpoint, step 3, is the last good one") as stopped:
        loop._after_step(s, None, StepHealth(signal=0, nonfinite=True))
    assert stopped.value.exit_status != 0 and started[0].future.done()
    assert s.pending_save is None and [(c.step, c.asynchronous) for c in s.checkpoint_saves] == [(3, True)]


# --------------------------------------------------------------------------------------------- a failure meanwhile


def _failing_run(s: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    """run_training on `s`, whose training fails at once with RuntimeError("boom") (told as it is)."""

    def fail(session) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(loop, "Trainer", lambda cfg: s)
    monkeypatch.setattr(loop, "train", fail)
    monkeypatch.setattr(loop, "_failed", lambda session, exc, step: exc)
    with pytest.raises(RuntimeError, match="^boom$"):
        loop.run_training(None)


def test_a_failure_right_after_an_async_save_lets_it_be_marked_complete_first(
    prepared, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The save's files are being written when training fails: the process waits for it (the thread that
    marks it complete dies with the process), so the checkpoint counts."""
    accelerator, model, optimizer = prepared
    release = threading.Event()
    monkeypatch.setattr(checkpoint_module, "inside_checkpoint_writer", lambda step: release.wait(30))
    s = _session(tmp_path)
    s.pending_save = start_checkpoint(
        accelerator, model, optimizer, tmp_path, 4, CONFIG.to_dict(), keep=2, train_state={}, asynchronous=True
    )
    threading.Timer(0.5, release.set).start()  # the write finishes shortly after the failure
    _failing_run(s, monkeypatch)
    assert (tmp_path / "checkpoints" / "step_0000004" / COMPLETE_MARKER).is_file()
    assert checkpoint_problem(tmp_path / "checkpoints" / "step_0000004") is None


@pytest.mark.parametrize("outcome", ["fails", "hangs"])
def test_a_save_that_fails_or_hangs_meanwhile_neither_hides_the_failure_nor_holds_the_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, outcome: str
) -> None:
    future: Future[float] = Future()
    if outcome == "fails":
        future.set_exception(OSError("No space left on device"))
    monkeypatch.setattr(loop, "SETTLE_ON_FAILURE_S", 0.2)
    s = _session(tmp_path)
    s.pending_save = PendingSave(tmp_path / "4", 4, time.perf_counter(), 0.01, future, True)
    start = time.perf_counter()
    _failing_run(s, monkeypatch)
    assert time.perf_counter() - start < 10 and s.last_checkpoint is None


def _fake_saves(monkeypatch: pytest.MonkeyPatch, seconds: float) -> list[PendingSave]:
    """loop.start_checkpoint replaced: each save takes `seconds` in the background; the saves started, in order."""
    started: list[PendingSave] = []
    monkeypatch.setattr(loop, "start_checkpoint", _recording_start(started, seconds))
    monkeypatch.setattr(loop, "origin_record", lambda *args: {})
    return started


def test_a_signal_at_the_step_of_the_save_in_flight_waits_for_it_and_writes_nothing_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = _fake_saves(monkeypatch, 0.2)
    s = _session(tmp_path)
    s.state.step = 6
    loop.checkpoint_now(s, wait=False)  # the periodic save, in the background
    loop.checkpoint_now(s, wait=True)  # the signal's, at the same step
    assert [(p.step, p.asynchronous) for p in started] == [(6, True)]
    assert s.pending_save is None and s.last_checkpoint == 6 and started[0].future.done()
    assert [c.step for c in s.checkpoint_saves] == [6]


def test_the_background_groups_fail_after_the_collective_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not gloo's default 30 minutes: a rank that died fails the others' background saves as training's would."""
    import datetime

    import torch.distributed as dist

    made: list[dict] = []
    monkeypatch.setattr(checkpoint_module, "_single_process", lambda: False)
    monkeypatch.setattr(dist, "new_group", lambda **kwargs: made.append(kwargs) or object())
    assert len(checkpoint_module.background_groups(42)) == 2
    assert made == [{"backend": "gloo", "timeout": datetime.timedelta(seconds=42)}] * 2


def test_a_save_that_never_completes_is_told_as_a_failed_write_of_its_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loop, "SAVE_WAIT_S", 0.1)
    s = _session(tmp_path)
    s.pending_save = PendingSave(tmp_path / "4", 4, time.perf_counter(), 0.01, Future(), True)  # never done
    raised: list[BaseException] = []

    def settle() -> None:
        try:
            loop.settle_checkpoint(s)
        except BaseException as exc:
            raised.append(exc)

    waiter = threading.Thread(target=settle, daemon=True)  # a wait without a limit would not end
    waiter.start()
    waiter.join(10)
    assert not waiter.is_alive() and len(raised) == 1
    assert isinstance(raised[0], loop.CheckpointWriteFailed) and raised[0].step == 4
