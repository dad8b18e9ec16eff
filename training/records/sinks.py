"""Where metrics go: always a local metrics.jsonl, and W&B through accelerate's tracker.

Only the main process writes. The W&B sink is enabled on the main process alone (training/trainer.py):
on the others accelerate's tracker is an empty stand-in without .dir or .summary. W&B is a convenience: any failure there is reported once and training
goes on with the local files, which hold the same values.
"""

from __future__ import annotations

import json
import math
import netrc
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from training.records.schema import (
    LINE_KIND_KEY,
    WANDB_SUMMARY_PREFIX,
    unlogged_line_keys,
    wandb_history_keys,
    wandb_summary_key,
)

if TYPE_CHECKING:  # only annotations need it: the report tools import the key names without torch
    from accelerate import Accelerator

__all__ = [
    "WANDB_KEYS",
    "WANDB_SUMMARY_PREFIX",
    "JsonlSink",
    "WandbSink",
    "resolve_wandb_mode",
    "wandb_finish_settings",
    "wandb_logged_in",
    "wandb_summary_key",
]

# The W&B names come from the run schema (training/records/schema.py): metrics.jsonl key -> W&B
# history key, and the prefix of the whole-run figures in the W&B run summary. Kept here as names
# because training/loop.py and the tests import them from the sink that uses them.
WANDB_KEYS = wandb_history_keys()
# The line's kind, and line keys the table logs to no W&B key (the step is W&B's own step axis).
NOT_LOGGED = frozenset({LINE_KIND_KEY, *unlogged_line_keys()})


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class JsonlSink:
    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, record: dict[str, Any]) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps({k: _json_safe(v) for k, v in record.items()}) + "\n")


def wandb_logged_in() -> bool:
    """True when W&B credentials are present (environment or netrc), without contacting the server."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def resolve_wandb_mode(requested: str) -> str:
    """auto -> online when logged in, else offline; WANDB_MODE in the environment wins over auto."""
    if requested != "auto":
        return requested
    env_mode = os.environ.get("WANDB_MODE")
    if env_mode in ("online", "offline", "disabled"):
        return env_mode
    return "online" if wandb_logged_in() else "offline"


def wandb_finish_settings(timeout_s: float) -> dict[str, Any]:
    """wandb.init settings that bound how long the end of an online run waits for its upload.

    By default `run.finish()` waits until everything is uploaded, and when the server has gone away
    mid-run wandb-core keeps retrying for longer than a notebook session has (measured with wandb
    0.31: still waiting after 9 minutes). With a timeout, finish raises TimeoutError instead, which
    the sink reports as its one warning; the run's record stays on disk for `wandb sync`.
    """
    if timeout_s <= 0:
        return {}  # wait as long as the upload takes: W&B's own default
    return {"finish_timeout": float(timeout_s), "finish_timeout_raises": True}


class WandbSink:
    """accelerate's W&B tracker, with failures turned into one warning line."""

    def __init__(self, accelerator: Accelerator, enabled: bool) -> None:
        self.accelerator = accelerator
        self.enabled = enabled
        self.mode: str | None = None  # online or offline, once the run has started
        self.run_dir: str | None = None  # the run's local record, which `wandb sync` uploads
        self.finish_failed = False

    def start(self, project: str, config: dict[str, Any], init_kwargs: dict[str, Any]) -> None:
        if not self.enabled:
            return
        try:
            self.accelerator.init_trackers(project, config=config, init_kwargs={"wandb": init_kwargs})
            run = self.accelerator.get_tracker("wandb", unwrap=True)
            if init_kwargs.get("mode") in ("online", "offline"):
                self.mode = init_kwargs["mode"]
                # run.dir is <sync dir>/files; `wandb sync` takes the sync dir.
                self.run_dir = os.path.dirname(run.dir)
        except Exception as exc:  # noqa: BLE001 - W&B must never stop training
            self._fail("start", exc)

    def sync_line(self) -> str | None:
        """The closing line naming what `wandb sync` still has to upload: an offline run, or an online
        run whose upload did not finish (its record on disk is complete: W&B writes it before sending)."""
        if self.run_dir is None:
            return None
        if self.mode == "offline":
            return f"W&B: offline run in {self.run_dir}; upload it with: wandb sync {self.run_dir}"
        if self.finish_failed:
            # `wandb sync` skips runs started online unless told otherwise.
            return (
                f"W&B: the upload did not finish; the run is kept in {self.run_dir}; "
                f"upload the rest with: wandb sync --include-online {self.run_dir}"
            )
        return None

    def log(self, record: dict[str, Any], step: int) -> None:
        if not self.enabled:
            return
        # A key missing from the table still reaches W&B, under its own name, rather than being lost.
        values = {
            WANDB_KEYS.get(k, k): v
            for k, v in record.items()
            if k not in NOT_LOGGED and isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        try:
            self.accelerator.log(values, step=step)
        except Exception as exc:  # noqa: BLE001
            self._fail("log", exc)

    def summary(self, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        try:
            run = self.accelerator.get_tracker("wandb", unwrap=True)
            run.summary.update(values)
        except Exception as exc:  # noqa: BLE001
            self._fail("summary", exc)

    def finish(self) -> None:
        """Close the W&B run. Not `accelerator.end_training()`: that also destroys the process group,
        which the run still needs afterwards (the last barrier), and would fail every multi-process run."""
        if not self.enabled:
            return
        try:
            for tracker in self.accelerator.trackers:
                tracker.finish()
        except Exception as exc:  # noqa: BLE001 - e.g. the TimeoutError of wandb's finish_timeout
            self.finish_failed = True
            self._fail("finish", exc)

    def _fail(self, what: str, exc: Exception) -> None:
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        print(
            f"warning: W&B {what} failed ({type(exc).__name__}: {first_line}); "
            "training continues, metrics.jsonl has every value",
            file=sys.stderr,
        )
        self.enabled = False
