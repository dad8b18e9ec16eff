"""--init_from through the real set-up (training/trainer.py Trainer), in one process: the new run takes the source
checkpoint's weights, and its optimizer and learning-rate schedule start afresh although the source's optimizer
has moments and a step count."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator

from training import trainer as session_module
from training.checkpoints.store import load_model_state_dict, save_checkpoint
from training.cli import parse_config


@pytest.fixture()
def handlers_kept():
    """set_up installs the run's SIGTERM/SIGINT handlers in this process; the test's are put back after it."""
    kept = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    yield
    for signum, handler in kept.items():
        signal.signal(signum, handler)


def _source(cfg, folder: Path) -> Path:
    """A checkpoint of the launch's model shape after two AdamW steps: moments, step counts, weights moved."""
    from model import GPT2

    torch.manual_seed(11)
    model_config = session_module._model_config(cfg)
    accelerator = Accelerator(cpu=True)
    model = GPT2(model_config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    for _ in range(2):
        for parameter in model.parameters():
            parameter.grad = torch.randn_like(parameter)
        optimizer.step()
    assert optimizer.optimizer.state  # the source's optimizer is not fresh
    return save_checkpoint(accelerator, model, optimizer, folder, 2, model_config.to_dict(), keep=1)


def test_the_trainer_takes_only_the_weights_and_starts_the_optimizer_and_schedule_afresh(
    tmp_path: Path, base_args: list[str], handlers_kept
) -> None:
    args = [*base_args, "--strategy", "single", "--wandb_mode", "disabled", "--no-export_hf"]
    source = _source(parse_config([*args, "--output_dir", str(tmp_path / "new")]), tmp_path / "source")
    cfg = parse_config([*args, "--output_dir", str(tmp_path / "new"), "--init_from", str(source)])
    s = session_module.Trainer(cfg)
    inner = getattr(s.optimizer, "optimizer", s.optimizer)
    assert not inner.state, "the optimizer holds the source's moments and step counts"
    assert [group["lr"] for group in inner.param_groups] == s.scheduler.get_last_lr()
    assert s.scheduler.last_epoch == 0 and s.state.step == 0
    assert [group["initial_lr"] for group in inner.param_groups] == [cfg.optim.lr] * len(inner.param_groups)
    weights = load_model_state_dict(source)
    own = s.model.state_dict()
    assert all(torch.equal(own[name], weights[name]) for name in weights)
