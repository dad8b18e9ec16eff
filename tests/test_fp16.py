"""The GPU's fp16 path, run on the CPU by the test-only switch GPT2S_CPU_FP16=1 (training/strategy.py
`_enable_fp16_on_cpu`): autocast in float16, accelerate's grad scaler (torch.amp.GradScaler from get_grad_scaler
for one process and DDP, from get_fsdp2_grad_scaler over FSDP2's DTensor gradients), FSDP2's float16
MixedPrecisionPolicy, the unscale before the float64 grad norm, a step the scaler skips, and the scale carried
through a checkpoint and a resume, under every strategy.

The six runs are the session's shared fp16 runs (tests/conftest.py `fp16_runs`, tests/launch.py FP16_*): one launch
per strategy, 8 steps of the shared runs' 12-step schedule on their data and global batch, each with an fp16
overflow injected at step 3 (GPT2S_FAULT=inf_grad), so that every strategy's scaler meets one. Under sharding the
overflowed element is in one rank's shard alone. Beyond them: fsdp stopped by SIGTERM during step 5 and resumed
(two launches), its checkpoint resumed under one process (one), and one process whose gradients never become
finite (one, on a batch of 2 blocks).
"""

from __future__ import annotations

import json
import math
from itertools import combinations
from pathlib import Path

import pytest
import torch

from tests.launch import (
    FP16_ENV,
    FP16_EXTRA,
    FP16_OVERFLOW,
    FP16_OVERFLOW_STEP,
    FP16_STEPS,
    FP16_STRATEGY_EXTRA,
    copy_cut_at_checkpoint,
    summary,
    train,
    train_lines,
)
from training import registry
from training.checkpoint import checkpoint_path, load_model_from_checkpoint
from training.strategy import CPU_FP16_SWITCH

pytestmark = pytest.mark.multiprocess

# Relative difference allowed between two fp16 runs' losses and grad norms: one fp16 rounding, 2^-11 (4.9e-4; fp16
# keeps 11 significant bits). The strategies round at the same places (autocast's casts of each matmul's inputs)
# and a few different ones (FSDP2 also casts its parameters to fp16 and reduce-scatters gradients in fp16; DDP
# all-reduces in fp32), so only the latter separate them; the loss, a mean over 1,024 tokens, averages most of
# that away. Against fp32, which rounds at none of those places, every fp16 rounding counts: twice as loose,
# 2^-10. Measured on CPU (torch 2.13, accelerate 1.16): at most 8.2e-6 pairwise and 4.5e-6 against fp32 on the
# losses, 2.2e-4 and 9.9e-5 on the grad norms. Without the unscale before the norm, the grad norm is 65,536 times
# fp32's and the losses of steps 2-3 are up to 4.3e-3 from fp32's.
FP16_REL = 2.0**-11
FP32_REL = 2.0**-10
# The strategies of the fp16 runs; fp32's reference is the shared one-process run (its global batch and schedule).
STRATEGIES = ("single", "ddp", "fsdp", "fsdp_zero2", "fsdp_offload", "hsdp")
SHARDED = ("fsdp", "fsdp_zero2", "fsdp_offload", "hsdp")
BEFORE, AFTER = FP16_OVERFLOW_STEP - 1, FP16_OVERFLOW_STEP
SIGTERM_STEP = 5


def _scaler(run: Path, step: int) -> dict:
    return json.loads((checkpoint_path(run, step) / "grad_scaler.json").read_text())


def _initial_scale() -> float:
    return torch.amp.GradScaler("cpu").get_scale()  # accelerate builds the scaler with torch's defaults


def _console(run: Path) -> str:
    return (run.parent / f"{run.name}.console").read_text()


def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


# ------------------------------------------------------------------------------------- every strategy


def test_every_strategy_runs_the_gpus_fp16_path_and_records_the_switch(fp16_runs: dict[str, Path]) -> None:
    for strategy, run in fp16_runs.items():
        s = summary(run)
        assert (s["strategy"], s["precision"], s["requested_precision"]) == (strategy, "fp16", "fp16")
        assert s["precision_switch"] == CPU_FP16_SWITCH == "GPT2S_CPU_FP16=1"
        launch = json.loads((run / "config.json").read_text())["launch"]
        assert launch["effective"]["precision_switch"] == CPU_FP16_SWITCH
        warnings = [line for line in _console(run).splitlines() if line.startswith("warning: fp16 on the CPU")]
        assert len(warnings) == 1 and CPU_FP16_SWITCH in warnings[0]
        # FSDP2 computes with its MixedPrecisionPolicy's float16 parameters; one process and DDP autocast each
        # operation, their parameters stay float32.
        dtype = s["sharding_observed"]["block_param_dtype_in_forward"]
        assert dtype == ("float16" if strategy in SHARDED else "float32"), strategy
        assert (run / "checkpoints" / "step_0000003" / "grad_scaler.json").is_file()


