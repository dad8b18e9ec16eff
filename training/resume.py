"""Whether a checkpoint can continue exactly under this launch: what must match, and the refusal when not.

A checkpoint resumes under any strategy and process count (training/checkpoint.py), but the continued
steps equal the uninterrupted run's only when what shapes them is the same: the model, the global batch
in tokens, the data (corpus, tokenizer, block size and split, as the data cache's content hash says) and
the seed (it orders the data). Each checkpoint's origin.json records these and who wrote it; `refusal`
compares them with this launch's before anything is loaded or written, and names what differs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from training.checkpoint import checkpoint_step, earlier_layout_error, read_origin
from training.record import ResumedFromRecord

# Model config keys that change how, not what, the model computes: the attention kernel (a device may
# lack one) gives the same outputs to rounding.
_HOW_NOT_WHAT = frozenset({"attn_impl"})


@dataclass(frozen=True)
class ResumeIdentity:
    """What a resumed launch must share with the one that wrote its checkpoint to continue it exactly."""

    model_config: dict[str, Any]  # model.GPT2Config.to_dict()
    global_batch_tokens: int
    seed: int  # seeds the data order
    data_key: str | None  # the packed data's content hash (corpus, tokenizer, block size, split)
    # Named in the refusal when the data differs; the content hash above decides.
    block_size: int
    tokenizer: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def origin_record(strategy: str, num_processes: int, precision: str, identity: ResumeIdentity) -> dict[str, Any]:
    """What a checkpoint's origin.json says besides its format: who wrote it, and what a resume must match."""
    return {"strategy": strategy, "num_processes": num_processes, "precision": precision, **identity.to_dict()}


def refusal(checkpoint: Path, requested: ResumeIdentity) -> str | None:
    """The one-line reason this launch cannot continue `checkpoint` exactly, or None when it can."""
    origin = read_origin(checkpoint)
    if origin is None:
        return f"--resume: {earlier_layout_error(checkpoint)}"
    found = differences(origin, requested)
    if not found:
        return None
    return (
        f"--resume: {checkpoint.name} cannot be continued exactly by this launch: {'; '.join(found)}; resume "
        f"with the saved settings, or start a new run (--overwrite or another --output_dir)"
    )


def differences(saved: dict[str, Any], requested: ResumeIdentity) -> list[str]:
    """What differs, each as `what: saved value, requested value`, in the order a user would check them."""
    found = _model_differences(saved.get("model_config") or {}, requested.model_config)
    if saved.get("global_batch_tokens") != requested.global_batch_tokens:
        found.append(
            f"global batch {saved.get('global_batch_tokens')} tokens saved, {requested.global_batch_tokens} requested"
        )
    if saved.get("seed") != requested.seed:
        found.append(f"seed (it orders the data) {saved.get('seed')} saved, {requested.seed} requested")
    if saved.get("data_key") != requested.data_key:
        found.append(_data_difference(saved, requested))
    return found


def _model_differences(saved: dict[str, Any], requested: dict[str, Any]) -> list[str]:
    keys = sorted((saved.keys() | requested.keys()) - _HOW_NOT_WHAT)
    return [
        f"model {k} {saved.get(k)} saved, {requested.get(k)} requested"
        for k in keys
        if saved.get(k) != requested.get(k)
    ]


def _data_difference(saved: dict[str, Any], requested: ResumeIdentity) -> str:
    """The data differs (its content hash); named by the likely cause when the block size or tokenizer changed."""
    causes = [
        f"{name} {saved.get(key)} saved, {getattr(requested, key)} requested"
        for name, key in (("block size", "block_size"), ("tokenizer", "tokenizer"))
        if saved.get(key) != getattr(requested, key)
    ]
    hashes = f"content hash {str(saved.get('data_key'))[:12]} saved, {str(requested.data_key)[:12]} requested"
    return f"data ({', '.join([*causes, hashes])})" if causes else f"data: another corpus or split ({hashes})"


def resumed_from(checkpoint: Path) -> ResumedFromRecord:
    """The run record's note of the checkpoint a launch continues: its step and who wrote it."""
    origin = read_origin(checkpoint) or {}
    return ResumedFromRecord(
        step=checkpoint_step(checkpoint),
        strategy=origin.get("strategy"),
        num_processes=origin.get("num_processes"),
        precision=origin.get("precision"),
    )
