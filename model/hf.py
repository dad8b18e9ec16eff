"""Moving weights between our GPT2 and transformers' GPT2LMHeadModel.

The names already agree (see model/gpt2.py); what differs is that transformers' projections are
`Conv1D` layers, whose weight is stored (in_features, out_features), the transpose of `nn.Linear`'s.
transformers is imported inside the functions: it takes seconds, and training never needs it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from model.config import GPT2Config
from model.gpt2 import GPT2

if TYPE_CHECKING:
    import transformers

# Weights of transformers' Conv1D layers, by the end of their name.
_CONV1D_WEIGHTS = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")
# Buffers some transformers versions keep in GPT-2's state dict: the causal mask, not parameters.
_HF_BUFFERS = (".attn.bias", ".attn.masked_bias")


def hf_to_our_state_dict(hf_sd: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename, transpose and filter a transformers GPT-2 state dict into ours.

    Accepts the keys of GPT2LMHeadModel (`transformer.h.0...`) and of the bare GPT2Model (`h.0...`);
    a missing `lm_head.weight` is the tied token embedding.
    """
    sd = {}
    for key, value in hf_sd.items():
        if key.endswith(_HF_BUFFERS):
            continue
        if not key.startswith(("transformer.", "lm_head.")):
            key = "transformer." + key
        sd[key] = value.t() if key.endswith(_CONV1D_WEIGHTS) else value
    if "transformer.wte.weight" not in sd:
        raise ValueError("not a GPT-2 state dict: there is no token embedding (transformer.wte.weight)")
    lm_head = sd.setdefault("lm_head.weight", sd["transformer.wte.weight"])
    if not torch.equal(lm_head, sd["transformer.wte.weight"]):
        raise ValueError("lm_head.weight differs from transformer.wte.weight: our GPT2 supports only tied embeddings")
    return sd


def our_to_hf_state_dict(sd: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict in transformers' layout (Conv1D weights transposed), on the CPU."""
    return {k: (v.t() if k.endswith(_CONV1D_WEIGHTS) else v).detach().cpu().contiguous() for k, v in sd.items()}


def _load_hf_folder(folder: Path) -> transformers.GPT2LMHeadModel:
    import transformers

    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder")
    if not (folder / "config.json").is_file():
        raise ValueError(f"{folder}: not a Hugging Face model folder (no config.json)")
    # local_files_only: a typo in a path must never turn into a download from the hub.
    return transformers.GPT2LMHeadModel.from_pretrained(folder, local_files_only=True)


def from_hf(
    src: transformers.GPT2LMHeadModel | Mapping[str, torch.Tensor] | str | os.PathLike,
    config: GPT2Config | None = None,
    **overrides: Any,
) -> GPT2:
    """Build our GPT2 from transformers' GPT-2: a `GPT2LMHeadModel`, its state dict, or a saved folder.

    The config comes from the transformers model or folder; a bare state dict carries none (the
    head count cannot be read from shapes), so pass `config` with it. `overrides` replace config
    fields that do not change the weights, such as `attn_impl` or the dropouts.
    """
    if isinstance(src, (str, os.PathLike)):
        src = _load_hf_folder(Path(src))
    if isinstance(src, Mapping):
        if config is None:
            raise ValueError("a state dict does not say how many heads the model has: pass config= with it")
        hf_sd = src
    else:  # a transformers model
        config = config or GPT2Config.from_hf_config(src.config)
        hf_sd = src.state_dict()
    config = dataclasses.replace(config, **overrides)
    model = GPT2(config)
    # strict: a weight that is missing or left over means the two configs disagree.
    model.load_state_dict(hf_to_our_state_dict(hf_sd), strict=True)
    return model


def to_hf(model: GPT2) -> transformers.GPT2LMHeadModel:
    """A transformers GPT2LMHeadModel with the same weights (on the CPU, fp32)."""
    import transformers

    hf_model = transformers.GPT2LMHeadModel(model.config.to_hf_config())
    hf_model.load_state_dict(our_to_hf_state_dict(model.state_dict()), strict=True)
    return hf_model


def save_hf(model: GPT2, folder: str | os.PathLike, tokenizer: Any = None) -> None:
    """Write a folder that `transformers.GPT2LMHeadModel.from_pretrained` loads (and the tokenizer, if given).

    An existing folder is replaced only once the new one is complete.
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise FileExistsError(f"{folder}: exists and is not a folder")
    folder.parent.mkdir(parents=True, exist_ok=True)
    # Write beside the target, then swap it in: a failure half-way (full disk, a crash) leaves
    # the previous export intact instead of a folder with a config and no weights.
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    try:
        with _quiet_progress_bars():
            to_hf(model).save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        _default_permissions(tmp)
        _replace_folder(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _default_permissions(folder: Path) -> None:
    """Give the export the permissions of any other file the user writes (the umask's).

    mkdtemp makes its folder private (0700), and safetensors writes its file 0600: the export would
    be the one part of a run directory that other users (a shared results folder) cannot read.
    """
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for path in folder.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


@contextlib.contextmanager
def _quiet_progress_bars() -> Iterator[None]:
    """transformers draws a bar for writing the (single) shard, which lands as noise in training logs."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _replace_folder(new: Path, target: Path) -> None:
    """Move `new` to `target`, replacing what is there. A rename cannot overwrite a non-empty folder,
    so the old one is first renamed aside, and renamed back if the second rename fails."""
    if not target.exists():
        new.rename(target)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
    target.rename(old)  # onto the empty folder just made: allowed
    try:
        new.rename(target)
    except BaseException:
        old.rename(target)
        raise
    shutil.rmtree(old, ignore_errors=True)
