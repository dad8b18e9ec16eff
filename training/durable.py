"""Files written whole or not at all, and made to last a crash: what the run folder and its checkpoints are
written with."""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def write_atomic(path: Path, data: str | bytes, sync: bool = False) -> None:
    """Write `data` (text is written as UTF-8) so that a reader sees the old file or the whole new one.

    `sync`: the data reaches the disk before the rename, so that a crash cannot leave the new name on an
    empty file (the caller syncs the folder for the rename itself to last).

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
            if sync:
                stream.flush()
                os.fsync(stream.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def sync_folder(folder: Path) -> None:
    """Make a folder's entries (files created or renamed in it) durable."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
