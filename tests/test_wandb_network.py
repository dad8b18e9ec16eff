"""An online W&B run whose server goes away mid-run: one warning, a bounded end, nothing lost.

train.py runs as a user starts it with a W&B key in the environment, so `--wandb_mode auto` is online,
against a W&B server in this process (tests/wandb_server.py). The server creates the run and answers
its first file_stream request (the first system metrics, sent as the run starts); then it vanishes
(connections refused, open ones cut), as when a notebook's network drops. Dropping on a request rather
than after some time keeps the test independent of how fast the machine trains.

Without a bound, wandb 0.31 retries for longer than a session lasts and the run never reaches its
closing line. With `--wandb_finish_timeout_s`, W&B's finish gives up after that long, the run ends
normally, and `wandb sync` later uploads the whole run from its record on disk.
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.launch import launch_env
from tests.wandb_server import FakeWandbServer, Request

REPO = Path(__file__).resolve().parents[1]
STEPS = 6
FINISH_TIMEOUT_S = 5
# Shaped like a real key (40 hex digits); never valid anywhere.
API_KEY = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c"
# A hang fails the test instead of stalling CI for the 9+ minutes W&B was seen to wait. The whole run
# took 11-30 s on 2 cores, idle to busy (start-up, tokenizing and the CPU peak measurement included),
# of which FINISH_TIMEOUT_S is W&B's finish.
RUN_LIMIT_S = 90
# From summary.json (written just before W&B's finish) to the process's end: the finish timeout, then
# the closing lines and W&B's own teardown, which takes a second or two once its server refuses.
EXIT_SLACK_S = 10


def _is_file_stream(request: Request) -> bool:
    return request.path.endswith("/file_stream")


def _history(requests: list[Request]) -> list[dict[str, Any]]:
    """The history rows (one per step) that file_stream requests carried."""
    rows = []
    for request in filter(_is_file_stream, requests):
        history = json.loads(request.body).get("files", {}).get("wandb-history.jsonl", {})
        rows += [json.loads(line) for line in history.get("content", [])]
    return rows


def _authenticated_with(request: Request, key: str) -> bool:
    scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
    return scheme == "Basic" and base64.b64decode(credentials).decode().endswith(":" + key)


@dataclass
class DroppedRun:
    out: Path
    done: subprocess.CompletedProcess[str]
    waited_after_summary_s: float  # from summary.json's write to the end of the process
    server: FakeWandbServer
    sync: subprocess.CompletedProcess[str] | None  # the closing line's `wandb sync`, to a server that is up
    sync_server: FakeWandbServer

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in (self.out / "metrics.jsonl").read_text().splitlines()]

    def stdout_lines(self) -> list[str]:
        return self.done.stdout.strip().splitlines()


def _wandb_env(base_url: str) -> dict[str, str]:
    # launch_env() hides any W&B login of the machine; this run logs in to the local server only.
    return {**launch_env(), "WANDB_BASE_URL": base_url, "WANDB_API_KEY": API_KEY, "NETRC": os.devnull}


def _sync(closing_line: str, env: dict[str, str]) -> subprocess.CompletedProcess[str] | None:
    """Runs the `wandb sync ...` that the closing line gives, as a user would paste it."""
    _, found, command = closing_line.partition("upload the rest with: ")
    if not found or not command.startswith("wandb sync "):
        return None
    return subprocess.run(
        [sys.executable, "-m", "wandb", *shlex.split(command)[1:]],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def dropped_run(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path) -> DroppedRun:
    root = tmp_path_factory.mktemp("wandb_network_drop")
    out = root / "run"
    server = FakeWandbServer(drop_when=_is_file_stream).start()
    sync_server = FakeWandbServer().start()
    try:
        done = subprocess.run(
            [
                sys.executable,
                "train.py",
                "--preset",
                "tiny",
                "--max_steps",
                str(STEPS),
                "--log_interval",
                "1",
                "--output_dir",
                str(out),
                "--cache_dir",
                str(shared_cache),
                "--block_size",
                "32",
                "--micro_batch_size",
                "4",
                "--global_batch_tokens",
                "128",
                "--no-export_hf",
                "--wandb_finish_timeout_s",
                str(FINISH_TIMEOUT_S),
            ],
            cwd=REPO,
            env=_wandb_env(server.base_url),
            capture_output=True,
            text=True,
            timeout=RUN_LIMIT_S,
        )
        ended = time.time()
        summary_written = (out / "summary.json").stat().st_mtime if (out / "summary.json").exists() else ended
        last_line = (done.stdout.strip().splitlines() or [""])[-1]
        sync = _sync(last_line, _wandb_env(sync_server.base_url))
    finally:
        server.stop()
        sync_server.stop()
    return DroppedRun(out, done, ended - summary_written, server, sync, sync_server)


def test_the_run_exits_0_and_prints_its_closing_line(dropped_run: DroppedRun) -> None:
    assert dropped_run.done.returncode == 0, dropped_run.done.stderr[-3000:]
    assert any(line.startswith(f"done: {STEPS} of {STEPS} steps") for line in dropped_run.stdout_lines())


def test_the_server_took_the_run_and_its_first_metrics_then_went_away(dropped_run: DroppedRun) -> None:
    server = dropped_run.server
    assert server.gone, "no file_stream request reached the server, so it never went away"
    answered = server.requests
    # An online run: created on the server, logged in with the key, streaming metrics.
    assert "UpsertBucket" in [r.operation for r in answered]
    assert all(_authenticated_with(r, API_KEY) for r in answered if r.path == "/graphql")
    assert any(_is_file_stream(r) for r in answered)  # what made it go away
    # The run's end never reached it: W&B's finish could not have succeeded.
    assert not any(json.loads(r.body).get("complete") for r in answered if _is_file_stream(r))


def test_the_end_waits_for_wandb_no_longer_than_its_finish_timeout(dropped_run: DroppedRun) -> None:
    # At least the timeout: W&B's finish did wait for the server, it did not fail for another reason.
    assert FINISH_TIMEOUT_S - 0.5 <= dropped_run.waited_after_summary_s < FINISH_TIMEOUT_S + EXIT_SLACK_S


def test_the_lost_server_is_exactly_one_warning_line(dropped_run: DroppedRun) -> None:
    warnings = [line for line in dropped_run.done.stderr.splitlines() if "warning: W&B" in line]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("warning: W&B finish failed (TimeoutError: ")


def test_metrics_jsonl_has_every_step(dropped_run: DroppedRun) -> None:
    lines = dropped_run.lines()  # each one parses
    assert [line["step"] for line in lines if line["kind"] == "train"] == list(range(1, STEPS + 1))
    assert [line["step"] for line in lines if line["kind"] == "eval"] == [STEPS]
    assert len(lines) == STEPS + 1


def test_summary_json_is_complete(dropped_run: DroppedRun) -> None:
    summary = json.loads((dropped_run.out / "summary.json").read_text())
    lines = dropped_run.lines()
    assert summary["complete"] is True and summary["steps"] == STEPS and "stop" not in summary
    assert summary["tokens_trained"] == STEPS * 128 and len(summary["step_times_s"]) == STEPS
    assert summary["total"]["final_loss"] == lines[-2]["loss"]
    assert summary["total"]["final_val_loss"] == lines[-1]["val_loss"]


def test_wandb_sync_from_the_closing_line_uploads_every_step(dropped_run: DroppedRun) -> None:
    last = dropped_run.stdout_lines()[-1]
    run_dir = next((dropped_run.out / "wandb").glob("run-*"))
    assert last == (
        f"W&B: the upload did not finish; the run is kept in {run_dir}; "
        f"upload the rest with: wandb sync --include-online {run_dir}"
    )
    assert dropped_run.sync is not None and dropped_run.sync.returncode == 0, dropped_run.sync
    rows = _history(dropped_run.sync_server.requests)
    lines = dropped_run.lines()
    assert {row["_step"]: row["train/loss"] for row in rows} == {
        line["step"]: line["loss"] for line in lines if line["kind"] == "train"
    }
    assert [row["val/loss"] for row in rows if "val/loss" in row] == [lines[-1]["val_loss"]]


def test_the_api_key_is_nowhere_in_the_output(dropped_run: DroppedRun) -> None:
    assert API_KEY not in dropped_run.done.stdout and API_KEY not in dropped_run.done.stderr
    leaked = [path for path in dropped_run.out.rglob("*") if path.is_file() and API_KEY.encode() in path.read_bytes()]
    assert leaked == []
