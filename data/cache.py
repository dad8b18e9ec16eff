"""The on-disk cache of packed datasets: one folder per key, published atomically.

A build writes into a private temporary folder beside the final one and renames it into place when
complete. A rename within one file system is atomic, so a reader sees either no entry or a whole one;
an interrupted build leaves only a temporary folder, which is never read and is swept later.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

META_FILE = "meta.json"
_TMP_PREFIX = ".tmp-"
# A temporary folder older than this belongs to a build that died; no live build takes a day.
_STALE_TMP_S = 24 * 3600


def cache_key(parts: dict[str, Any]) -> str:
    """A short hex digest of everything that decides the packed result."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


def read_entry(root: Path, key: str) -> dict[str, Any] | None:
    """The metadata of a complete entry for `key`, or None when there is none (or it is damaged)."""
    folder = root / key
    try:
        meta = json.loads((folder / META_FILE).read_text())
    except (OSError, ValueError):
        return None
    # Published entries are complete by construction; the size check only catches later damage. A
    # store of tokenized documents lists its files' sizes; a packed entry gives them per split.
    sizes = meta.get("files") or {f"{split}.bin": meta["splits"][split]["bytes"] for split in ("train", "val")}
    for name, expected in sizes.items():
        path = folder / name
        if not path.is_file() or path.stat().st_size != expected:
            return None
    return meta


def _sweep_stale(root: Path) -> None:
    now = time.time()
    for tmp in root.glob(f"{_TMP_PREFIX}*"):
        try:
            if now - tmp.stat().st_mtime > _STALE_TMP_S:
                shutil.rmtree(tmp, ignore_errors=True)
        except OSError:
            pass  # another process swept it first


def publish(root: Path, key: str, build: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    """Run `build(tmp_folder)` (which returns the metadata) and publish its folder as entry `key`.

    When another process published the same key meanwhile, its entry wins and ours is discarded:
    both were built from the same inputs, so they hold the same data.
    """
    root.mkdir(parents=True, exist_ok=True)
    _sweep_stale(root)
    tmp = root / f"{_TMP_PREFIX}{key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    final = root / key
    try:
        meta = build(tmp)
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True))
        if final.exists() and read_entry(root, key) is None:
            # A damaged entry (files altered after publishing): move it aside, then replace it.
            aside = root / f"{_TMP_PREFIX}damaged-{key}-{uuid.uuid4().hex[:8]}"
            os.rename(final, aside)
            shutil.rmtree(aside, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError:
            existing = read_entry(root, key)
            if existing is None:
                raise
            return existing
        return meta
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
