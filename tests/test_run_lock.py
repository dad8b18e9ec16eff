"""One run per output folder at a time: OUTPUT_DIR/.lock, in-process and with real launches.

A DDP run holds the folder; a second launch into it (plain, --overwrite, --resume) is refused with one
`error:` line and exit status 2 while the first goes on untouched; a lock left by a killed run is taken
over with one `warning:` line.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.launch import CONFIGS, REPO, accelerate_command, launch_env, metric_lines, run, write_news_csv
from training.config import RunError
from training.run_folder import LOCK_FILE, acquire_run_lock, lock_holder

STOP_DEADLINE_S = 120  # from SIGTERM to the first run's exit (its checkpoint included)


# ---------------------------------------------------------------------------------------------
# The lock functions, in this process


def test_a_held_lock_refuses_a_second_taker_and_names_the_holder(tmp_path: Path) -> None:
    lock, left = acquire_run_lock(tmp_path)
    assert left is None and (tmp_path / LOCK_FILE).read_text().strip() == lock_holder()
    with pytest.raises(RunError, match=f"in use by a running training run \\({lock_holder()}\\)"):
        acquire_run_lock(tmp_path)  # flock is per open file: a second open conflicts even in one process
    lock.release()
    assert (tmp_path / LOCK_FILE).read_text() == ""  # released: no holder named, the file kept
    again, left = acquire_run_lock(tmp_path)
    assert left is None
    again.release()


def test_a_lock_naming_a_gone_holder_is_taken_over(tmp_path: Path) -> None:
    (tmp_path / LOCK_FILE).write_text("pid 99999999 on elsewhere\n")
    lock, left = acquire_run_lock(tmp_path / ".")
    assert left == "pid 99999999 on elsewhere"
    assert (tmp_path / LOCK_FILE).read_text().strip() == lock_holder()
    lock.release()


# ---------------------------------------------------------------------------------------------
# Real launches


@pytest.fixture(scope="module")
def args(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path) -> list[str]:
    workdir = tmp_path_factory.mktemp("run_lock")
    corpus = workdir / "news.csv"
    write_news_csv(corpus, articles=40, words=200)
    return [
        "--preset",
        "tiny",
        "--data",
        str(corpus),
        "--cache_dir",
        str(shared_cache),  # the session's: the corpus tokenized and the CPU peak measured once
        "--wandb_mode",
        "disabled",
        "--log_interval",
        "1",
        "--no-export_hf",
    ]


def _steps(out: Path) -> list[int]:
    return [line["step"] for line in metric_lines(out, "train")]


def _wait_for_metrics(out: Path, process: psutil.Popen, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the first run ended early:\n{process.stdout.read()[-3000:]}")
        if (out / "metrics.jsonl").exists() and _steps(out):
            return
        time.sleep(0.2)
    raise AssertionError(f"no metrics line in {timeout_s} s")


def _refused(command: list[str], out: Path) -> None:
    result = run(command, check=False)
    output = result.stdout + result.stderr
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert result.returncode != 0 and len(errors) == 1, output[-3000:]
    assert errors[0].startswith(f"error: {out} is in use by a running training run (pid "), errors[0]


@pytest.mark.multiprocess
def test_a_second_launch_into_a_running_folder_is_refused(args: list[str], tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = psutil.Popen(
        accelerate_command(CONFIGS / "ddp.yaml", "train.py", [*args, "--max_steps", "400", "--output_dir", str(out)]),
        cwd=REPO,
        env=launch_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait_for_metrics(out, first)
        config_before = (out / "config.json").read_text()
        # The same launch (two processes), and one process with each flag that touches a run's files.
        _refused(accelerate_command(CONFIGS / "ddp.yaml", "train.py", [*args, "--output_dir", str(out)]), out)
        for flag in ("--overwrite", "--resume"):
            result = run([sys.executable, "train.py", *args, flag, "--output_dir", str(out)], check=False)
            assert result.returncode == 2, result.stderr[-2000:]
            assert [line for line in result.stderr.splitlines() if line.startswith(("error:", "warning:"))] == [
                f"error: {out} is in use by a running training run ({(out / LOCK_FILE).read_text().strip()}); "
                "wait for it to end or choose another --output_dir"
            ]
        assert (out / "config.json").read_text() == config_before
        first.send_signal(signal.SIGTERM)  # ends it at a step boundary, with a checkpoint of that step
        output, _ = first.communicate(timeout=STOP_DEADLINE_S)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 143, output[-3000:]
    steps = _steps(out)
    assert steps == list(range(1, len(steps) + 1)), steps  # each step once, in order: one writer
    assert (out / LOCK_FILE).read_text() == ""  # it let go at exit


@pytest.mark.multiprocess
def test_a_lock_left_by_a_killed_run_is_taken_over(args: list[str], tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_FILE).write_text("pid 99999999 on gone-host\n")
    result = run([sys.executable, "train.py", *args, "--max_steps", "2", "--output_dir", str(out)])
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:") and LOCK_FILE in line]
    assert warnings == [
        f"warning: {out / LOCK_FILE} names pid 99999999 on gone-host, which no longer holds it "
        "(a killed run?); taking the folder over"
    ], result.stderr[-2000:]
    assert _steps(out) == [1, 2] and (out / LOCK_FILE).read_text() == ""
