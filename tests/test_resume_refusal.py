"""What a resume must match to continue exactly, and the one-line refusal naming what differs (no launch)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from model import GPT2Config
from training.checkpoint import COMPLETE_MARKER, FORMAT, ORIGIN, checkpoint_path
from training.resume import ResumeIdentity, origin_record, refusal, resumed_from

SAVED = ResumeIdentity(
    model_config=GPT2Config.from_preset("tiny").to_dict(),
    global_batch_tokens=1024,
    seed=3,
    data_key="0123456789abcdef0123",
    block_size=64,
    tokenizer=None,
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
    return checkpoint(tmp_path, origin_record("fsdp", 2, "fp32", SAVED))


def test_the_same_identity_resumes_under_any_strategy(saved: Path) -> None:
    assert refusal(saved, SAVED) is None
    record = resumed_from(saved)
    assert (record.step, record.strategy, record.num_processes, record.precision) == (9, "fsdp", 2, "fp32")


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
}


@pytest.mark.parametrize("what", list(REQUESTS))
def test_what_differs_is_refused_in_one_line_naming_saved_and_requested(saved: Path, what: str) -> None:
    requested, named = REQUESTS[what]
    line = refusal(saved, requested)
    assert line is not None and "\n" not in line
    assert line.startswith("--resume: step_0000009 cannot be continued exactly by this launch: ")
    differences, advice = line.split(": ", 2)[2].split("; ")  # only what was changed is named
    assert named in differences and advice.startswith("resume with the saved settings")


def test_every_difference_is_named(saved: Path) -> None:
    requested = dataclasses.replace(SAVED, global_batch_tokens=2048, seed=4)
    line = refusal(saved, requested)
    assert "global batch 1024 tokens saved, 2048 requested; seed" in line


def test_a_checkpoint_of_the_earlier_layout_is_refused(tmp_path: Path) -> None:
    line = refusal(checkpoint(tmp_path, None), SAVED)
    assert line is not None and "\n" not in line and "earlier version of this project" in line
