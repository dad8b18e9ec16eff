"""W&B failing in the middle of a real run: one warning, and training and its local files go on.

train.py runs as a user starts it, W&B at its default (`--wandb_mode auto`, offline here: no
credentials). A `sitecustomize.py` first on PYTHONPATH patches wandb itself in that process, so the
failure comes from where a real one would: the 3rd `Run.log` call, `Run.summary.update`, or
`Run.finish`, reached through accelerate's W&B tracker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
STEPS = 6

SITECUSTOMIZE = '''\
"""Written by tests/test_wandb_failures.py: makes one W&B call raise, and records the calls W&B got."""
import importlib.abc
import os
import sys

FAIL = os.environ["TEST_WANDB_FAIL"]  # log | summary | finish
CALLS = os.environ["TEST_WANDB_CALLS"]  # one line per call that reached wandb


def _record(name):
    with open(CALLS, "a") as f:
        f.write(name + "\\n")


def _patch(wandb_run):
    Run, Summary = wandb_run.Run, wandb_run.wandb_summary.Summary
    log, update, finish = Run.log, Summary.update, Run.finish
    logged = []

    def failing_log(self, *args, **kwargs):
        _record("log")
        logged.append(1)
        if FAIL == "log" and len(logged) == 3:
            raise RuntimeError("injected failure of the 3rd log call")
        return log(self, *args, **kwargs)

    def failing_update(self, *args, **kwargs):
        _record("summary")
        if FAIL == "summary":
            raise RuntimeError("injected failure of the summary update")
        return update(self, *args, **kwargs)

    def failing_finish(self, *args, **kwargs):
        _record("finish")
        if FAIL == "finish":
            raise RuntimeError("injected failure of finish")
        return finish(self, *args, **kwargs)

    Run.log, Summary.update, Run.finish = failing_log, failing_update, failing_finish


class _PatchWandbOnImport(importlib.abc.MetaPathFinder):
    """Patches wandb.sdk.wandb_run right after it is imported; other processes are left alone."""

    def find_spec(self, name, path, target=None):
        if name != "wandb.sdk.wandb_run":
            return None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
        else:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


sys.meta_path.insert(0, _PatchWandbOnImport())
'''


@pytest.fixture(scope="module")
def cache_dir(shared_cache: Path) -> Path:
    return shared_cache  # the session's: the corpus tokenized and the CPU peak measured once


class FailedRun:
    def __init__(self, what: str, out: Path, done: subprocess.CompletedProcess[str], calls: list[str]) -> None:
        self.what, self.out, self.done, self.calls = what, out, done, calls

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in (self.out / "metrics.jsonl").read_text().splitlines()]

    def summary(self) -> dict[str, Any]:
        return json.loads((self.out / "summary.json").read_text())


@pytest.fixture(scope="module", params=["log", "summary", "finish"])
def failed_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> FailedRun:
    what = request.param
    root = tmp_path_factory.mktemp(f"wandb_{what}_fails")
    (root / "site").mkdir()
    (root / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    # W&B at its default, with nothing that could make it online or change where it writes.
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(
        NETRC=str(root / "no-netrc"),
        PYTHONUNBUFFERED="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=os.pathsep.join([str(root / "site"), *filter(None, [os.environ.get("PYTHONPATH")])]),
        TEST_WANDB_FAIL=what,
        TEST_WANDB_CALLS=str(root / "calls"),
    )
    out = root / "run"
    # Small batches and no export: what is tested is the W&B path, not the training cost.
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
            str(cache_dir),
            "--block_size",
            "32",
            "--micro_batch_size",
            "4",
            "--global_batch_tokens",
            "128",
            "--no-export_hf",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    calls = (root / "calls").read_text().split() if (root / "calls").exists() else []
    return FailedRun(what, out, done, calls)


def test_the_run_exits_0(failed_run: FailedRun) -> None:
    assert failed_run.done.returncode == 0, failed_run.done.stderr[-3000:]


def test_the_failure_is_exactly_one_warning_line(failed_run: FailedRun) -> None:
    warnings = [line for line in failed_run.done.stderr.splitlines() if "warning: W&B" in line]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"warning: W&B {failed_run.what} failed (RuntimeError: injected failure of ")


def test_wandb_is_not_called_after_it_failed(failed_run: FailedRun) -> None:
    # Every line of metrics.jsonl is logged (6 train lines, the final validation), then the summary
    # is updated and the run finished: up to the failing call, and nothing after it.
    every_line = ["log"] * len(failed_run.lines())
    expected = {
        "log": ["log"] * 3,
        "summary": [*every_line, "summary"],
        "finish": [*every_line, "summary", "finish"],
    }[failed_run.what]
    assert failed_run.calls == expected


def test_metrics_jsonl_has_every_step(failed_run: FailedRun) -> None:
    lines = failed_run.lines()
    assert [line["step"] for line in lines if line["kind"] == "train"] == list(range(1, STEPS + 1))
    assert [line["step"] for line in lines if line["kind"] == "eval"] == [STEPS]


def test_summary_json_is_complete(failed_run: FailedRun) -> None:
    summary = failed_run.summary()
    assert summary["complete"] is True and summary["steps"] == STEPS
    assert summary["tokens_trained"] == STEPS * 128 and len(summary["step_times_s"]) == STEPS
    assert summary["total"]["final_loss"] == failed_run.lines()[-2]["loss"]  # the last train line
    assert summary["total"]["final_val_loss"] == failed_run.lines()[-1]["val_loss"]
