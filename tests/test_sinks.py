"""Metric sinks: W&B failures never stop training, offline mode without a login, JSON-safe lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training.records.sinks import JsonlSink, WandbSink, resolve_wandb_mode


class _BrokenTracker:
    """Stands in for an Accelerator whose W&B tracker cannot start (no network, bad key)."""

    def __init__(self) -> None:
        self.logged: list[dict] = []

    def init_trackers(self, *args, **kwargs) -> None:
        raise ConnectionError("could not reach the W&B server\nsecond line")

    def log(self, values: dict, step: int) -> None:
        self.logged.append(values)


def test_a_wandb_failure_is_one_warning_and_logging_goes_on(capsys: pytest.CaptureFixture[str]) -> None:
    tracker = _BrokenTracker()
    sink = WandbSink(tracker, enabled=True)  # type: ignore[arg-type]
    sink.start("project", {}, {})
    sink.log({"kind": "train", "step": 1, "loss": 1.0}, step=1)
    sink.finish()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "W&B start failed (ConnectionError: could not reach the W&B server)" in err[0]
    assert not sink.enabled and tracker.logged == []


class _FailingWandb:
    """Stands in for an Accelerator with a started W&B tracker; the W&B call named `fail` raises.

    `calls` records every W&B call that reached it, in order."""

    def __init__(self, fail: str) -> None:
        self.fail = fail
        self.calls: list[str] = []
        self.summary = self  # the run's summary object
        self.trackers = [self]

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name == self.fail:
            raise RuntimeError(f"W&B {name} broke\ntraceback details")

    def init_trackers(self, *args, **kwargs) -> None:
        self._call("start")

    def get_tracker(self, name: str, unwrap: bool = False) -> _FailingWandb:
        return self

    def log(self, values: dict, step: int) -> None:
        self._call(f"log {step}")

    def update(self, values: dict) -> None:  # run.summary.update
        self._call("summary")

    def finish(self) -> None:  # tracker.finish
        self._call("finish")


def _use_every_call(sink: WandbSink) -> None:
    """What a run does with its sink: start, log each step, the end-of-run summary, finish."""
    sink.start("project", {}, {})
    for step in (1, 2, 3):
        sink.log({"kind": "train", "step": step, "loss": 1.0}, step=step)
    sink.summary({"total/loss_mean": 1.0})
    sink.finish()
    # and once more of each, so that a failure of the last call must also stop the ones after it
    sink.log({"kind": "train", "step": 4, "loss": 1.0}, step=4)
    sink.summary({"total/loss_mean": 1.0})
    sink.finish()


@pytest.mark.parametrize(
    "fail, reached",
    [
        ("log 2", ["start", "log 1", "log 2"]),
        ("summary", ["start", "log 1", "log 2", "log 3", "summary"]),
        ("finish", ["start", "log 1", "log 2", "log 3", "summary", "finish"]),
    ],
)
def test_a_wandb_call_that_fails_is_one_warning_and_wandb_is_not_called_again(
    fail: str, reached: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    accelerator = _FailingWandb(fail)
    sink = WandbSink(accelerator, enabled=True)  # type: ignore[arg-type]
    _use_every_call(sink)
    assert accelerator.calls == reached
    what = fail.split()[0]
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"warning: W&B {what} failed (RuntimeError: W&B {fail} broke); "
        "training continues, metrics.jsonl has every value"
    ]
    assert not sink.enabled


class _StartedWandb(_FailingWandb):
    """A started W&B run with its files under `dir` (what wandb's run.dir gives)."""

    dir = "/runs/r/wandb/run-20260101_000000-abc/files"


@pytest.mark.parametrize(
    "mode, fail, line",
    [
        (
            "offline",
            None,
            "W&B: offline run in /runs/r/wandb/run-20260101_000000-abc; "
            "upload it with: wandb sync /runs/r/wandb/run-20260101_000000-abc",
        ),
        ("online", None, None),  # all uploaded: nothing left to sync
        (
            "online",
            "finish",
            "W&B: the upload did not finish; the run is kept in /runs/r/wandb/run-20260101_000000-abc; "
            "upload the rest with: wandb sync --include-online /runs/r/wandb/run-20260101_000000-abc",
        ),
        ("online", "log 2", None),  # finish is not called after a failure; W&B's exit hook ends the run
    ],
)
def test_the_sync_line_names_what_wandb_has_not_uploaded(mode: str, fail: str | None, line: str | None) -> None:
    sink = WandbSink(_StartedWandb(fail or ""), enabled=True)  # type: ignore[arg-type]
    sink.start("project", {}, {"mode": mode})
    for step in (1, 2, 3):
        sink.log({"kind": "train", "step": step, "loss": 1.0}, step=step)
    sink.summary({"total/loss_mean": 1.0})
    sink.finish()
    assert sink.sync_line() == line


def test_wandb_mode_is_offline_without_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    assert resolve_wandb_mode("auto") == "offline"
    (tmp_path / "netrc").write_text("machine api.wandb.ai login user password abc\n")
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    assert resolve_wandb_mode("auto") == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert resolve_wandb_mode("auto") == "disabled"
    assert resolve_wandb_mode("offline") == "offline"


def test_jsonl_lines_are_valid_json_even_for_nan(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path / "metrics.jsonl")
    sink.write({"step": 1, "mfu": float("nan"), "loss": 2.5})
    sink.write({"step": 2, "mfu": float("inf"), "loss": 2.4})
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == [{"step": 1, "mfu": None, "loss": 2.5}, {"step": 2, "mfu": None, "loss": 2.4}]


class _RecordingWandb(_FailingWandb):
    """A W&B run that keeps what it is given."""

    def __init__(self) -> None:
        super().__init__(fail="")
        self.logged: list[tuple[int, dict]] = []

    def log(self, values: dict, step: int) -> None:
        self.logged.append((step, values))


def test_lines_reach_wandb_under_the_metrics_tables_names() -> None:
    accelerator = _RecordingWandb()
    sink = WandbSink(accelerator, enabled=True)  # type: ignore[arg-type]
    sink.log(
        {
            "kind": "train",
            "step": 5,
            "loss": 2.5,
            "tokens": 640,
            "skipped_steps": 0,
            "warmup": False,
            "new_metric": 1.0,
        },
        step=5,
    )
    sink.log({"kind": "eval", "step": 5, "tokens": 640, "val_loss": 2.6, "eval_time_s": 0.5}, step=5)
    assert accelerator.logged == [
        # kind, step (W&B's own axis) and the warm-up flag stay out; an undeclared key keeps its name
        (5, {"train/loss": 2.5, "train/tokens": 640, "skipped_steps": 0, "new_metric": 1.0}),
        (5, {"train/tokens": 640, "val/loss": 2.6, "time/eval_time_s": 0.5}),
    ]