def test_fp16_losses_are_finite_and_agree_across_strategies_and_with_fp32(
    fp16_runs: dict[str, Path], shared_runs
) -> None:
    lines = {strategy: train_lines(run) for strategy, run in fp16_runs.items()}
    fp32 = train_lines(shared_runs["single"])
    for strategy in STRATEGIES:
        assert sorted(lines[strategy]) == list(range(1, FP16_STEPS + 1)), strategy
        assert all(math.isfinite(line["loss"]) for line in lines[strategy].values()), strategy
    worst = max(
        _rel(lines[a][step]["loss"], lines[b][step]["loss"])
        for a, b in combinations(STRATEGIES, 2)
        for step in range(1, FP16_STEPS + 1)
    )
    # Up to the overflow the fp16 runs train as fp32 does; from it on they have skipped a step fp32 took.
    against_fp32 = max(
        _rel(lines[s][step]["loss"], fp32[step]["loss"]) for s in STRATEGIES for step in range(1, AFTER + 1)
    )
    print(f"fp16 losses: largest pairwise relative difference {worst:.2e}, against fp32 {against_fp32:.2e}")
    assert worst <= FP16_REL and against_fp32 <= FP32_REL
    assert any(lines["single"][step]["loss"] != fp32[step]["loss"] for step in (2, 3))  # fp16 really in effect
    assert lines["single"][FP16_STEPS]["loss"] < lines["single"][1]["loss"] - 0.4  # they learn


def test_the_grad_norm_is_measured_after_unscaling(fp16_runs: dict[str, Path], shared_runs) -> None:
    """fp32's norm where the runs have trained alike, and the same norm under every strategy, step by step; the
    scaled norm would be 65,536 times as large."""
    lines = {strategy: train_lines(run) for strategy, run in fp16_runs.items()}
    fp32 = train_lines(shared_runs["single"])
    steps = [step for step in range(1, FP16_STEPS + 1) if step != AFTER]
    worst = max(
        _rel(lines[a][step]["grad_norm"], lines[b][step]["grad_norm"])
        for a, b in combinations(STRATEGIES, 2)
        for step in steps
    )
    against_fp32 = max(
        _rel(lines[s][step]["grad_norm"], fp32[step]["grad_norm"]) for s in STRATEGIES for step in range(1, AFTER)
    )
    print(f"fp16 grad norms: largest pairwise relative difference {worst:.2e}, against fp32 {against_fp32:.2e}")
    assert worst <= FP16_REL and against_fp32 <= FP32_REL


def test_an_overflow_is_skipped_by_every_strategy_and_holds_the_schedule(fp16_runs: dict[str, Path]) -> None:
    initial = _initial_scale()
    for strategy, run in fp16_runs.items():
        s = summary(run)
        assert s["skipped_step_numbers"] == [AFTER] and s["total"]["skipped_steps"] == 1, strategy
        lines = train_lines(run)
        assert [lines[step]["skipped_steps"] for step in (BEFORE, AFTER, AFTER + 1)] == [0, 1, 1], strategy
        assert lines[AFTER]["grad_norm"] is None  # the overflowed norm, non-finite, is written as null
        # The skipped step did not advance the schedule: the step after it runs at its rate.
        assert lines[AFTER + 1]["lr"] == lines[AFTER]["lr"] > lines[BEFORE]["lr"], strategy
        # The scale was halved at the overflow (the checkpoint after it) and stayed.
        assert _scaler(run, AFTER)["scale"] == _scaler(run, 2 * AFTER)["scale"] == initial / 2, strategy
        assert "1 skipped (fp16 overflow)" in _console(run)  # the closing line; the launch ended with exit 0


def test_an_overflow_on_one_ranks_shard_leaves_every_ranks_weights_as_they_were(fp16_runs: dict[str, Path]) -> None:
    """fsdp over 2 processes: the overflowed element is in rank 1's shard only (training/faults.py
    poison_gradient). Every shard of the weights after step 3 equals the one after step 2, and the step after
    trains again; rank 0, which writes the metrics, counted the skip it saw only through the scaler."""
    run = fp16_runs["fsdp"]
    assert summary(run)["world_size"] == 2
    before, after, next_ = (load_model_from_checkpoint(checkpoint_path(run, s)).state_dict() for s in (2, 3, 4))
    assert before.keys() == after.keys()
    for name in before:
        assert torch.equal(after[name], before[name]), name
    assert not all(torch.equal(next_[name], after[name]) for name in after)
    assert _scaler(run, BEFORE)["scale"] == 2 * _scaler(run, AFTER)["scale"] == _initial_scale()


