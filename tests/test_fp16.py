"""The GPU's fp16 path, run on the CPU by the test-only switch GPT2S_CPU_FP16=1 (training/distributed/strategy.py
`_enable_fp16_on_cpu`): autocast in float16, accelerate's grad scaler (torch.amp.GradScaler from get_grad_scaler
for one process and DDP, from get_fsdp2_grad_scaler over FSDP2's DTensor gradients), FSDP2's float16
MixedPrecisionPolicy, the unscale before the float64 grad norm and a step the scaler skips, under every strategy.

The six runs are the session's shared fp16 runs (tests/conftest.py `fp16_runs`, tests/launch.py FP16_*): one launch
per strategy, 6 steps of the shared runs' 12-step schedule on their data and global batch, each with an fp16
overflow injected (GPT2S_FAULT=inf_grad), at step 3, ddp's at step 6, so that every strategy's scaler meets one
and ddp trains every step fp32 does. Under sharding the overflowed element is in one rank's shard alone. The
resume of an fp16 run, and a run whose gradients never become finite, are tests/test_fp16_resume.py's.
"""

from __future__ import annotations

import json
import math
from itertools import combinations
from pathlib import Path

import pytest
import torch

from tests.conftest import Fp16Runs
from tests.launch import FP16_OVERFLOW_STEP, FP16_STEPS, fp16_overflow_step, summary, train_lines
from training.checkpoints.store import checkpoint_path
from training.distributed.strategy import CPU_FP16_SWITCH

pytestmark = pytest.mark.multiprocess

# Relative difference allowed between two fp16 runs' losses and grad norms: one fp16 rounding, 2^-11 (4.9e-4; fp16
# keeps 11 significant bits). The strategies round in float16 at the matmuls (one process and DDP by autocast's
# casts of their inputs, FSDP2 by its float16 parameters, without autocast) and at a few places of their own
# (FSDP2 reduce-scatters gradients in fp16, fsdp_zero2 also keeps them in fp16 between its 2 micro-batches; DDP
# all-reduces in fp32); the loss, a mean over 1,024 tokens, averages most of that away. Against fp32, which rounds
# at none of those places, every fp16 rounding counts: twice as loose, 2^-10. Measured on CPU (torch 2.13,
# accelerate 1.16): at most 5.4e-6 pairwise and 4.5e-6 against fp32 on the losses (ddp over all 6 steps: 8.0e-7),
# 2.1e-4 and 9.9e-5 on the grad norms (ddp: 4.3e-5). Without the unscale before the norm, the grad norm is 65,536
# times fp32's.
FP16_REL = 2.0**-11
FP32_REL = 2.0**-10
# The strategies of the fp16 runs; fp32's reference is the shared one-process run (its global batch and schedule).
STRATEGIES = ("single", "ddp", "fsdp", "fsdp_zero2", "fsdp_offload", "hsdp")
SHARDED = ("fsdp", "fsdp_zero2", "fsdp_offload", "hsdp")
AFTER = FP16_OVERFLOW_STEP
# How far ddp's loss falls over its 6 steps at least (they learn; 0.51 measured).
LEARNED = 0.3
# The runs that overflow at step 3, which train alike throughout, and the one that takes every step fp32 takes.
EARLY = tuple(s for s in STRATEGIES if fp16_overflow_step(s) == AFTER)
(LATE,) = (s for s in STRATEGIES if fp16_overflow_step(s) == FP16_STEPS)


def scaler_state(run: Path, step: int) -> dict:
    return json.loads((checkpoint_path(run, step) / "grad_scaler.json").read_text())


def initial_scale() -> float:
    return torch.amp.GradScaler("cpu").get_scale()  # accelerate builds the scaler with torch's defaults


def console(run: Path) -> str:
    return (run.parent / f"{run.name}.console").read_text()


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


def _pairs_that_trained_alike(step: int) -> list[tuple[str, str]]:
    """Pairs of strategies whose runs had taken the same steps before `step`: all up to the overflow at step 3,
    after it those that skipped it."""
    return list(combinations(STRATEGIES if step <= AFTER else EARLY, 2))


# ------------------------------------------------------------------------------------- every strategy


def test_every_strategy_runs_the_gpus_fp16_path_and_records_the_switch(fp16_runs: Fp16Runs) -> None:
    for strategy, run in fp16_runs.items():
        s = summary(run)
        assert (s["strategy"], s["precision"], s["requested_precision"]) == (strategy, "fp16", "fp16")
        assert s["precision_switch"] == CPU_FP16_SWITCH == "GPT2S_CPU_FP16=1"
        launch = json.loads((run / "config.json").read_text())["launch"]
        assert launch["effective"]["precision_switch"] == CPU_FP16_SWITCH
        warnings = [line for line in console(run).splitlines() if line.startswith("warning: fp16 on the CPU")]
        assert len(warnings) == 1 and CPU_FP16_SWITCH in warnings[0]
        # One process and DDP run their blocks under autocast in float16, their parameters float32 (autocast casts
        # each operation's inputs). FSDP2 computes with its MixedPrecisionPolicy's float16 parameters and no
        # autocast: accelerate 1.16 wraps the forward in autocast in prepare_model, which its FSDP2 preparation
        # does not call, on a GPU as here.
        seen = s["sharding_observed"]
        assert seen["autocast_dtype_in_forward"] == (None if strategy in SHARDED else "float16"), strategy
        assert seen["block_param_dtype_in_forward"] == ("float16" if strategy in SHARDED else "float32"), strategy
        assert (run / "checkpoints" / "step_0000003" / "grad_scaler.json").is_file()


