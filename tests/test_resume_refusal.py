"""What a resume must match to continue exactly, the one-line refusal naming what differs, and the one change
accepted with a warning, a longer schedule (no launch)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from model import GPT2Config
from training.checkpoints.resume import (
    Optimisation,
    ResumeIdentity,
    follow_schedule,
    origin_record,
    refusal,
    resume_warnings,
    resumed_from,
    schedule_change,
)
from training.checkpoints.store import COMPLETE_MARKER, FORMAT, ORIGIN, checkpoint_path
from training.step import lr_factor

OPTIMISATION = Optimisation(
    lr=1e-3,
    weight_decay=0.1,
    beta1=0.9,
    beta2=0.95,
    eps=1e-8,
    grad_clip=1.0,
    warmup_steps=5,
    min_lr_ratio=0.1,
    total_steps=12,
)
SAVED = ResumeIdentity(
    model_config=GPT2Config.from_preset("tiny").to_dict(),
    global_batch_tokens=1024,
    seed=3,
    data_key="0123456789abcdef0123",
    block_size=64,
    tokenizer=None,
    precision="fp32",
    optimisation=OPTIMISATION,
)


def checkpoint(out: Path, origin: dict | None) -> Path:
    """A complete checkpoint folder as the resume check reads it: origin.json (None: the earlier layout)."""
    path = checkpoint_path(out, 9)
    path.mkdir(parents=True)
    (path / COMPLETE_MARKER).write_text(json.dumps({"step": 9, "files": {}}))
    if origin is not None:
        (path / ORIGIN).write_text(json.dumps({"format": FORMAT, **origin}))
    return path


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    return checkpoint(tmp_path, origin_record("fsdp", 2, SAVED))


def test_the_same_identity_resumes_under_any_strategy(saved: Path) -> None:
    assert refusal(saved, SAVED) is None
    record = resumed_from(saved)
    assert (record.step, record.strategy, record.num_processes, record.precision) == (9, "fsdp", 2, "fp32")
    assert resume_warnings(saved, OPTIMISATION) == ([], None)
    assert "saved_total_steps" not in record.to_dict()  # the schedule is the saved one


def test_the_attention_kernel_is_not_a_reason_to_refuse(saved: Path) -> None:
    math_attention = {**SAVED.model_config, "attn_impl": "math"}
    assert refusal(saved, dataclasses.replace(SAVED, model_config=math_attention)) is None


REQUESTS = {
    "model": (
        dataclasses.replace(SAVED, model_config={**SAVED.model_config, "n_layer": 4}),
        "model n_layer 2 saved, 4 requested",
    ),
    "dropout": (
        dataclasses.replace(SAVED, model_config={**SAVED.model_config, "resid_pdrop": 0.1}),
        "model resid_pdrop 0.0 saved, 0.1 requested",
    ),
    "global batch": (
        dataclasses.replace(SAVED, global_batch_tokens=2048),
        "global batch 1024 tokens saved, 2048 requested",
    ),
    "seed": (dataclasses.replace(SAVED, seed=4), "seed (it orders the data) 3 saved, 4 requested"),
    "corpus": (
        dataclasses.replace(SAVED, data_key="fedcba9876543210fedc"),
        "data: another corpus or split (content hash 0123456789ab saved, fedcba987654 requested)",
    ),
    "block size": (
        dataclasses.replace(SAVED, data_key="fedcba9876543210fedc", block_size=128),
        "data (block size 64 saved, 128 requested, content hash",
    ),
    "tokenizer": (
        dataclasses.replace(SAVED, data_key="fedcba9876543210fedc", tokenizer="/my/tokenizer"),
        "data (tokenizer None saved, /my/tokenizer requested, content hash",
    ),
    "precision": (dataclasses.replace(SAVED, precision="bf16"), "precision fp32 saved, bf16 requested"),
}


def _optimised(**changed: float) -> ResumeIdentity:
    return dataclasses.replace(SAVED, optimisation=dataclasses.replace(OPTIMISATION, **changed))


# Every setting of the optimisation but the schedule's length, changed: refused, named with its flag.
REQUESTS.update(
    {
        "learning rate": (_optimised(lr=0.01), "learning rate (--lr) 0.001 saved, 0.01 requested"),
        "weight decay": (_optimised(weight_decay=0.0), "weight decay (--weight_decay) 0.1 saved, 0.0 requested"),
        "beta1": (_optimised(beta1=0.8), "AdamW beta1 (--beta1) 0.9 saved, 0.8 requested"),
        "beta2": (_optimised(beta2=0.99), "AdamW beta2 (--beta2) 0.95 saved, 0.99 requested"),
        "eps": (_optimised(eps=1e-6), "AdamW epsilon (--eps) 1e-08 saved, 1e-06 requested"),
        "grad clip": (_optimised(grad_clip=0.0), "gradient clipping (--grad_clip) 1.0 saved, 0.0 requested"),
        "warm-up": (_optimised(warmup_steps=2), "warm-up (--warmup_steps) 5 saved, 2 requested"),
        "min lr": (_optimised(min_lr_ratio=0.0), "minimum learning rate ratio (--min_lr_ratio) 0.1 saved, 0.0"),
        "shorter schedule": (
            _optimised(total_steps=10),
            "schedule length (--max_steps, or --epochs in steps) 12 steps saved, 10 requested (a shorter",
        ),
        "shorter than the checkpoint": (
            _optimised(total_steps=8),
            "12 steps saved, 8 requested; the checkpoint is at step 9 (",
        ),
    }
)


def test_every_optimisation_setting_is_compared() -> None:
    changed = {
        f.name
        for requested, _ in REQUESTS.values()
        for f in dataclasses.fields(Optimisation)
        if getattr(requested.optimisation, f.name) != getattr(OPTIMISATION, f.name)
    }
    assert changed == {f.name for f in dataclasses.fields(Optimisation)}


@pytest.mark.parametrize("what", list(REQUESTS))
def test_what_differs_is_refused_in_one_line_naming_saved_and_requested(saved: Path, what: str) -> None:
    requested, named = REQUESTS[what]
    line = refusal(saved, requested)
    assert line is not None and "\n" not in line
    assert line.startswith("--resume: step_0000009 cannot be continued exactly by this launch: ")
    differences, advice = line.split(": ", 2)[2].rsplit("; ", 1)  # only what was changed is named
    assert named in differences and advice.startswith("resume with the saved settings")
    assert ";" not in differences.replace("; the checkpoint is at step", "")


def test_every_difference_is_named(saved: Path) -> None:
    requested = dataclasses.replace(SAVED, global_batch_tokens=2048, seed=4)
    line = refusal(saved, requested)
    assert "global batch 1024 tokens saved, 2048 requested; seed" in line


def test_a_checkpoint_of_the_earlier_layout_is_refused(tmp_path: Path) -> None:
    line = refusal(checkpoint(tmp_path, None), SAVED)
    assert line is not None and "\n" not in line and "earlier version of this project" in line


def test_a_longer_schedule_is_accepted_and_said_from_the_first_step_it_changes(saved: Path) -> None:
    longer = _optimised(total_steps=20)
    assert refusal(saved, longer) is None
    (line,), change = resume_warnings(saved, longer.optimisation)
    assert (change.saved_total_steps, change.total_steps, change.from_step) == (12, 20, 10)
    # Step 10 is taken after 9 steps: past the warm-up of 5, into each schedule's cosine decay.
    assert change.saved_lr == pytest.approx(1e-3 * lr_factor(9, 5, 12, 0.1))
    assert change.lr == pytest.approx(1e-3 * lr_factor(9, 5, 20, 0.1)) and change.lr > change.saved_lr
    assert line.startswith("warning: --resume with a longer schedule (12 steps saved, 20 requested): from step 10 on")
    assert "\n" not in line and "config.json" in line
    record = resumed_from(saved, change).to_dict()
    assert (record["saved_total_steps"], record["schedule_changed_from_step"]) == (12, 10)


@pytest.mark.parametrize(
    ("warmup", "step", "min_ratio", "first"),
    [
        (5, 9, 0.1, 10),  # past the warm-up: the next step
        (5, 2, 0.1, 7),  # in the warm-up: the first step of the decay (step 6 has factor 1 under any length)
        (0, 0, 0.1, 2),  # no warm-up, from the start: step 1 has factor 1 under any length
        (5, 9, 1.0, None),  # a constant rate after the warm-up: the length changes nothing
    ],
)
def test_the_first_changed_step_is_the_first_whose_rate_differs(
    warmup: int, step: int, min_ratio: float, first: int | None
) -> None:
    saved = dataclasses.replace(OPTIMISATION, warmup_steps=warmup, min_lr_ratio=min_ratio)
    change = schedule_change(saved, dataclasses.replace(saved, total_steps=20), step)
    differing = [
        n
        for n in range(step + 1, 13)
        if lr_factor(n - 1, warmup, 12, min_ratio) != lr_factor(n - 1, warmup, 20, min_ratio)
    ]
    assert (change.from_step if change else None) == first == (differing[0] if differing else None)


def test_a_checkpoint_written_before_the_optimisation_was_recorded_resumes_with_a_warning(tmp_path: Path) -> None:
    origin = origin_record("single", 1, SAVED)
    del origin["optimisation"]
    old = checkpoint(tmp_path, origin)
    assert refusal(old, _optimised(lr=0.01)) is None
    (line,), change = resume_warnings(old, OPTIMISATION)
    assert change is None and line.startswith("warning: --resume: step_0000009 was written before")


def _scheduler(total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """AdamW and the run's LambdaLR as training/trainer.py builds them, over one parameter."""
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.ones(2))], lr=OPTIMISATION.lr)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, 5, total_steps, 0.1))


