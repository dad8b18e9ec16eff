"""Metric sinks: W&B failures never stop training, offline mode without a login, JSON-safe lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training.sinks import JsonlSink, WandbSink, resolve_wandb_mode


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