# ------------------------------------------------------------------------------------- resume


@pytest.fixture(scope="module")
def fp16_args(base_args: list[str]) -> list[str]:
    return [*base_args, "--strategy", "fsdp", *FP16_EXTRA, *FP16_STRATEGY_EXTRA["fsdp"]]


@pytest.fixture(scope="module")
def stopped_and_resumed(fp16_runs: dict[str, Path], fp16_args: list[str], tmp_path_factory) -> tuple[Path, str, str]:
    """fsdp's fp16 run again, its overflow at step 3 and a SIGTERM during step 5 (GPT2S_FAULT), then --resume
    (no fault): (run folder, what the stopped launch printed, what the resume printed)."""
    run = tmp_path_factory.mktemp("fp16") / "fsdp-stopped"
    config = registry.get("fsdp").config_file
    faults = {**FP16_ENV, "GPT2S_FAULT": f"{FP16_OVERFLOW},term:step={SIGTERM_STEP}"}
    stopped = train(config, run, fp16_args, check=False, env=faults)
    assert stopped.returncode != 0, stopped.stderr[-3000:]
    resumed = train(config, run, [*fp16_args, "--resume"], env=FP16_ENV)
    return run, stopped.stdout + stopped.stderr, resumed.stdout + resumed.stderr


def test_a_sigterm_stops_fp16_fsdp_and_the_resume_matches_the_uninterrupted_run(
    fp16_runs: dict[str, Path], stopped_and_resumed: tuple[Path, str, str]
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
    assert _scaler(run, SIGTERM_STEP)["scale"] == _initial_scale() / 2
    assert _scaler(run, FP16_STEPS) == _scaler(whole, FP16_STEPS)
    assert summary(run)["skipped_step_numbers"] == [AFTER]  # the skip before the stop, kept through the resume


def test_an_fp16_fsdp_checkpoint_resumes_under_one_process_with_its_scale(
    fp16_runs: dict[str, Path], base_args: list[str], tmp_path: Path
) -> None:
    run = copy_cut_at_checkpoint(fp16_runs["fsdp"], tmp_path / "run", SIGTERM_STEP)
    args = [*base_args, "--strategy", "single", *FP16_EXTRA, "--resume"]
    result = train(registry.get("single").config_file, run, args, env=FP16_ENV)
    assert "written by fsdp on 2 process(es)" in result.stdout + result.stderr
    resumed_from = json.loads((run / "config.json").read_text())["launch"]["resumed_from"]
    assert (resumed_from["strategy"], resumed_from["precision"]) == ("fsdp", "fp16")
    got, want = train_lines(run), train_lines(fp16_runs["single"])
    for step in range(SIGTERM_STEP + 1, FP16_STEPS + 1):
        assert _rel(got[step]["loss"], want[step]["loss"]) <= FP16_REL, step
        assert _rel(got[step]["grad_norm"], want[step]["grad_norm"]) <= FP16_REL, step
    # One process's scaler took the sharded run's scale and growth count: it ends where fsdp's own ended.
    assert _scaler(run, FP16_STEPS) == _scaler(fp16_runs["fsdp"], FP16_STEPS)
    assert _scaler(run, FP16_STEPS)["scale"] == _initial_scale() / 2


# ------------------------------------------------------------------------------------- never finite

# Each overflow halves the scale from 2^16: the 17th skip in a row is the first at scale 1 (training/step.py
# MIN_LOSS_SCALE), the first to count as non-finite; --max_nonfinite_steps 2 stops the run at the 18th.
NEVER_FINITE_LIMIT = 2


def test_max_nonfinite_steps_stops_a_run_whose_gradients_never_become_finite(
    base_args: list[str], tmp_path: Path
) -> None:
    tiny_batch = ["--global_batch_tokens", "128", "--micro_batch_size", "2", "--max_steps", "30"]
    args = [
        *base_args,
        *tiny_batch,
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
    stop = int(math.log2(_initial_scale())) + NEVER_FINITE_LIMIT
    assert result.returncode != 0 and len(errors) == 1, output[-3000:]
    assert f"{NEVER_FINITE_LIMIT} steps in a row (steps {stop - 1}-{stop})" in errors[0]
    s = summary(tmp_path / "run")
    assert (s["stop"]["reason"], s["stop"]["exit_status"], s["steps"]) == ("nonfinite", 4, stop)
    assert s["skipped_step_numbers"] == list(range(1, stop + 1))