@pytest.mark.parametrize("total_steps", [12, 20])
def test_the_step_after_a_resume_follows_the_schedule_of_the_launch(total_steps: int) -> None:
    """Under the same schedule the rate is the saved one to the bit, under a longer one already the new one;
    the base rate is the checkpoint's."""
    written = _scheduler(12)
    for _ in range(9):
        written.optimizer.step()
        written.step()
    resumed = _scheduler(total_steps)
    resumed.optimizer.load_state_dict(written.optimizer.state_dict())
    resumed.load_state_dict(written.state_dict())
    follow_schedule(resumed)
    rate = resumed.optimizer.param_groups[0]["lr"]
    assert resumed.base_lrs == [OPTIMISATION.lr]
    if total_steps == 12:
        assert rate == written.optimizer.param_groups[0]["lr"]
    else:
        assert rate == OPTIMISATION.lr * lr_factor(9, 5, total_steps, 0.1) != written.optimizer.param_groups[0]["lr"]


def test_the_optimisation_is_read_setting_by_setting_from_the_launch() -> None:
    """Each setting from its own flag (no two alike, so a swap shows) and the length as given."""
    from training.config import OptimConfig

    config = OptimConfig(
        lr=1e-2, min_lr_ratio=0.2, warmup_steps=7, weight_decay=0.3, beta1=0.8, beta2=0.97, eps=1e-7, grad_clip=0.5
    )
    assert Optimisation.of(config, 33) == Optimisation(
        lr=1e-2,
        weight_decay=0.3,
        beta1=0.8,
        beta2=0.97,
        eps=1e-7,
        grad_clip=0.5,
        warmup_steps=7,
        min_lr_ratio=0.2,
        total_steps=33,
    )


