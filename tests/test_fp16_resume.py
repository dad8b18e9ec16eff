"""The GPU's fp16 path on the CPU (GPT2S_CPU_FP16=1, as tests/test_fp16.py), stopped and resumed: fsdp's run
stopped by SIGTERM during step 4 and resumed (two launches) against the shared uninterrupted one, its weights
through the overflow at step 3 that only rank 1's shard held, its checkpoint resumed under one process with the
scale it carries (one launch), and one process whose gradients never become finite (one, on a batch of 2 blocks).
A file of its own, so that it runs beside tests/test_fp16.py on the other worker; it needs the shared fsdp and
single fp16 runs only.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tests.conftest import Fp16Runs
from tests.launch import (
    FP16_ENV,
    FP16_EXTRA,
    FP16_OVERFLOW,
    FP16_STEPS,
    FP16_STOPPED_EXTRA,
    copy_cut_at_checkpoint,
    summary,
    train,
    train_lines,
)
from tests.test_bad_input_ranks import _project_frames
from tests.test_fp16 import AFTER, FP16_REL, initial_scale, rel, scaler_state
from training.checkpoints.store import checkpoint_path, load_model_from_checkpoint
from training.distributed import registry

pytestmark = pytest.mark.multiprocess

SIGTERM_STEP = 4


@pytest.fixture(scope="module")
def stopped_and_resumed(fp16_runs: Fp16Runs, base_args: list[str], tmp_path_factory) -> tuple[Path, str, str]:
    """fsdp's fp16 run again, checkpointing every step, its overflow at step 3 and a SIGTERM during step 4
    (GPT2S_FAULT), then --resume (no fault): (run folder, what the stopped launch printed, what the resume
    printed)."""
    run = tmp_path_factory.mktemp("fp16") / "fsdp-stopped"
    args = [*base_args, "--strategy", "fsdp", *FP16_EXTRA, *FP16_STOPPED_EXTRA]
    config = registry.get("fsdp").config_file
    faults = {**FP16_ENV, "GPT2S_FAULT": f"{FP16_OVERFLOW},term:step={SIGTERM_STEP}"}
    stopped = train(config, run, args, check=False, env=faults)
    assert stopped.returncode != 0, stopped.stderr[-3000:]
    resumed = train(config, run, [*args, "--resume"], env=FP16_ENV)
    return run, stopped.stdout + stopped.stderr, resumed.stdout + resumed.stderr


def test_a_sigterm_stops_fp16_fsdp_and_the_resume_matches_the_uninterrupted_run(
    fp16_runs: Fp16Runs, stopped_and_resumed: tuple[Path, str, str]
) -> None:
    run, stopped, resumed = stopped_and_resumed
    whole = fp16_runs["fsdp"]
    assert "warning: SIGTERM received" in stopped
    assert f"resumed from {checkpoint_path(run, SIGTERM_STEP)} at step {SIGTERM_STEP}" in resumed
    got, want = train_lines(run), train_lines(whole)
    assert sorted(got) == list(range(1, FP16_STEPS + 1))
    for step in range(SIGTERM_STEP + 1, FP16_STEPS + 1):
        for key in ("loss", "grad_norm", "lr"):
            assert got[step][key] == want[step][key], (step, key)
    # The scale the overflow halved came back with the checkpoint and went on as it did without the stop.
    assert scaler_state(run, SIGTERM_STEP)["scale"] == initial_scale() / 2
    assert scaler_state(run, FP16_STEPS) == scaler_state(whole, FP16_STEPS)
    assert summary(run)["skipped_step_numbers"] == [AFTER]  # the skip before the stop, kept through the resume


def test_an_overflow_on_one_ranks_shard_leaves_every_ranks_weights_as_they_were(
    stopped_and_resumed: tuple[Path, str, str],
) -> None:
    """fsdp over 2 processes: the overflowed element is in rank 1's shard only (training/distributed/faults.py
    poison_gradient). Every shard of the weights after step 3 equals the one after step 2, and the step after
    trains again; rank 0, which writes the metrics, counted the skip it saw only through the scaler."""
    run = stopped_and_resumed[0]
    assert summary(run)["world_size"] == 2
    before, after, next_ = (load_model_from_checkpoint(checkpoint_path(run, s)).state_dict() for s in (2, 3, 4))
    assert before.keys() == after.keys()
    for name in before:
        assert torch.equal(after[name], before[name]), name
    assert not all(torch.equal(next_[name], after[name]) for name in after)
    assert scaler_state(run, AFTER - 1)["scale"] == 2 * scaler_state(run, AFTER)["scale"] == initial_scale()


def test_an_fp16_fsdp_checkpoint_resumes_under_one_process_with_its_scale(
    fp16_runs: Fp16Runs, base_args: list[str], tmp_path: Path
) -> None:
    """fsdp's checkpoint of step 3, the one after its overflow, resumed by one process: it trains on as the
    one-process fp16 run did, from the halved scale."""
    run = copy_cut_at_checkpoint(fp16_runs["fsdp"], tmp_path / "run", AFTER)
    args = [*base_args, "--strategy", "single", *FP16_EXTRA, "--resume"]
    result = train(registry.get("single").config_file, run, args, env=FP16_ENV)
    assert "written by fsdp on 2 process(es)" in result.stdout + result.stderr
    resumed_from = json.loads((run / "config.json").read_text())["launch"]["resumed_from"]
    assert (resumed_from["strategy"], resumed_from["precision"]) == ("fsdp", "fp16")
    got, want = train_lines(run), train_lines(fp16_runs["single"])
    for step in range(AFTER + 1, FP16_STEPS + 1):
        assert rel(got[step]["loss"], want[step]["loss"]) <= FP16_REL, step
        assert rel(got[step]["grad_norm"], want[step]["grad_norm"]) <= FP16_REL, step
    # One process's scaler took the sharded run's scale and growth count: it ends where fsdp's own ended.
    assert scaler_state(run, AFTER)["scale"] == initial_scale() / 2
    assert scaler_state(run, FP16_STEPS) == scaler_state(fp16_runs["fsdp"], FP16_STEPS)


# Each overflow halves the scale from 2^16: the 17th skip in a row is the first at scale 1 (training/step.py
# MIN_LOSS_SCALE), the first to count as non-finite; --max_nonfinite_steps 2 stops the run at the 18th.
NEVER_FINITE_LIMIT = 2


def test_max_nonfinite_steps_stops_a_run_whose_gradients_never_become_finite(
    base_args: list[str], tmp_path: Path
) -> None:
    """Under fused AdamW, the GPU's default, which the grad scaler always calls (it skips inside its kernel)."""
    tiny_batch = ["--global_batch_tokens", "128", "--micro_batch_size", "2", "--max_steps", "30"]
    args = [
        *base_args,
        *tiny_batch,
        "--fused_adamw",
        "on",
        "--max_nonfinite_steps",
        str(NEVER_FINITE_LIMIT),
        "--eval_interval",
        "0",
        "--checkpoint_interval",
        "0",
        "--wandb_mode",
        "disabled",
        "--no-export_hf",
    ]
    env = {**FP16_ENV, "GPT2S_FAULT": "nan_grad:step=1:to=30"}
    result = train(registry.get("single").config_file, tmp_path / "run", args, check=False, env=env)
    output = result.stdout + result.stderr
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    stop = int(math.log2(initial_scale())) + NEVER_FINITE_LIMIT
    # train.py's exit 4, as one process's launcher reports it; no traceback from the project's own files.
    assert result.returncode != 0 and "returned non-zero exit status 4." in output, output[-3000:]
    assert _project_frames(output) == [], output[-3000:]
    assert len(errors) == 1, output[-3000:]
    assert f"{NEVER_FINITE_LIMIT} steps in a row (steps {stop - 1}-{stop})" in errors[0]
    s = summary(tmp_path / "run")
    assert (s["stop"]["reason"], s["stop"]["exit_status"], s["steps"]) == ("nonfinite", 4, stop)
    assert s["skipped_step_numbers"] == list(range(1, stop + 1))
    assert "fused AdamW on" in output
