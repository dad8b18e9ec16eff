"""--init_from: a new run that starts from another run's model weights (torchtitan's `initial_load_model_only`).

The source is a checkpoint folder, or a run folder whose newest verified checkpoint is taken; it may have been
written by any strategy and process count (DCP re-shards it, training/checkpoint.py). Only the weights are
taken: the optimizer, the learning-rate schedule and the step start afresh, and every other setting is this
launch's. The model's shape must be the same, checked before the data is read or anything written; the
source is only read (a damaged checkpoint in it is skipped, never set aside).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.checkpoint import (
    COMPLETE_MARKER,
    MODEL_CONFIG,
    checkpoint_problem,
    checkpoint_step,
    complete_checkpoints,
    earlier_layout_error,
    read_origin,
)
from training.errors import RunError
from training.record import InitialisedFromRecord

# What fixes the weights' shapes and meaning; dropout, the attention kernel and the LayerNorm epsilon may change.
SHAPE_KEYS = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner")


@dataclass(frozen=True)
class InitSource:
    """The checkpoint a new run takes its weights from, and who wrote it."""

    checkpoint: Path
    step: int
    strategy: str | None
    num_processes: int | None

    def record(self) -> InitialisedFromRecord:
        return InitialisedFromRecord(str(self.checkpoint), self.step, self.strategy, self.num_processes)

    def line(self) -> str:
        return (
            f"initialised from {self.checkpoint} (step {self.step}, written by {self.strategy} on "
            f"{self.num_processes} process(es)): its model weights only; optimizer, schedule and step start afresh"
        )


def init_source(spec: str, output_dir: Path, model_config: dict[str, Any]) -> InitSource:
    """The checkpoint `--init_from spec` names, checked to fit this launch's model (`model_config`, as
    model.GPT2Config.to_dict() gives it); RunError, one line, when it cannot be used."""
    path = Path(spec).expanduser().resolve()
    out = output_dir.expanduser().resolve()
    if not path.is_dir():
        raise RunError(f"--init_from {spec}: no such folder")
    if path == out or out in path.parents:
        raise RunError(
            f"--init_from {spec} is inside --output_dir {output_dir}, where the new run would replace it: choose "
            f"another --output_dir"
        )
    checkpoint = _chosen_checkpoint(path, spec)
    origin = read_origin(checkpoint)
    if origin is None:
        raise RunError(f"--init_from: {earlier_layout_error(checkpoint)}")
    saved = json.loads((checkpoint / MODEL_CONFIG).read_text())
    found = shape_differences(saved, model_config)
    if found:
        raise RunError(
            f"--init_from {checkpoint}: the model's shape differs: {'; '.join(found)}; choose the --model_preset "
            f"and --n_layer it was trained with"
        )
    return InitSource(checkpoint, checkpoint_step(checkpoint), origin.get("strategy"), origin.get("num_processes"))


def _chosen_checkpoint(path: Path, spec: str) -> Path:
    """`path` itself when it is a complete checkpoint that verifies, else its run folder's newest that does."""
    if (path / COMPLETE_MARKER).is_file():
        problem = checkpoint_problem(path)
        if problem is not None:
            raise RunError(f"--init_from {spec}: {path.name} fails verification ({problem})")
        return path
    complete = complete_checkpoints(path)
    for checkpoint in reversed(complete):
        if checkpoint_problem(checkpoint) is None:
            return checkpoint
    held = f"its {len(complete)} complete checkpoint(s) all fail verification" if complete else "it holds none"
    raise RunError(f"--init_from {spec}: not a complete checkpoint, nor a run folder with a verified one ({held})")


def shape_differences(saved: dict[str, Any], requested: dict[str, Any]) -> list[str]:
    """Each size that differs, as `name saved value, requested value`, in SHAPE_KEYS' order."""

    def size(config: dict[str, Any], key: str) -> Any:
        if key == "n_inner" and config.get(key) is None:  # None: GPT-2's 4 x n_embd
            return 4 * config["n_embd"] if "n_embd" in config else None
        return config.get(key)

    # Two defaults of n_inner differ only when n_embd does, which is named already.
    keys = [k for k in SHAPE_KEYS if k != "n_inner" or saved.get(k) is not None or requested.get(k) is not None]
    return [
        f"{k} {size(saved, k)} saved, {size(requested, k)} requested"
        for k in keys
        if size(saved, k) != size(requested, k)
    ]


def earlier_source(out: Path) -> InitialisedFromRecord | None:
    """The source a run folder's config.json names: a resumed run keeps it, since its launch cannot name one."""
    try:
        launch = json.loads((out / "config.json").read_text()).get("launch") or {}
    except (OSError, ValueError, AttributeError):  # no config.json yet, or one that is not a JSON object
        return None
    found = launch.get("initialised_from")
    return InitialisedFromRecord.from_dict(found) if isinstance(found, dict) else None
