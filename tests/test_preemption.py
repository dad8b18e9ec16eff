"""Pre-emption and crashes with real launches: a signal stops every rank at a step boundary with a checkpoint,
the resumed run equals the uninterrupted one bit for bit (dropout on under FSDP; the single process and DDP at
dropout 0, against the shared runs), also when its newest checkpoint is damaged and the one before is used,
and a killed rank ends the job.

Launches keep W&B at its default (offline without a login), so the W&B side of stopping is exercised too.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import psutil
import pytest

from tests.launch import (
    CONFIGS,
    REPO,
    SHARED_STEPS,
    accelerate_command,
    copy_cut_at_checkpoint,
    launch_env,
    metric_lines,
    rank_process,
    summary,
    train_lines,
    wait_for_step,
)
from training.checkpoints.store import checkpoint_problem, complete_checkpoints, load_model_from_checkpoint

pytestmark = pytest.mark.multiprocess

STEPS = SHARED_STEPS
# The `timeout=` of communicate() and wait_for_step are hang guards (each waits for the launcher's exit or
# a logged step), not claims.
# The signal goes out once this step is in metrics.jsonl: past the first interval checkpoint (step 3), so a
# damaged checkpoint of the stop always has one before it to fall back on.
STOP_WHEN_LOGGED = 4
CHECKPOINT_INTERVAL = 3
# The claim that a signal stops the run promptly, in steps rather than seconds (which a loaded machine
# stretches): every rank finishes the step in flight and stops. The step logged last before the signal is k;
# one more may complete between that read and the signal's arrival, so the run stops after step k + 2 at most.
STEPS_AFTER_SIGNAL = 2
CONFIG = {"single": "single_gpu.yaml", "ddp": "ddp.yaml", "fsdp": "fsdp.yaml"}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("preemption")


# Dropout on in one strategy of two processes: an exact resume must restore every rank's own random state,
# not only the weights (its run also feeds the resume on another process count below). FSDP is that one: its
# set-up (sharding, the wrapped model's initialisation) is the most likely to draw random numbers after the
# restore, which would shift the masks. The single process and DDP run at the shared runs' dropout 0, so
# their shared runs (same flags, a checkpoint every 3 steps as here) are their uninterrupted runs: two launches
# fewer.
DROPOUT = {"single": "0", "ddp": "0", "fsdp": "0.1"}


@pytest.fixture(scope="module")
def args(base_args: list[str]) -> list[str]:
    # The shared runs' flags (tests/conftest.py): a checkpoint every 3 steps, and one when stopped.
    assert base_args[base_args.index("--checkpoint_interval") + 1] == str(CHECKPOINT_INTERVAL)
    return [*base_args, "--no-export_hf"]


def _flags(strategy: str, args: list[str]) -> list[str]:
    return [*args, "--dropout", DROPOUT[strategy]]


def _launch(strategy: str, out: Path, args: list[str], dropout_of: str | None = None) -> psutil.Popen:
    """`strategy` launched on `args` at the DROPOUT of `dropout_of` (by default its own)."""
    flags = _flags(dropout_of or strategy, args)
    command = accelerate_command(CONFIGS / CONFIG[strategy], "train.py", [*flags, "--output_dir", str(out)])
    return psutil.Popen(
        command, cwd=REPO, env=launch_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


@pytest.fixture(scope="module")
def uninterrupted(workdir: Path, args: list[str], shared_runs) -> dict[str, Path]:
    """Each strategy's run to the end on `args` at its DROPOUT: launched here with dropout on, else shared."""
    out = {}
    for strategy in CONFIG:
        if DROPOUT[strategy] == "0":
            out[strategy] = shared_runs[strategy]
            continue
        out[strategy] = workdir / f"{strategy}-whole"
        process = _launch(strategy, out[strategy], args)
        output, _ = process.communicate(timeout=600)
        assert process.returncode == 0, output[-3000:]
    return out


# Who gets which signal: the launcher (what a scheduler's SIGTERM or a Ctrl-C reaches), or one rank only.
TARGETS = {
    "single": ("launcher", signal.SIGTERM),
    "ddp": ("launcher", signal.SIGINT),
    "fsdp": ("rank 1", signal.SIGTERM),
}


@pytest.fixture(scope="module")
def interrupted(workdir: Path, args: list[str]) -> dict[str, tuple[Path, int, float, str]]:
    """Each strategy signalled mid-run: (run dir, launcher exit status, step logged last before the signal,
    output)."""
    out = {}
    for strategy, (target, signum) in TARGETS.items():
        run_dir = workdir / f"{strategy}-stopped"
        process = _launch(strategy, run_dir, args)
        wait_for_step(run_dir, STOP_WHEN_LOGGED, [process])
        victim = process if target == "launcher" else rank_process([process], 1)
        logged = max(train_lines(run_dir))
        victim.send_signal(signum)
        output, _ = process.communicate(timeout=300)
        out[strategy] = (run_dir, process.returncode, logged, output)
    return out


