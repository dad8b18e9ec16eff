"""The run directory: one run per directory, atomic writes, and what a resume rewrites."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

from training.checkpoint import newest_good_checkpoint
from training.errors import RunError

_RUN_FILES = ("metrics.jsonl", "summary.json", "config.json", "wandb_run_id")
_RUN_DIRS = ("checkpoints", "hf", "wandb")


def check_output_dir(out: Path, resume: bool, overwrite: bool) -> Path | None:
    """Refuse to mix two runs in one directory; return the checkpoint to resume from, if any."""
    holds_run = any((out / f).exists() for f in _RUN_FILES + _RUN_DIRS)
    if resume:
        return newest_good_checkpoint(out)
    if holds_run and not overwrite:
        raise RunError(f"{out} already holds a run; pass --resume to continue it or --overwrite to replace it")
    return None


def clear_run_files(out: Path) -> None:
    for name in _RUN_FILES:
        (out / name).unlink(missing_ok=True)
    for name in _RUN_DIRS:
        shutil.rmtree(out / name, ignore_errors=True)


def truncate_metrics(path: Path, last_step: int) -> None:
    """After a resume, drop metric lines of steps that will be trained again."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines()
            if line.strip() and json.loads(line).get("step", 0) <= last_step]
    write_atomic(path, "".join(line + "\n" for line in kept))


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write `data` (text is written as UTF-8) so that a reader sees the old file or the whole new one.

    The data goes to a temporary file in the same folder, which is then renamed over `path`; on any
    failure the temporary file is removed. Its name is unique per call, so two writers never share one.
    open(..., "xb") rather than mkstemp: the file gets the usual umask permissions, not 0600.
    """
    if isinstance(data, str):
        data = data.encode("utf-8")
    temp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(temp, "xb") as stream:
            stream.write(data)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def wandb_run_id(out: Path) -> str:
    """A W&B run id kept in the run directory, so a resumed run continues the same W&B run."""
    path = out / "wandb_run_id"
    if path.exists():
        return path.read_text().strip()
    run_id = uuid.uuid4().hex[:12]
    path.write_text(run_id)
    return run_id
