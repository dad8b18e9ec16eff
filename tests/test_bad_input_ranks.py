"""Bad input under the README's two-process launches: the same one `error:` line as one process, no traceback
from the project's processes, a non-zero exit.

What torchrun (under `accelerate launch`) adds when its processes end non-zero, and this test tolerates:
its log lines (`E... failed (exitcode: 2) ...`, `W... Sending process N closing signal SIGTERM`), one
traceback of the launcher itself, every frame of it in accelerate's and torch's files, ending in
`ChildFailedError`, and its `train.py FAILED` report of each process's exit code. docs/design/faults.md says so.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.launch import REPO, run, train, write_news_csv
from training.config import OptimConfig, RunError
from training.geometry import batch_geometry

pytestmark = pytest.mark.multiprocess

_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+')


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bad_input") / "news.csv"
    write_news_csv(path, articles=20, words=100)
    return path


def _batch_message(world_size: int) -> str:
    """What the batch rule says for --global_batch_tokens 1000 with the tiny preset's 8 x 64 micro-batch."""
    try:
        batch_geometry(OptimConfig(micro_batch_size=8, global_batch_tokens=1000), 64, world_size)
    except RunError as exc:
        return f"error: {exc}"
    raise AssertionError("1000 tokens should not divide")


def _cases(corpus: Path, tmp: Path, cache: Path) -> dict[str, list[str]]:
    base = ["--preset", "tiny", "--wandb_mode", "disabled", "--cache_dir", str(cache)]
    return {
        "missing data": [*base, "--data", str(tmp / "no_such.csv")],
        "batch does not divide": [*base, "--data", str(corpus), "--global_batch_tokens", "1000"],
        "block too long": [*base, "--data", str(corpus), "--block_size", "100000"],
    }


def _single_process_line(args: list[str], out: Path) -> str:
    result = run([sys.executable, "train.py", *args, "--output_dir", str(out)], check=False)
    assert result.returncode == 2, result.stderr[-2000:]
    [line] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    return line


def _project_frames(output: str) -> list[str]:
    """Traceback frames in the project's own files (train.py, training/, data/, model/)."""
    frames = [m.group(1) for m in map(_FRAME.match, output.splitlines()) if m]
    return [
        f for f in frames if Path(f).is_absolute() and Path(f).is_relative_to(REPO) and ".venv" not in Path(f).parts
    ]


# Every case under DDP; under FSDP the one whose rule counts the processes (the failure path before the process
# group exists is the same code for every strategy, so one FSDP case shows the FSDP launch reaches it).
@pytest.mark.parametrize(
    ("config", "case"),
    [
        ("ddp.yaml", "missing data"),
        ("ddp.yaml", "batch does not divide"),
        ("ddp.yaml", "block too long"),
        ("fsdp.yaml", "batch does not divide"),
    ],
)
def test_bad_input_is_one_line_under_two_processes(
    config: str, case: str, corpus: Path, tmp_path: Path, shared_cache: Path
) -> None:
    args = _cases(corpus, tmp_path, shared_cache)[case]
    result = train(config, tmp_path / "out", args, check=False)
    output = result.stdout + result.stderr
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert result.returncode != 0
    assert len(errors) == 1, output[-4000:]
    if case == "batch does not divide":  # the rule counts the processes: compare with the two-process message
        assert errors[0] == _batch_message(2)
    else:
        assert errors[0] == _single_process_line(args, tmp_path / "single")
    assert _project_frames(output) == [], output[-4000:]
    assert "Connection closed by peer" not in output and "gloo" not in output.lower()
    tracebacks = output.count("Traceback (most recent call last)")
    assert tracebacks <= 1, output[-4000:]
    if tracebacks:  # the launcher's own, for a process that ended non-zero
        assert "ChildFailedError" in output.split("Traceback (most recent call last)")[1]
    assert "SIGABRT" not in output and "terminate called" not in output, output[-3000:]
    assert re.search(r"exitcode\s+: 2 ", output), output[-3000:]  # a process ended with the status train.py gives
