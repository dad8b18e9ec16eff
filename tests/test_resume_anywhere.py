"""A checkpoint written under any strategy and process count resumes under any other and continues exactly;
a launch that cannot continue it exactly is refused in one line and leaves it untouched.

The shared runs (tests/conftest.py: 12 steps, checkpoints at 9 and 12) are the uninterrupted references. Each
pair of the cycle copies the source's run folder as a pre-emption after step 9 leaves it (no later checkpoint,
metrics or summary), resumes it under the target strategy (one launch), and compares steps 10-12, which only
that launch can have written, with the target's own shared run.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.launch import (
    BF16_CHECKPOINT,
    BF16_EXTRA,
    BF16_STEPS,
    SHARED_STEPS,
    copy_cut_at_checkpoint,
    shared_flags,
    summary,
    train,
    train_lines,
    train_on_machines,
)
from training.checkpoints.store import checkpoint_path
from training.distributed import registry
from training.step import lr_factor

pytestmark = pytest.mark.multiprocess

RESUME_AT = 9  # the shared runs' checkpoint before their last
# source -> target, by shared run name: every registry entry is once a source and once a target; one process
# to two (single -> fsdp), two to one (fsdp_offload -> single, with activation checkpointing written), FSDP to
# DDP, and the 3 "machines" x 2 HSDP job to one process and back, on its global batch of 24 blocks (single_24).
CYCLE = (
    ("single", "fsdp"),
    ("fsdp", "ddp"),
    ("ddp", "fsdp_zero2"),
    ("fsdp_zero2", "fsdp_offload"),
    ("fsdp_offload", "single"),
    ("hsdp", "single_24"),
    ("single_24", "hsdp"),
)
# Relative difference allowed on loss and grad norm: what the strategies already agree to (test_strategies.py).
REL = 1e-5
# Flags every resumed launch adds: nothing to upload, nothing to export (the resumed steps are what is checked).
QUIET = ["--wandb_mode", "disabled", "--no-export_hf"]


def _strategy(name: str) -> str:
    return shared_flags(name)[0]


def test_the_cycle_has_every_strategy_once_as_source_and_once_as_target() -> None:
    sources = sorted(_strategy(source) for source, _ in CYCLE if source in registry.names())
    targets = sorted(_strategy(target) for _, target in CYCLE if target in registry.names())
    assert sources == targets == sorted(registry.names())


def resume_under(target: str, run_dir: Path, base_args: list[str], launch_args: list[str] = ()) -> str:
    """Resume `run_dir` under the shared run `target`'s strategy and flags; what the launch printed."""
    strategy, extra = shared_flags(target)
    args = [*base_args, "--strategy", strategy, *extra, *QUIET, "--resume"]
    entry = registry.get(strategy)
    if entry.multi_machine:
        result = train_on_machines(entry.config_file, run_dir, args)
    else:
        result = train(entry.config_file, run_dir, args, launch_args=launch_args)
    return result.stdout + result.stderr


def assert_continues_exactly(resumed: Path, reference: Path, steps: int, rel: float) -> None:
    # The folder was cut at the checkpoint: steps past it are the resumed launch's own, each once.
    got, want = train_lines(resumed), train_lines(reference)
    assert sorted(got) == list(range(1, steps + 1))
    for step in range(RESUME_AT + 1, steps + 1):
        for key in ("loss", "grad_norm", "lr"):  # the rate: the saved schedule's, from the saved base rate
            assert got[step][key] == pytest.approx(want[step][key], rel=rel, abs=0), (step, key)
    assert summary(resumed)["complete"]


@pytest.mark.parametrize(("source", "target"), CYCLE, ids=[f"{s}-to-{t}" for s, t in CYCLE])
def test_a_checkpoint_resumes_exactly_under_another_strategy(
    shared_runs, base_args: list[str], tmp_path: Path, source: str, target: str
) -> None:
    run_dir = copy_cut_at_checkpoint(shared_runs[source], tmp_path / "run", RESUME_AT)
    output = resume_under(target, run_dir, base_args)
    source_world = summary(shared_runs[source])["world_size"]
    target_world = summary(shared_runs[target])["world_size"]
    # The start line names the checkpoint's writer, which the user may no longer remember.
    assert (
        f"resumed from {checkpoint_path(run_dir, RESUME_AT)} at step {RESUME_AT}, written by {_strategy(source)} "
        f"on {source_world} process(es)"
    ) in output
    assert_continues_exactly(run_dir, shared_runs[target], SHARED_STEPS, REL)
    launch = json.loads((run_dir / "config.json").read_text())["launch"]
    assert launch["effective"]["strategy"] == _strategy(target)
    assert launch["resumed_from"] == {
        "step": RESUME_AT,
        "strategy": _strategy(source),
        "num_processes": source_world,
        "precision": "fp32",
        "random_states_exact": source_world == target_world,
    }