def test_the_earlier_layout_refusal_names_the_checkpoint(tmp_path: Path) -> None:
    old = checkpoint(tmp_path, None)
    assert refusal(old, SAVED).startswith(f"--resume: {old} was written by an earlier version")


def test_a_schedule_ending_at_the_checkpoint_says_where_the_checkpoint_is(saved: Path) -> None:
    """A schedule of 9 steps with the checkpoint at step 9 has no step left to take: said like one shorter."""
    assert "9 requested; the checkpoint is at step 9 (" in refusal(saved, _optimised(total_steps=9))


def test_a_model_setting_only_one_side_has_is_a_difference(saved: Path) -> None:
    """A key the checkpoint's model config lacks (or only it has) is a change of the model, not ignored."""
    extra = dataclasses.replace(SAVED, model_config={**SAVED.model_config, "parallel_blocks": True})
    assert "model parallel_blocks None saved, True requested" in refusal(saved, extra)


def test_a_schedule_one_step_longer_changes_the_step_after_the_saved_schedule_ended() -> None:
    """Checkpoint at the saved schedule's last step, one step more requested: that step was at the minimum
    rate and now is not, so the change is from it, the requested schedule's last."""
    change = schedule_change(OPTIMISATION, dataclasses.replace(OPTIMISATION, total_steps=13), 12)
    assert change is not None and change.from_step == 13
    assert change.saved_lr == pytest.approx(1e-3 * lr_factor(12, 5, 12, 0.1))
    assert change.lr == pytest.approx(1e-3 * lr_factor(12, 5, 13, 0.1)) != change.saved_lr
