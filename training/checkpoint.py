"""Checkpoints that work under every strategy, and loading one back into a single process.

A checkpoint is an `accelerator.save_state` folder (model, optimizer, grad scaler and RNG states;
sharded through torch.distributed.checkpoint under FSDP) plus `train_state.json`, the loop's position
and measurements and the learning-rate schedule, kept as JSON so that resuming unpickles nothing of ours.
It counts as complete only once `complete.json` is written, after every rank has finished writing:
an interrupted save is never resumed from. `complete.json` lists every file with its size and CRC-32,
so a checkpoint truncated or corrupted later (a full disk, a copy cut short) is recognised and skipped.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from training.errors import RunError
from training.faults import during_checkpoint_write

if TYPE_CHECKING:  # only annotations need it: reading a checkpoint does not import accelerate
    from accelerate import Accelerator

CHECKPOINTS_DIR = "checkpoints"
COMPLETE_MARKER = "complete.json"
MODEL_CONFIG = "model_config.json"
TRAIN_STATE = "train_state.json"
_FSDP_MODEL_DIR = "pytorch_model_fsdp_0"
_CRC_CHUNK = 1 << 22


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
        return {
            "step": self.step,
            "epoch": self.epoch,
            "steps_in_epoch": self.steps_in_epoch,
            "records": self.records,
            "epochs": self.epochs,
            "times": self.times,
        }

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


# accelerate logs this at every save of a model with tied weights (lm_head.weight is wte.weight here):
# safetensors keeps one copy of a shared tensor and the load ties it again, so the line is expected
# noise. Only this exact message is dropped; every other accelerate warning still shows.
_TIED_WEIGHT_NOTICE = "Removed shared tensor {'lm_head.weight'} while saving"


def _drop_tied_weight_notice(record: logging.LogRecord) -> bool:
    return _TIED_WEIGHT_NOTICE not in record.getMessage()


def _quiet_tied_weight_notice() -> None:
    # The logger that emits it: accelerate.utils.other.clean_state_dict_for_safetensors.
    emitter = logging.getLogger("accelerate.utils.other")
    if _drop_tied_weight_notice not in emitter.filters:
        emitter.addFilter(_drop_tied_weight_notice)


def save_checkpoint(
    accelerator: Accelerator,
    output_dir: Path,
    step: int,
    model_config: dict[str, Any],
    keep: int,
    train_state: dict[str, Any] | None = None,
) -> Path:
    """Write a checkpoint on every rank, mark it complete, keep the newest `keep` complete ones.

    `train_state`: what the loop needs besides accelerate's states (position, measurements, schedule),
    written as JSON by the main process.
    """
    path = checkpoint_path(output_dir, step)
    if accelerator.is_main_process and path.exists():
        shutil.rmtree(path)  # a leftover of an interrupted save at the same step
    accelerator.wait_for_everyone()
    _quiet_tied_weight_notice()
    accelerator.save_state(str(path))
    during_checkpoint_write(step)  # GPT2S_FAULT's test-only fault (training/faults.py), if one is set
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (path / MODEL_CONFIG).write_text(json.dumps(model_config, indent=2))
        if train_state is not None:
            (path / TRAIN_STATE).write_text(json.dumps(train_state))
        # Last, after every file: the marker that makes the checkpoint count, with what it must hold.
        (path / COMPLETE_MARKER).write_text(json.dumps({"step": step, "files": _manifest(path)}))
        for old in complete_checkpoints(output_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
        for partial in (output_dir / CHECKPOINTS_DIR).glob("step_*"):
            if not (partial / COMPLETE_MARKER).exists():
                shutil.rmtree(partial, ignore_errors=True)
    accelerator.wait_for_everyone()
    return path


def checkpoint_step(path: Path) -> int:
    return int(json.loads((path / COMPLETE_MARKER).read_text())["step"])


def _manifest(folder: Path) -> dict[str, list[int]]:
    return {
        str(p.relative_to(folder)): [p.stat().st_size, _crc32(p)]
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != COMPLETE_MARKER
    }


def _crc32(path: Path) -> int:
    crc = 0
    with path.open("rb") as f:
        while chunk := f.read(_CRC_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def checkpoint_problem(path: Path) -> str | None:
    """Why a complete checkpoint cannot be trusted (a file missing, truncated or changed), or None."""
    try:
        marker = json.loads((path / COMPLETE_MARKER).read_text())
    except (OSError, ValueError):
        return f"{COMPLETE_MARKER} is unreadable"
    listed = marker.get("files") if isinstance(marker, dict) else None
    if not isinstance(listed, dict):
        return "written by an earlier version of this project (no file list to verify); resuming it is not supported"
    for name, (size, crc) in listed.items():
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != size:
            return f"{name} has {file.stat().st_size} bytes, {size} were written"
        if _crc32(file) != crc:
            return f"{name} is corrupted (checksum differs from the one written)"
    return None


def newest_good_checkpoint(output_dir: Path) -> Path:
    """The newest complete checkpoint whose files are intact; one warning line per one skipped.

    Raises RunError (one line) when there is none.
    """
    found = complete_checkpoints(output_dir)
    for path in reversed(found):
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        if os.environ.get("RANK", "0") == "0":  # every rank checks; one says so
            print(f"warning: skipping checkpoint {path.name}: {problem}", file=sys.stderr, flush=True)
    if found:
        raise RunError(
            f"--resume: no intact checkpoint in {output_dir / CHECKPOINTS_DIR} "
            f"({len(found)} complete, all damaged); run without --resume or with --overwrite"
        )
    raise RunError(f"--resume: no complete checkpoint in {output_dir / CHECKPOINTS_DIR}; run without --resume")


def read_train_state(path: Path) -> dict[str, Any]:
    return json.loads((path / TRAIN_STATE).read_text())


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
