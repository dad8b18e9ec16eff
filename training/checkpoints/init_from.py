"""--init_from: a new run that starts from another run's model weights (torchtitan's `initial_load_model_only`).

The source is a checkpoint folder, or a run folder whose newest verified checkpoint is taken; it may have been
written by any strategy and process count (DCP re-shards it, training/checkpoints/store.py). Only the weights are
taken: the optimizer, the learning-rate schedule and the step start afresh, and every other setting is this
launch's. The model's shape must be the same, checked before the data is read or anything written; the
source is only read (a damaged checkpoint in it is skipped, never set aside).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.checkpoints.store import (
    COMPLETE_MARKER,
    MODEL_CONFIG,
    MODEL_DIR,
    checkpoint_problem,
    checkpoint_step,
    complete_checkpoints,
    earlier_layout_error,
    pickled_entries,
    pickled_refusal,
    read_origin,
)
from training.config import RunError
from training.records.record import InitialisedFromRecord

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
    # The weights as DCP indexed them: a difference no size above shows (a renamed or missing weight) is told
    # here in one line, not found inside DCP's load on every process with a traceback.
    found = weight_differences(_saved_weights(checkpoint), _model_weights(model_config))
    if found:
        raise RunError(f"--init_from {checkpoint}: its weights do not fit this model: {'; '.join(found)}")
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


def _saved_weights(checkpoint: Path) -> dict[str, tuple[int, ...]]:
    """Each weight's name and size in a checkpoint, from DCP's index of its model (model/.metadata)."""
    from torch.distributed.checkpoint import FileSystemReader

    try:
        metadata = FileSystemReader(str(checkpoint / MODEL_DIR)).read_metadata()
    except Exception as exc:  # unpickling a damaged or foreign index raises what it meets
        raise RunError(f"--init_from {checkpoint}: {MODEL_DIR}/.metadata cannot be read ({exc})") from exc
    pickled = pickled_entries(metadata)
    if pickled:
        raise RunError(f"--init_from: {pickled_refusal(checkpoint / MODEL_DIR, pickled)}")
    return {name: tuple(getattr(entry, "size", ())) for name, entry in metadata.state_dict_metadata.items()}


def _model_weights(model_config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Each weight's name and size in the model `model_config` builds, named as a save names them; built on
    the meta device, so nothing is allocated."""
    import torch
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from model import GPT2, GPT2Config

    with torch.device("meta"):
        model = GPT2(GPT2Config.from_dict(model_config))
    return {name: tuple(tensor.shape) for name, tensor in get_model_state_dict(model).items()}


def weight_differences(
    saved: dict[str, tuple[int, ...]], wanted: dict[str, tuple[int, ...]], shown: int = 3
) -> list[str]:
    """The first `shown` weights of each kind that differ: missing from the checkpoint, not in this model, or of
    another size; empty when the checkpoint's weights fit."""
    found = []
    missing = [name for name in wanted if name not in saved]
    extra = [name for name in saved if name not in wanted]
    sizes = [
        f"{n} {list(saved[n])} saved, {list(wanted[n])} here" for n in wanted if n in saved and saved[n] != wanted[n]
    ]
    for what, names in (
        ("missing from the checkpoint", missing),
        ("not in this model", extra),
        ("size differs", sizes),
    ):
        if names:
            more = f" and {len(names) - shown} more" if len(names) > shown else ""
            found.append(f"{what}: {', '.join(names[:shown])}{more}")
    return found


def can_read_weights(checkpoint: Path) -> bool:
    """Whether this process can read the checkpoint's index of its weights (every process loads its part)."""
    try:
        with (checkpoint / MODEL_DIR / ".metadata").open("rb") as index:
            index.read(1)
    except OSError:
        return False
    return True


def unreadable_error(checkpoint: Path, readable: list[tuple[int, str, bool]]) -> str | None:
    """The one line naming the processes (rank, host) that cannot read `checkpoint`; None when all can."""
    blind = [f"rank {rank} on {host}" for rank, host, ok in readable if not ok]
    if not blind:
        return None
    return (
        f"--init_from {checkpoint}: {', '.join(blind)} cannot read it (the main process can): every process loads "
        f"its part of the weights, so the source must be on a file system every machine mounts at the same path"
    )


def earlier_launch(out: Path, key: str) -> dict[str, Any] | None:
    """What a run folder's config.json recorded under launch[`key`], where that is an object: a resumed run keeps
    what its first launch recorded and its own launch cannot tell. None without one."""
    try:
        launch = json.loads((out / "config.json").read_text()).get("launch") or {}
    except (OSError, ValueError, AttributeError):  # no config.json yet, or one that is not a JSON object
        return None
    found = launch.get(key)
    return found if isinstance(found, dict) else None


def earlier_source(out: Path) -> InitialisedFromRecord | None:
    """The source a run folder's config.json names: a resumed run keeps it, since its launch cannot name one."""
    found = earlier_launch(out, "initialised_from")
    return None if found is None else InitialisedFromRecord.from_dict(found)
