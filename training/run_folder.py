"""The run directory: one run per directory (and one at a time: its lock), what a resume rewrites, and
whether every machine of a job sees it.

Whether every machine of a job sees the one output folder, checked at start-up, before anything is written.

A job over several machines writes one run folder: rank 0 writes the records, every rank its checkpoint
shards, and a resume reads all of them on every rank. With a folder of each machine's own (a node-local disk
at the same path, or another --output_dir per machine) the job would train to its end, and then
`complete.json` would list machine 0's files only and no other machine could read the checkpoint back. So rank
0 writes a probe file of a name no other launch uses, every rank looks for it, and the ranks that cannot
see it are named, by machine, in one line. The same path on two machines proves nothing; the probe's name,
drawn at random, does.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import re
import shutil
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from training.checkpoints.resume import checkpoint_at_step, pending_rollback, record_rollback, rolled_back_names
from training.checkpoints.store import (
    complete_checkpoints,
    kept_aside,
    newest_good_checkpoint,
    nothing_to_continue,
    sweep_deletions,
)
from training.config import RunError
from training.durable import sync_folder, write_atomic

if TYPE_CHECKING:
    from training.config import RunConfig

_RUN_FILES = ("metrics.jsonl", "summary.json", "config.json", "wandb_run_id")
_RUN_DIRS = ("checkpoints", "hf", "wandb")


def check_output_dir(
    out: Path, resume: bool, overwrite: bool, auto_resume: bool = False, resume_step: int | None = None
) -> Path | None:
    """Refuse to mix two runs in one directory; return the checkpoint to resume from, if any.

    `auto_resume`: the newest intact checkpoint when there is a complete one, else None (the caller then
    starts afresh, replacing what an attempt that crashed before its first checkpoint left); a finished run
    without a checkpoint is refused rather than replaced, and so is a run whose checkpoints are all set aside
    (damaged, rolled back), which are kept for a person to look at. `resume_step`: that step's verified
    checkpoint, whatever is newer (training/checkpoints/resume.py).
    """
    if resume_step is not None:
        return checkpoint_at_step(out, resume_step)
    holds_run = any((out / f).exists() for f in _RUN_FILES + _RUN_DIRS)
    if resume or (auto_resume and complete_checkpoints(out)):
        return newest_good_checkpoint(out)
    if auto_resume and kept_aside(out):
        raise RunError(nothing_to_continue(out))
    if auto_resume and (out / "summary.json").exists():  # finished, with no checkpoint to continue from
        raise RunError(
            f"{out} holds a finished run and no checkpoint: --auto_resume has nothing to continue; "
            "pass --overwrite to replace it"
        )
    if auto_resume:
        return None
    if holds_run and not overwrite:
        raise RunError(f"{out} already holds a run; pass --resume to continue it or --overwrite to replace it")
    return None


def claim_output_dir(out: Path, run: RunConfig, restart: int) -> Path | None:
    """What a launch holding the folder's lock does with it: the checkpoint to resume from, or None for a fresh
    start, for which the folder is cleared when --overwrite asks or --auto_resume finds nothing to continue.

    `restart`: which restart of a torchrun job this is. A restart reruns the same command: it must continue, not
    refuse the folder or start over, so it behaves as --auto_resume, ignores --overwrite, and continues the
    newest checkpoint (--resume_step rolled back when the job first started), unless a roll-back decided by an
    earlier launch is still to be done (`pending_rollback`): then it, and an --auto_resume or --resume, continues
    that step's checkpoint and finishes the roll-back.
    """
    auto_resume = run.auto_resume or restart > 0
    overwrite = run.overwrite and not restart
    if run.overwrite and restart and _cleared_in_part(out):  # the first attempt was killed while replacing the run
        clear_run_files(out)
    own_step = None if restart else run.resume_step  # the user's own choice replaces a note left unreadable
    pending = pending_rollback(out) if own_step is None and (auto_resume or run.resume) and not overwrite else None
    resume_step = own_step if own_step is not None else pending
    resume_from = check_output_dir(out, run.resume, overwrite, auto_resume, resume_step)
    if resume_from is not None and run.resume_step is not None and not restart:
        # Noted now, before the data and the model are built: a first attempt that dies there must not leave its
        # restart to continue the checkpoint the user rolled back from.
        record_rollback(resume_from, rolled_back_names(resume_from))
    if overwrite or (auto_resume and resume_from is None):
        clear_run_files(out)
    sweep_deletions(out)  # a deletion cut short by the launch before, not left until the next save
    _sweep_cleared(out)
    return resume_from


_CLEARING = ".deleting-"


def clear_run_files(out: Path) -> None:
    """Delete a run's files. Its folders are first renamed out of the way (NAME.deleting-ID, synced), then the
    files, summary.json first, then the folders' contents: a kill part-way leaves no checkpoints/ that a restart
    would continue, only leftovers the next claim sweeps (`_sweep_cleared`)."""
    doomed = [_renamed_for_deletion(out / name) for name in _RUN_DIRS if (out / name).exists()]
    if doomed:
        sync_folder(out)
    for name in sorted(_RUN_FILES, key=lambda name: name != "summary.json"):
        (out / name).unlink(missing_ok=True)
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)


def _renamed_for_deletion(path: Path) -> Path:
    target = path.with_name(f"{path.name}{_CLEARING}{uuid.uuid4().hex[:8]}")
    path.rename(target)
    return target


def _sweep_cleared(out: Path) -> None:
    """Remove what a clear cut short left (`clear_run_files`)."""
    for leftover in _cleared_in_part(out):
        shutil.rmtree(leftover, ignore_errors=True)


def _cleared_in_part(out: Path) -> list[Path]:
    """The folders a clear renamed for deletion and has not deleted yet (the names `_renamed_for_deletion` gives)."""
    return [
        leftover
        for name in _RUN_DIRS
        for leftover in out.glob(f"{name}{_CLEARING}*")
        if re.fullmatch(rf"{name}{_CLEARING}[0-9a-f]{{8}}", leftover.name)
    ]


@dataclass(frozen=True)
class MetricsCut:
    """What a resume keeps of metrics.jsonl: its lines up to the checkpoint's step, and the number of a torn last
    line it drops, if any."""

    path: Path
    kept: list[str]
    torn_line: int | None

    def warning(self) -> str | None:
        if self.torn_line is None:
            return None
        return (
            f"warning: {self.path}: line {self.torn_line} is cut short (a write interrupted by a kill or a full "
            f"disk); dropped, its steps are logged again"
        )


def metrics_cut(path: Path, last_step: int) -> MetricsCut:
    """The lines of metrics.jsonl a resume from `last_step` keeps (reads only).

    The sink appends one line per record, so a write cut short breaks the last line alone: it is dropped. A broken
    line before it is not a cut write (the file was changed since): RunError, one line naming the file and line.
    """
    if not path.exists():
        return MetricsCut(path, [], None)
    numbered = [(n, line) for n, line in enumerate(_text(path).splitlines(), 1) if line.strip()]
    kept, torn = [], None
    for index, (number, line) in enumerate(numbered):
        record = _record(line)
        if record is None and index < len(numbered) - 1:
            raise RunError(
                f"{path}: line {number} is not a JSON record, and only the last line can be a write cut short: "
                f"repair or remove that line and resume again (or start afresh with --overwrite)"
            )
        if record is None:
            torn = number
        elif record.get("step", 0) <= last_step:
            kept.append(line)
    return MetricsCut(path, kept, torn)


def _text(path: Path) -> str:
    # A write cut inside a multi-byte character must not stop the read: that line is dropped anyway.
    return path.read_bytes().decode("utf-8", errors="replace")


def _record(line: str) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def truncate_metrics(path: Path, last_step: int) -> str | None:
    """After a resume, drop metric lines of steps that will be trained again, and a torn last line
    (`metrics_cut`); returns the warning for a torn line it dropped."""
    if not path.exists():
        return None
    cut = metrics_cut(path, last_step)
    write_atomic(path, "".join(line + "\n" for line in cut.kept))
    return cut.warning()


def wandb_run_id(out: Path) -> str:
    """A W&B run id kept in the run directory, so a resumed run continues the same W&B run."""
    path = out / "wandb_run_id"
    if path.exists():
        return path.read_text().strip()
    run_id = uuid.uuid4().hex[:12]
    path.write_text(run_id)
    return run_id


# ---------------------------------------------------------------------------------------------
# One run per directory at a time

LOCK_FILE = ".lock"


class RunLock:
    """An exclusive lock on a run directory, held by one process of the job from set-up to exit.

    fcntl.flock, so the kernel drops it when the holder dies however it dies (kill -9 included): a
    lock that can be taken is free, whatever the file says. The file names the holder (pid, host) so a
    refused launch can say who holds the folder, and so a lock left by a killed run can be reported
    when it is taken over. A holder that ends normally empties the file (atexit) before letting go.
    The file is never deleted: a launch that opened it just before a delete would lock a file that no
    longer has a name, and two runs would both think they hold the folder.
    """

    def __init__(self, stream: TextIO, path: Path) -> None:
        self._stream = stream
        self.path = path

    def release(self) -> None:
        """Empty the file (no holder named), then let go; a second call does nothing (atexit calls it too)."""
        if self._stream.closed:
            return
        self._stream.seek(0)
        self._stream.truncate()
        self._stream.flush()
        fcntl.flock(self._stream, fcntl.LOCK_UN)
        self._stream.close()


def lock_holder() -> str:
    return f"pid {os.getpid()} on {socket.gethostname()}"


def acquire_run_lock(out: Path) -> tuple[RunLock, str | None]:
    """Take OUT/.lock without waiting; return the lock and the holder a killed run left named, if any.

    Raises RunError (one line) when a live run holds it.
    """
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK_FILE
    stream = open(path, "a+", encoding="utf-8")  # "a+": create if missing, never truncate another's record
    try:
        fcntl.flock(stream, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        stream.seek(0)
        holder = stream.read().strip() or "another process"
        stream.close()
        raise RunError(
            f"{out} is in use by a running training run ({holder}); wait for it to end or choose another --output_dir"
        ) from None
    stream.seek(0)
    left = stream.read().strip() or None
    stream.seek(0)
    stream.truncate()
    stream.write(lock_holder() + "\n")
    stream.flush()
    lock = RunLock(stream, path)
    atexit.register(lock.release)
    return lock, left


def stale_lock_warning(out: Path, left: str) -> str:
    """The one line for a lock whose named holder no longer holds it: a run that was killed (kill -9, out of memory)."""
    return f"warning: {out / LOCK_FILE} names {left}, which no longer holds it (a killed run?); taking the folder over"


# ---------------------------------------------------------------------------------------------
# Whether every machine sees the folder

PROBE_PREFIX = ".shared-folder-probe-"
# A shared file system may show another machine's new file a moment late; a folder that is not shared never
# shows it, so this wait is spent only on the way to the error.
SEE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Sighting:
    """What one rank found: whether it sees rank 0's probe, and where it runs."""

    rank: int
    node: int  # the machine's rank in the job (torchrun's GROUP_RANK)
    host: str
    seen: bool


