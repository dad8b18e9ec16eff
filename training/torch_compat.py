"""torch calls whose signature differs across the releases of the declared range (requirements.txt), chosen at
run time so that one call works on all of them (docs/compat.md)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any


def dcp_load_alone(state_dict: dict[str, Any], folder: Path) -> None:
    """DCP's load in this process alone, with no collective, even where a process group is initialized.

    `dcp.load(..., no_dist=True)` says so from torch 2.7 on; 2.6's `dcp.load` lacks the argument (it
    assumes one process exactly when no group is initialized), and its `_load_state_dict` takes it.
    """
    import torch.distributed.checkpoint as dcp

    if "no_dist" in inspect.signature(dcp.load).parameters:
        dcp.load(state_dict, checkpoint_id=folder, no_dist=True)
        return
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    _load_state_dict(state_dict, storage_reader=dcp.FileSystemReader(folder), no_dist=True)
