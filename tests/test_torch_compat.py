"""Checkpoints through the DCP of the oldest torch in the declared range: 2.6's `dcp.save`/`dcp.load` take no
`no_dist`, and a checkpoint still saves, resumes and loads alone in one process (docs/compat.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from accelerate import Accelerator

from model import GPT2, GPT2Config
from training.checkpoint import load_model_from_checkpoint, load_states, save_checkpoint
from training.torch_compat import dcp_load_alone

CONFIG = GPT2Config.from_preset("tiny", vocab_size=256, n_positions=32)


@pytest.fixture
def dcp_of_torch_2_6(monkeypatch: pytest.MonkeyPatch) -> None:
    """dcp.save and dcp.load with torch 2.6's signatures (no `no_dist`), doing what today's do."""
    real_save, real_load = dcp.save, dcp.load

    def save(state_dict, *, checkpoint_id=None, storage_writer=None, planner=None, process_group=None):
        return real_save(state_dict, checkpoint_id=checkpoint_id, storage_writer=storage_writer, planner=planner)

    def load(state_dict, *, checkpoint_id=None, storage_reader=None, planner=None, process_group=None):
        return real_load(state_dict, checkpoint_id=checkpoint_id, storage_reader=storage_reader, planner=planner)

    monkeypatch.setattr(dcp, "save", save)
    monkeypatch.setattr(dcp, "load", load)


def test_a_checkpoint_saves_resumes_and_loads_alone_with_torch_2_6s_dcp(dcp_of_torch_2_6, tmp_path: Path) -> None:
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = GPT2(CONFIG)
    model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    path = save_checkpoint(accelerator, model, optimizer, tmp_path, 2, CONFIG.to_dict(), keep=1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    load_states(accelerator, model, optimizer, path)
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())
    alone = load_model_from_checkpoint(path)  # export and sampling: one process reads it all
    assert all(torch.equal(v, saved[k]) for k, v in alone.state_dict().items())


def test_loading_alone_takes_the_older_path_where_dcp_load_has_no_no_dist(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """2.6's `dcp.load` would join a process group's collectives; the older path reads in this process alone."""
    state = {"w": torch.arange(6.0).reshape(2, 3)}
    dcp.save(state, checkpoint_id=tmp_path)

    def load(state_dict, *, checkpoint_id=None, storage_reader=None, planner=None, process_group=None):
        raise AssertionError("2.6's dcp.load decides no_dist itself")

    monkeypatch.setattr(dcp, "load", load)
    into = {"w": torch.zeros(2, 3)}
    dcp_load_alone(into, tmp_path)
    assert torch.equal(into["w"], state["w"])