@pytest.mark.parametrize("strategy", list(CONFIG))
def test_a_signal_stops_every_rank_with_a_checkpoint_of_the_last_step(interrupted, strategy: str) -> None:
    run_dir, status, logged, output = interrupted[strategy]
    target, signum = TARGETS[strategy]
    # 128 + the signal from train.py (and from accelerate's launcher when it was signalled itself: 143 for
    # SIGTERM, 130 for SIGINT); torchrun reports workers that stopped on their own with its exit 1.
    assert status == (1 if target == "rank 1" else 128 + signum), output[-3000:]
    s = summary(run_dir)
    assert s["stop"]["reason"] == "signal" and s["stop"]["exit_status"] == 128 + signum and not s["complete"]
    stopped_at = s["steps"]
    assert STOP_WHEN_LOGGED <= logged <= stopped_at <= logged + STEPS_AFTER_SIGNAL < STEPS
    assert sorted(train_lines(run_dir)) == list(range(1, stopped_at + 1))  # the step in flight was logged
    checkpoint = complete_checkpoints(run_dir)[-1]
    assert checkpoint.name == f"step_{stopped_at:07d}" and checkpoint_problem(checkpoint) is None
    # The loop's own state is JSON: resuming unpickles nothing the project wrote.
    assert (checkpoint / "train_state.json").is_file() and not list(checkpoint.glob("custom_checkpoint_*"))
    assert f"stopped by {signal.Signals(signum).name} after step {stopped_at}" in output
    assert list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))


# The file damaged before the resume (one flipped byte, same size): the single process's weights, one rank's
# optimizer shard under FSDP; DDP resumes from its intact newest checkpoint.
DAMAGE = {"single": "model/*.distcp", "ddp": None, "fsdp": "optimizer/*.distcp"}


def _flip_one_byte(file: Path) -> None:
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    file.write_bytes(bytes(data))


def _metrics_steps(run: Path, kind: str) -> list[int]:
    return [line["step"] for line in metric_lines(run, kind)]


def _warnings(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("warning:")]


@pytest.mark.parametrize("strategy", list(CONFIG))
def test_the_resumed_run_equals_the_uninterrupted_one_bit_for_bit(
    interrupted, uninterrupted, args: list[str], tmp_path: Path, strategy: str
) -> None:
    stopped, _, _, first_output = interrupted[strategy]
    # A copy is damaged and resumed: the stopped run stays as the signal left it for the other tests.
    run_dir = shutil.copytree(stopped, tmp_path / "run")
    newest, before = complete_checkpoints(run_dir)[-2:][::-1]
    resumed_from = int(newest.name.removeprefix("step_"))
    if DAMAGE[strategy]:
        damaged = sorted(newest.glob(DAMAGE[strategy]))[-1]
        size = damaged.stat().st_size
        _flip_one_byte(damaged)
        assert damaged.stat().st_size == size
        resumed_from = int(before.name.removeprefix("step_"))
    process = _launch(strategy, run_dir, [*args, "--resume"])
    output, _ = process.communicate(timeout=600)
    assert process.returncode == 0, output[-3000:]
    # The warnings the resume adds to those of the first launch (such as the CPU's fp16 fallback).
    added = [w for w in _warnings(output) if w not in _warnings(first_output)]
    if DAMAGE[strategy]:
        assert len(added) == 1, added
        assert added[0].startswith(f"warning: checkpoint {newest.name} is damaged ({damaged.relative_to(newest)}")
    else:
        assert added == []
    assert summary(run_dir)["complete"] and "stop" not in summary(run_dir)
    # metrics.jsonl was cut back to the checkpoint resumed from: each step once, in order.
    assert _metrics_steps(run_dir, "train") == list(range(1, STEPS + 1))
    assert _metrics_steps(run_dir, "eval") == _metrics_steps(uninterrupted[strategy], "eval")
    got, want = train_lines(run_dir), train_lines(uninterrupted[strategy])
    for step in range(resumed_from + 1, STEPS + 1):
        assert (got[step]["loss"], got[step]["grad_norm"]) == (want[step]["loss"], want[step]["grad_norm"]), step
    epochs = [[e["epoch"] for e in summary(run)["epochs"]] for run in (run_dir, uninterrupted[strategy])]
    assert epochs[0] == epochs[1]