def write_probe(out: Path) -> tuple[Path, bool]:
    """Rank 0's probe in `out`: its path (the name is its content) and whether this created `out`."""
    created = not out.exists()
    probe = out / f"{PROBE_PREFIX}{uuid.uuid4().hex}"
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe.write_text(probe.name)
    except OSError as exc:
        raise RunError(f"--output_dir {out} cannot be written: {exc}") from None
    return probe, created


def sees(probe: Path, timeout_s: float = SEE_TIMEOUT_S) -> bool:
    """Whether this process finds rank 0's probe (by name and content) within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if probe.read_text() == probe.name:
                return True
        except OSError:
            pass  # not there (yet)
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def own_sighting(rank: int, probe: Path, timeout_s: float = SEE_TIMEOUT_S) -> Sighting:
    return Sighting(rank, int(os.environ.get("GROUP_RANK", "0")), socket.gethostname(), sees(probe, timeout_s))


def unshared_error(out: Path, sightings: list[Sighting]) -> str | None:
    """The one line naming the machines that cannot see rank 0's probe in `out`; None when every rank sees it."""
    blind = [s for s in sightings if not s.seen]
    if not blind:
        return None
    writer = next(s for s in sightings if s.rank == 0)
    nodes = sorted({s.node for s in blind})
    machines = ", ".join(_machine(node, [s for s in blind if s.node == node]) for node in nodes)
    return (
        f"--output_dir {out} is not one folder that every machine of the job sees: rank 0 (machine "
        f"{writer.node}, host {writer.host}) wrote a probe file there that {machines} cannot see. Give an "
        f"--output_dir on a file system every machine mounts at the same path; for a folder of each machine's "
        f"own, run each machine as a job of its own"
    )


def _machine(node: int, blind: list[Sighting]) -> str:
    ranks = ", ".join(str(s.rank) for s in sorted(blind, key=lambda s: s.rank))
    return f"machine {node} (host {blind[0].host}, rank{'s' if len(blind) > 1 else ''} {ranks})"


def remove_probe(probe: Path, created: bool, shared: bool) -> None:
    """Rank 0 removes its probe once every rank has looked, and the folder too when it made it for a job that
    is refused: a refused launch leaves nothing behind."""
    probe.unlink(missing_ok=True)
    if created and not shared:
        try:
            probe.parent.rmdir()
        except OSError:
            pass  # something else was put there meanwhile: left as it is
