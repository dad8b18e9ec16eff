"""Checkpoints that work under every strategy, and loading one back into a single process.

A checkpoint is an `accelerator.save_state` folder (model, optimizer, grad scaler, RNG states and the
registered scheduler and training state), sharded through torch.distributed.checkpoint under FSDP.
It counts as complete only once `complete.json` is written, after every rank has finished writing:
an interrupted save is never resumed from.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accelerate import Accelerator

CHECKPOINTS_DIR = "checkpoints"
COMPLETE_MARKER = "complete.json"
MODEL_CONFIG = "model_config.json"
_FSDP_MODEL_DIR = "pytorch_model_fsdp_0"


@dataclass
class TrainState:
    """Position in the data and what has been measured so far; saved in every checkpoint."""

    step: int = 0
    epoch: int = 1
    steps_in_epoch: int = 0
    records: list[dict[str, Any]] = field(default_factory=list)
    epochs: list[dict[str, Any]] = field(default_factory=list)
    times: dict[str, float] = field(default_factory=dict)

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "epoch": self.epoch, "steps_in_epoch": self.steps_in_epoch,
                "records": self.records, "epochs": self.epochs, "times": self.times}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, value)


def checkpoint_path(output_dir: Path, step: int) -> Path:
    return output_dir / CHECKPOINTS_DIR / f"step_{step:07d}"


def complete_checkpoints(output_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = output_dir / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step_*") if (p / COMPLETE_MARKER).is_file())


def newest_checkpoint(output_dir: Path) -> Path | None:
    found = complete_checkpoints(output_dir)
    return found[-1] if found else None


def save_checkpoint(accelerator: Accelerator, output_dir: Path, step: int, model_config: dict[str, Any],
                    keep: int) -> Path:
    """Write a checkpoint on every rank, mark it complete, keep the newest `keep` complete ones."""
    path = checkpoint_path(output_dir, step)
    if accelerator.is_main_process and path.exists():
        shutil.rmtree(path)  # a leftover of an interrupted save at the same step
    accelerator.wait_for_everyone()
    accelerator.save_state(str(path))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (path / MODEL_CONFIG).write_text(json.dumps(model_config, indent=2))
        (path / COMPLETE_MARKER).write_text(json.dumps({"step": step}))
        for old in complete_checkpoints(output_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
        for partial in (output_dir / CHECKPOINTS_DIR).glob("step_*"):
            if not (partial / COMPLETE_MARKER).exists():
                shutil.rmtree(partial, ignore_errors=True)
    accelerator.wait_for_everyone()
    return path


def checkpoint_step(path: Path) -> int:
    return int(json.loads((path / COMPLETE_MARKER).read_text())["step"])


def is_checkpoint_or_run(path: Path) -> bool:
    """A complete checkpoint folder, or a run directory holding one."""
    return (path / COMPLETE_MARKER).is_file() or newest_checkpoint(path) is not None


def load_model_state_dict(path: Path) -> dict[str, Any]:
    """The full model state dict of a checkpoint written by any strategy, read in one process."""
    import torch

    if (path / "model.safetensors").is_file():
        from safetensors.torch import load_file

        return load_file(str(path / "model.safetensors"))
    if (path / "pytorch_model.bin").is_file():
        return torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    if (path / _FSDP_MODEL_DIR).is_dir():
        # torch.distributed.checkpoint's sharded files, merged into one state dict without a process group.
        import tempfile

        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        with tempfile.TemporaryDirectory() as tmp:
            merged = Path(tmp) / "model.pt"
            dcp_to_torch_save(str(path / _FSDP_MODEL_DIR), str(merged))
            return torch.load(merged, map_location="cpu", weights_only=True)["model"]
    raise FileNotFoundError(f"{path}: no model weights (model.safetensors or {_FSDP_MODEL_DIR}/) in checkpoint")


def load_model_from_checkpoint(path: str | Path):  # -> model.GPT2
    """Rebuild the trained GPT2 from a checkpoint folder (or a run directory: its newest checkpoint)."""
    from model import GPT2, GPT2Config

    path = Path(path)
    if not (path / COMPLETE_MARKER).is_file():
        newest = newest_checkpoint(path)
        if newest is None:
            raise FileNotFoundError(f"{path}: not a complete checkpoint and holds no {CHECKPOINTS_DIR}/step_*")
        path = newest
    config = GPT2Config.from_dict(json.loads((path / MODEL_CONFIG).read_text()))
    model = GPT2(config)
    state = load_model_state_dict(path)
    # Checkpoints store the tied lm_head once or twice depending on the writer; the tie restores it.
    state.setdefault("lm_head.weight", state["transformer.wte.weight"])
    model.load_state_dict(state)
    return model