def test_dropout_is_in_effect_in_the_two_process_run_resumed_exactly(uninterrupted, shared_runs) -> None:
    # The shared run of the strategy has the same flags with dropout 0 (and no export, which changes no
    # loss): some loss differs, so the exact resume above restored dropout's random state too.
    strategy = next(s for s in CONFIG if DROPOUT[s] != "0")
    with_dropout, without = train_lines(uninterrupted[strategy]), train_lines(shared_runs[strategy])
    assert sorted(with_dropout) == sorted(without) == list(range(1, STEPS + 1))
    assert any(with_dropout[s]["loss"] != without[s]["loss"] for s in range(1, STEPS + 1))


def test_a_killed_rank_ends_the_job_and_leaves_the_checkpoints_intact(workdir: Path, args: list[str]) -> None:
    run_dir = workdir / "ddp-killed"
    process = _launch("ddp", run_dir, [*args, "--max_steps", "200", "--checkpoint_interval", "2"])
    wait_for_step(run_dir, 5, [process])
    logged = max(train_lines(run_dir))
    rank_process([process], 1).kill()
    output, _ = process.communicate(timeout=300)
    # The surviving rank does not train on alone (200 steps were asked for): the job ends within the step in flight.
    assert process.returncode != 0 and max(train_lines(run_dir)) <= logged + STEPS_AFTER_SIGNAL, output[-3000:]
    checkpoints = complete_checkpoints(run_dir)
    assert checkpoints and all(checkpoint_problem(c) is None for c in checkpoints)
    model = load_model_from_checkpoint(run_dir)  # the newest complete one loads into one process
    assert model.config.n_layer == 2


_NAN_FROM_STEP = """
import model.gpt2 as gpt2

_forward, _calls = gpt2.GPT2.forward, [0]

def forward(self, idx, targets=None):
    logits, loss = _forward(self, idx, targets)
    if self.training and loss is not None:
        _calls[0] += 1
        if _calls[0] > {micro_batches_before}:
            loss = loss * float("nan")
    return logits, loss

gpt2.GPT2.forward = forward
"""


def test_a_streak_of_non_finite_steps_stops_the_run_and_keeps_the_last_good_checkpoint(
    workdir: Path, args: list[str]
) -> None:
    import sys

    hook = workdir / "nan-hook"
    hook.mkdir()
    # The tiny preset accumulates 2 micro-batches per step in one process: steps 5, 6, ... are non-finite.
    (hook / "sitecustomize.py").write_text(_NAN_FROM_STEP.format(micro_batches_before=8))
    env = {**launch_env(), "PYTHONPATH": os.pathsep.join([str(hook), str(REPO)])}  # the hook imports model/
    run_dir = workdir / "nan"
    result = subprocess.run(
        [
            sys.executable,
            "train.py",
            *_flags("single", args),
            "--max_steps",
            "20",
            "--checkpoint_interval",
            "2",
            "--max_nonfinite_steps",
            "3",
            "--output_dir",
            str(run_dir),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 4, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "steps 5-7" in errors[0] and "step 4, is the last good one" in errors[0]
    warnings = [line for line in result.stdout.splitlines() if "non-finite loss or grad norm" in line]
    assert [w.split(":")[1].strip() for w in warnings] == ["step 5", "step 6", "step 7"]
    lines = train_lines(run_dir)
    assert [lines[s]["loss"] for s in (5, 6, 7)] == [None, None, None] and lines[4]["loss"] is not None
    assert [c.name for c in complete_checkpoints(run_dir)][-1] == "step_0000004"  # step 6 was due, not written
    s = summary(run_dir)
    assert s["stop"]["reason"] == "nonfinite" and s["stop"]["exit_status"] == 4 and s["steps"] == 7
    assert json.loads((run_dir / "config.json").read_text())["run"]["max_nonfinite_steps"] == 3


def test_a_resume_on_another_process_count_says_that_dropout_cannot_follow(
    uninterrupted, args: list[str], tmp_path: Path
) -> None:
    """FSDP's sharded checkpoint of two processes (dropout on) resumed by one: no assignment of the two ranks'
    saved random states reproduces one process's masks, so the launch says so once instead of claiming an
    exact continuation."""
    run_dir = copy_cut_at_checkpoint(uninterrupted["fsdp"], tmp_path / "run", 9)
    resume = [*args, "--resume", "--stop_after_steps", "10", "--wandb_mode", "disabled"]
    output, _ = _launch("single", run_dir, resume, dropout_of="fsdp").communicate(timeout=600)
    dropout = [w for w in _warnings(output) if "dropout" in w]
    assert len(dropout) == 1 and "written by 2 process(es), this launch has 1" in dropout[0], output[-3000:]
    assert json.loads((run_dir / "config.json").read_text())["launch"]["resumed_from"]["random_states_exact"] is False
    assert max(train_lines(run_dir)) == 10