def test_a_bf16_fsdp_checkpoint_resumes_bit_for_bit(bf16_runs, base_args: list[str], tmp_path: Path) -> None:
    assert BF16_CHECKPOINT == RESUME_AT
    run_dir = copy_cut_at_checkpoint(bf16_runs["fsdp"], tmp_path / "run", RESUME_AT)
    args = [*base_args, "--strategy", "fsdp", *BF16_EXTRA, *QUIET, "--resume"]
    train(registry.get("fsdp").config_file, run_dir, args, launch_args=["--mixed_precision", "bf16"])
    assert_continues_exactly(run_dir, bf16_runs["fsdp"], BF16_STEPS, rel=0)
    assert json.loads((run_dir / "config.json").read_text())["launch"]["resumed_from"]["precision"] == "bf16"


def _folder_digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


def test_a_resume_that_cannot_be_exact_is_refused_and_touches_nothing(
    shared_runs, base_args: list[str], tmp_path: Path
) -> None:
    """Two processes, another model, global batch and learning rate: one line naming each, the folder unchanged."""
    run_dir = copy_cut_at_checkpoint(shared_runs["ddp"], tmp_path / "run", SHARED_STEPS)
    before = _folder_digest(run_dir)
    changed = ["--n_layer", "3", "--global_batch_tokens", "2048", "--lr", "0.01"]
    args = [*base_args, "--strategy", "ddp", *QUIET, "--resume", *changed]
    result = train(registry.get("ddp").config_file, run_dir, args, check=False)
    output = result.stdout + result.stderr
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert result.returncode != 0 and len(errors) == 1, output[-3000:]
    assert "(exitcode: 2)" in output  # train.py's bad-input status, as torchrun reports its processes
    assert "cannot be continued exactly" in errors[0]
    assert "model n_layer 2 saved, 3 requested" in errors[0]
    assert "global batch 1024 tokens saved, 2048 requested" in errors[0]
    assert "learning rate (--lr) 0.001 saved, 0.01 requested" in errors[0]
    assert _folder_digest(run_dir) == before


def test_a_longer_schedule_resumes_with_one_warning_and_the_longer_schedule(
    shared_runs, base_args: list[str], tmp_path: Path
) -> None:
    """The finished single run trained on to step 14: the steps after the checkpoint follow the 14-step decay,
    said in one warning line and recorded in config.json."""
    run_dir = copy_cut_at_checkpoint(shared_runs["single"], tmp_path / "run", SHARED_STEPS)
    args = [*base_args, "--strategy", "single", *QUIET, "--resume", "--max_steps", str(SHARED_STEPS + 2)]
    result = train(registry.get("single").config_file, run_dir, args)
    output = result.stdout + result.stderr
    warnings = [line for line in output.splitlines() if line.startswith("warning: --resume")]
    assert len(warnings) == 1 and "12 steps saved, 14 requested): from step 13 on" in warnings[0], output[-3000:]
    resumed = json.loads((run_dir / "config.json").read_text())["launch"]["resumed_from"]
    assert (resumed["saved_total_steps"], resumed["schedule_changed_from_step"]) == (SHARED_STEPS, SHARED_STEPS + 1)
    got = train_lines(run_dir)
    assert sorted(got) == list(range(1, SHARED_STEPS + 3))
    optim = json.loads((run_dir / "config.json").read_text())["optim"]
    for step in (SHARED_STEPS + 1, SHARED_STEPS + 2):  # step n is taken after n - 1 steps
        factor = lr_factor(step - 1, optim["warmup_steps"], SHARED_STEPS + 2, optim["min_lr_ratio"])
        assert got[step]["lr"] == pytest.approx(optim["lr"] * factor, rel=1e-12)