def test_fp16_losses_are_finite_and_agree_across_strategies_and_with_fp32(fp16_runs: Fp16Runs, shared_runs) -> None:
    lines = {strategy: train_lines(run) for strategy, run in fp16_runs.items()}
    fp32 = train_lines(shared_runs["single"])
    steps = range(1, FP16_STEPS + 1)
    for strategy in STRATEGIES:
        assert sorted(lines[strategy]) == list(steps), strategy
        assert all(math.isfinite(line["loss"]) for line in lines[strategy].values()), strategy
    worst = max(
        rel(lines[a][step]["loss"], lines[b][step]["loss"])
        for step in steps
        for a, b in _pairs_that_trained_alike(step)
    )
    # ddp trains every step fp32 does (its overflow, at the last step, comes after its last loss): all 6 losses.
    # The others agree with fp32 up to their overflow; from it on they have skipped a step fp32 took.
    late = max(rel(lines[LATE][step]["loss"], fp32[step]["loss"]) for step in steps)
    early = max(rel(lines[s][step]["loss"], fp32[step]["loss"]) for s in EARLY for step in range(1, AFTER + 1))
    fell = lines[LATE][1]["loss"] - lines[LATE][FP16_STEPS]["loss"]
    print(f"fp16 losses: largest pairwise relative difference {worst:.2e}, against fp32 {early:.2e} (ddp: {late:.2e})")
    print(f"ddp's fp16 loss fell by {fell:.3f} over {FP16_STEPS} steps")
    assert worst <= FP16_REL and max(early, late) <= FP32_REL
    assert any(lines["single"][step]["loss"] != fp32[step]["loss"] for step in (2, 3))  # fp16 really in effect
    assert fell > LEARNED


def test_the_grad_norm_is_measured_after_unscaling(fp16_runs: Fp16Runs, shared_runs) -> None:
    """fp32's norm where the runs have trained alike, and the same norm under every strategy, step by step; the
    scaled norm would be 65,536 times as large."""
    lines = {strategy: train_lines(run) for strategy, run in fp16_runs.items()}
    fp32 = train_lines(shared_runs["single"])
    finite = [step for step in range(1, FP16_STEPS + 1) if step != AFTER]
    worst = max(
        rel(lines[a][step]["grad_norm"], lines[b][step]["grad_norm"])
        for step in finite
        for a, b in _pairs_that_trained_alike(step)
    )
    late = max(rel(lines[LATE][step]["grad_norm"], fp32[step]["grad_norm"]) for step in range(1, FP16_STEPS))
    early = max(rel(lines[s][step]["grad_norm"], fp32[step]["grad_norm"]) for s in EARLY for step in range(1, AFTER))
    print(
        f"fp16 grad norms: largest pairwise relative difference {worst:.2e}, against fp32 {early:.2e} (ddp: {late:.2e})"
    )
    assert worst <= FP16_REL and max(early, late) <= FP32_REL


def test_an_overflow_is_skipped_by_every_strategy_and_holds_the_schedule(fp16_runs: Fp16Runs) -> None:
    initial = initial_scale()
    for strategy, run in fp16_runs.items():
        at = fp16_overflow_step(strategy)
        s = summary(run)
        assert s["skipped_step_numbers"] == [at] and s["total"]["skipped_steps"] == 1, strategy
        lines = train_lines(run)
        assert [lines[step]["skipped_steps"] for step in (at - 1, at)] == [0, 1], strategy
        assert lines[at]["grad_norm"] is None  # the overflowed norm, non-finite, is written as null
        # The scale was halved at the overflow (the checkpoint after it) and stayed.
        assert scaler_state(run, AFTER)["scale"] == (initial / 2 if at == AFTER else initial), strategy
        assert scaler_state(run, FP16_STEPS)["scale"] == initial / 2, strategy
        assert "1 skipped (fp16 overflow)" in console(run)  # the closing line; the launch ended with exit 0
        if at < FP16_STEPS:  # the skipped step did not advance the schedule: the step after it runs at its rate
            assert lines[at + 1]["lr"] == lines[at]["lr"] > lines[at - 1]["lr"], strategy
            assert lines[at + 1]["skipped_steps"] == 1, strategy
