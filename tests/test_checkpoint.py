"""Checkpoints: only complete ones count, the newest `keep` are kept, and loading picks the newest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator

from model import GPT2, GPT2Config
from training.checkpoint import (
    COMPLETE_MARKER,
    checkpoint_path,
    checkpoint_step,
    complete_checkpoints,
    load_model_from_checkpoint,
    newest_checkpoint,
    save_checkpoint,
)

# The tiny preset with a small vocabulary and context: a checkpoint of a few hundred KiB saves in milliseconds.
CONFIG = GPT2Config.from_preset("tiny", vocab_size=256, n_positions=32)


@pytest.fixture(scope="module")
def prepared() -> tuple[Accelerator, torch.nn.Module]:
    """One process on CPU, a model and its optimizer prepared as training prepares them."""
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = GPT2(CONFIG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model


def save(prepared, out: Path, step: int, keep: int = 3) -> Path:
    accelerator, _ = prepared
    return save_checkpoint(accelerator, out, step, CONFIG.to_dict(), keep=keep)


def names(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "checkpoints").iterdir())


def fake_checkpoint(out: Path, step: int, complete: bool) -> Path:
    """A checkpoint folder as the finder sees it: complete.json only once the save has finished."""
    path = checkpoint_path(out, step)
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"")
    if complete:
        (path / COMPLETE_MARKER).write_text(json.dumps({"step": step}))
    return path


def test_save_writes_a_complete_checkpoint_with_the_model_config(prepared, tmp_path: Path) -> None:
    path = save(prepared, tmp_path, 7)
    assert path == tmp_path / "checkpoints" / "step_0000007"
    assert checkpoint_step(path) == 7
    assert (path / "model.safetensors").is_file() and (path / "optimizer.bin").is_file()
    assert GPT2Config.from_dict(json.loads((path / "model_config.json").read_text())) == CONFIG


def test_save_keeps_only_the_newest_keep_complete_checkpoints(prepared, tmp_path: Path) -> None:
    for step in (1, 2, 3, 4, 5):
        save(prepared, tmp_path, step, keep=2)
    assert names(tmp_path) == ["step_0000004", "step_0000005"]
    assert complete_checkpoints(tmp_path) == [checkpoint_path(tmp_path, 4), checkpoint_path(tmp_path, 5)]


def test_save_removes_partial_folders_of_interrupted_saves(prepared, tmp_path: Path) -> None:
    save(prepared, tmp_path, 2)
    fake_checkpoint(tmp_path, 3, complete=False)  # interrupted before complete.json
    fake_checkpoint(tmp_path, 9, complete=False)  # a newer one, from a run that was then resumed earlier
    save(prepared, tmp_path, 4)
    assert names(tmp_path) == ["step_0000002", "step_0000004"]


def test_save_replaces_a_leftover_folder_at_the_same_step(prepared, tmp_path: Path) -> None:
    leftover = fake_checkpoint(tmp_path, 5, complete=False)
    (leftover / "stale.bin").write_bytes(b"half-written")
    save(prepared, tmp_path, 5)
    assert not (leftover / "stale.bin").exists() and checkpoint_step(leftover) == 5


def test_newest_checkpoint_skips_an_incomplete_one(tmp_path: Path) -> None:
    # Created newest first, so neither creation order nor modification time can stand in for the step.
    fake_checkpoint(tmp_path, 12, complete=False)
    fake_checkpoint(tmp_path, 10, complete=True)
    fake_checkpoint(tmp_path, 9, complete=True)
    assert complete_checkpoints(tmp_path) == [checkpoint_path(tmp_path, 9), checkpoint_path(tmp_path, 10)]
    assert newest_checkpoint(tmp_path) == checkpoint_path(tmp_path, 10)


def test_no_complete_checkpoint_means_none(tmp_path: Path) -> None:
    assert newest_checkpoint(tmp_path) is None and complete_checkpoints(tmp_path) == []
    fake_checkpoint(tmp_path, 3, complete=False)
    assert newest_checkpoint(tmp_path) is None and complete_checkpoints(tmp_path) == []


def test_loading_a_run_directory_takes_its_newest_complete_checkpoint(prepared, tmp_path: Path) -> None:
    _, model = prepared
    weights = {}
    for step in (1, 2):
        with torch.no_grad():
            model.transformer.wte.weight.add_(1.0)  # different weights in each checkpoint
        weights[step] = model.transformer.wte.weight.detach().clone()
        save(prepared, tmp_path, step)
    newer_partial = fake_checkpoint(tmp_path, 3, complete=False)  # e.g. a save still in progress
    (newer_partial / "model_config.json").write_text(json.dumps(CONFIG.to_dict()))

    loaded = load_model_from_checkpoint(tmp_path)
    assert torch.equal(loaded.transformer.wte.weight, weights[2])
    assert loaded.lm_head.weight is loaded.transformer.wte.weight  # the tie survives loading
    older = load_model_from_checkpoint(checkpoint_path(tmp_path, 1))  # a checkpoint folder: that one
    assert torch.equal(older.transformer.wte.weight, weights[1])


def test_loading_a_folder_without_a_complete_checkpoint_says_so(tmp_path: Path) -> None:
    fake_checkpoint(tmp_path, 3, complete=False)
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        load_model_from_checkpoint(tmp_path)
