"""Every command ends as a Unix tool does when its reader goes away (`... | head -1`): status 0, nothing on stderr."""

from __future__ import annotations

import subprocess
import sys

import pytest

# More than a pipe's buffer (64 KiB on Linux), so the writer surely meets the closed pipe.
FLOOD = "from training.cli import run_main; run_main(lambda: print('a line of output\\n' * 100_000) or 0)"


def _first_line_then_close(argv: list[str]) -> tuple[str, int, str]:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()
    status = proc.wait(timeout=120)
    return first, status, proc.stderr.read()


@pytest.mark.parametrize(
    "argv",
    [
        [sys.executable, "-c", FLOOD],
        [sys.executable, "-m", "planner", "--sweep", "--gpu", "T4", "--num_gpus", "2"],
    ],
    ids=["flood", "planner-sweep"],
)
def test_a_closed_pipe_ends_the_command_quietly_with_status_0(argv: list[str]) -> None:
    first, status, stderr = _first_line_then_close(argv)
    assert first.strip()
    assert (status, stderr) == (0, "")


def test_without_run_main_the_same_flood_fails_so_the_test_can_tell() -> None:
    bare = "print('a line of output\\n' * 100_000)"
    _, status, stderr = _first_line_then_close([sys.executable, "-c", bare])
    assert status != 0 and "BrokenPipeError" in stderr
