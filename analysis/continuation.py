"""Continuing an interrupted experiment: the same command again keeps what finished, resumes what was cut
short and launches only what is missing.

Kaggle's time limit or a Colab disconnect stops `python -m analysis.experiment` (or the notebook) half-way.
Run again with the same arguments, each run folder says where its run got to:

- finished (summary.json says complete): kept, not launched again;
- stopped after a checkpoint: launched with --resume, on the world size of this launch (train.py decides
  whether the checkpoint continues there and refuses in one line if not);
- started without any complete checkpoint: launched afresh with --overwrite (nothing worth keeping);
- absent: launched.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from training.checkpoints.store import checkpoint_step, newest_checkpoint


class _Launch(Protocol):
    """What continuing needs of a launch (analysis.experiment.Launch, a frozen dataclass)."""

    argv: tuple[str, ...]
    run_dir: Path


L = TypeVar("L", bound=_Launch)


class RunProgress(Enum):
    FINISHED = "kept"
    CHECKPOINTED = "resumed"
    STARTED = "restarted"
    ABSENT = "launched"


# train.py's flags that decide what happens to a folder already holding a run: the user's choice stands.
_FOLDER_FLAGS = ("--resume", "--overwrite")
AUTO_RESUME = "--auto_resume"  # train.py continues or starts afresh by itself; only finished runs are kept


def run_progress(run_dir: Path) -> RunProgress:
    """How far the run in `run_dir` got, from its own files."""
    try:
        finished = json.loads((run_dir / "summary.json").read_text(encoding="utf-8")).get("complete") is True
    except (OSError, ValueError, AttributeError):
        finished = False
    if finished:
        return RunProgress.FINISHED
    if newest_checkpoint(run_dir) is not None:
        return RunProgress.CHECKPOINTED
    if run_dir.is_dir() and any(run_dir.iterdir()):
        return RunProgress.STARTED
    return RunProgress.ABSENT


@dataclass(frozen=True)
class Continuation(Generic[L]):
    """Each run of the experiment with how far it got; `launches`: what is left to run, flags adjusted."""

    progress: dict[Path, RunProgress]
    launches: list[L]
    resumed_at: dict[Path, int]  # the step each resumed run continues from

    def lines(self, labels: dict[Path, str]) -> list[str]:
        """One line each: kept, resumed, restarted (only when there are such runs), launched."""
        out = []
        for progress in RunProgress:
            runs = [d for d, p in self.progress.items() if p is progress]
            if not runs and progress is RunProgress.STARTED:
                continue
            names = [
                f"{labels[d]} (from step {self.resumed_at[d]})" if d in self.resumed_at else labels[d] for d in runs
            ]
            out.append(f"{progress.value}: {', '.join(names) if names else 'none'}")
        return out


def recorded_experiment(out: Path) -> str | None:
    """The experiment name (W&B group) the runs already in OUT were launched with, if any: continuing without
    --experiment keeps the group instead of naming a new one after the time."""
    for config in sorted((out / "runs").glob("**/config.json")):
        try:
            name = json.loads(config.read_text(encoding="utf-8")).get("run", {}).get("experiment")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(name, str) and name:
            return name
    return None


def earlier_runs(out: Path) -> list[dict]:
    """The rows of OUT/runs/order.json that launches before an interruption wrote (none when unreadable)."""
    try:
        rows = json.loads((out / "runs" / "order.json").read_text(encoding="utf-8"))["runs"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return rows if isinstance(rows, list) else []


def continue_experiment(launches: list[L]) -> Continuation[L]:
    """What to run of `launches` given what their folders hold. When train.py's extra flags already say what
    to do with a folder (--extra --overwrite, say), every launch runs as given; with --auto_resume the
    finished runs are kept and train.py decides for the others."""
    if any(flag in launch.argv for launch in launches for flag in _FOLDER_FLAGS):
        return Continuation({launch.run_dir: RunProgress.ABSENT for launch in launches}, list(launches), {})
    progress, left, resumed_at = {}, [], {}
    for launch in launches:
        state = progress[launch.run_dir] = run_progress(launch.run_dir)
        if state is RunProgress.FINISHED:
            continue
        if AUTO_RESUME in launch.argv:
            left.append(launch)
        elif state is RunProgress.CHECKPOINTED:
            resumed_at[launch.run_dir] = checkpoint_step(newest_checkpoint(launch.run_dir))
            left.append(replace(launch, argv=(*launch.argv, "--resume")))
        elif state is RunProgress.STARTED:
            left.append(replace(launch, argv=(*launch.argv, "--overwrite")))
        else:
            left.append(launch)
    return Continuation(progress, left, resumed_at)
