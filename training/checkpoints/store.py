"""Checkpoints in one format for every strategy and process count, and loading one back into a single process.

A checkpoint folder holds the model's and the optimizer's state dicts by parameter name, written through
torch.distributed.checkpoint (DCP: every rank writes its shards, and a reader of any world size takes
the pieces it needs, so a checkpoint of FSDP over 2 processes resumes in one process and the other way
round), each rank's random states, the grad scaler, `train_state.json` (the loop's position and
measurements and the learning-rate schedule) and `origin.json` (who wrote it: strategy, process count,
and what a resume must match to continue exactly, checked by training/checkpoints/resume.py). All of it but the DCP
shards is JSON, so resuming unpickles nothing of ours; DCP's index (`.metadata`) is a pickle, read by PyTorch,
and a DCP entry stored as a pickled object is refused before any load (`pickled_problem`) and by the load itself.
It counts as complete only once `complete.json` is written, after every rank has finished writing:
an interrupted save is never resumed from. `complete.json` lists every file with its size and CRC-32,
so a checkpoint truncated or corrupted later (a full disk, a copy cut short) is recognised and skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import shutil
import sys
import threading
import time
import warnings
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from training.config import RunError
from training.distributed.faults import checkpoint_failure_told_once, during_checkpoint_write, inside_checkpoint_writer
from training.durable import sync_folder, write_atomic

if TYPE_CHECKING:  # only annotations need them: reading a checkpoint imports neither accelerate nor torch at first
    import torch
    from accelerate import Accelerator

CHECKPOINTS_DIR = "checkpoints"
COMPLETE_MARKER = "complete.json"
MODEL_CONFIG = "model_config.json"
TRAIN_STATE = "train_state.json"
ORIGIN = "origin.json"
# The layout's version, in origin.json; a checkpoint without it is an `accelerator.save_state` folder of
# earlier versions, whose layout depended on the strategy.
FORMAT = 2
MODEL_DIR = "model"  # DCP: the model's state dict, by parameter name
OPTIMIZER_DIR = "optimizer"  # DCP: the optimizer's tensors (moments, step counts), by parameter name
# The optimizer's param groups (learning rate, betas, ...: numbers, no tensors) as JSON: DCP would pickle them.
OPTIMIZER_GROUPS = "optimizer_param_groups.json"
RNG_DIR = "rng"  # rank_<i>.json: each rank's random states
SCALER = "grad_scaler.json"  # fp16's loss scale; absent without one
_CRC_CHUNK = 1 << 22
_ONE_PROCESS_WARNING = "torch.distributed is (disabled, )?unavailable or uninitialized"


@dataclass
class TrainState:
    """Position in the data and what has been measured so far; saved in every checkpoint."""

    step: int = 0
    epoch: int = 1
    steps_in_epoch: int = 0
    records: list[dict[str, Any]] = field(default_factory=list)
    # How many of the newest records no metrics line has covered yet (0 in checkpoints written before it was kept,
    # which held only logged records).
    unlogged: int = 0
    epochs: list[dict[str, Any]] = field(default_factory=list)
    times: dict[str, float] = field(default_factory=dict)

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "epoch": self.epoch,
            "steps_in_epoch": self.steps_in_epoch,
            "records": self.records,
            "unlogged": self.unlogged,
            "epochs": self.epochs,
            "times": self.times,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, value)


def checkpoint_path(output_dir: Path, step: int) -> Path:
    return output_dir / CHECKPOINTS_DIR / f"step_{step:07d}"


# A checkpoint folder's name: the step, zero-padded to 7 digits (wider past 10^7 steps). Anything after it
# (step_N.damaged, ...) is a folder set aside, which no listing counts.
_NAME = re.compile(r"step_(\d+)")
DAMAGED_SUFFIX = ".damaged"
ROLLED_BACK_SUFFIX = ".rolled_back"  # newer than a --resume_step (training/checkpoints/resume.py)
# A folder being deleted is renamed first: a deletion cut short (a crash, a kill) must not leave a folder
# under a checkpoint's name whose complete.json still stands over half its shards.
DELETING_SUFFIX = ".deleting"
# A --resume_step's roll-back decided but not yet done (training/checkpoints/resume.py record_rollback).
ROLLBACK_FILE = "rollback.json"


def step_of_name(path: Path) -> int | None:
    """The step a checkpoint folder's name says, or None for a name that is not a checkpoint's."""
    match = _NAME.fullmatch(path.name)
    return int(match.group(1)) if match else None


def checkpoint_folders(output_dir: Path) -> list[Path]:
    """Every checkpoint folder, complete or not (folders set aside left out), oldest step first."""
    root = output_dir / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and step_of_name(p) is not None]
    # By the step as a number: names sort as strings only up to 10^7 steps.
    return sorted(found, key=lambda p: step_of_name(p) or 0)


def complete_checkpoints(output_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest step first (folders set aside as damaged are not counted)."""
    return [p for p in checkpoint_folders(output_dir) if (p / COMPLETE_MARKER).is_file()]


def newest_checkpoint(output_dir: Path) -> Path | None:
    found = complete_checkpoints(output_dir)
    return found[-1] if found else None


def aside_name(path: Path, suffix: str) -> Path:
    """Where `set_aside` renames a checkpoint folder: its name and `suffix`, and a number after it when a folder of
    the same step was set aside so before."""
    target = path.with_name(path.name + suffix)
    number = 1
    while target.exists():
        target, number = path.with_name(f"{path.name}{suffix}.{number}"), number + 1
    return target


def set_aside(path: Path, suffix: str) -> Path:
    """Rename a checkpoint folder so that no listing counts it again, keeping its files for a person to look
    at (`aside_name`).

    The folder holding it is synced: a power loss must not bring back the old name, which every listing
    counts again (a rolled-back step_12 resumed from, a damaged one chosen)."""
    target = aside_name(path, suffix)
    path.rename(target)
    sync_folder(path.parent)
    return target


def kept_aside(output_dir: Path) -> list[Path]:
    """What checkpoints/ holds besides checkpoint folders and what the project may delete: the folders set aside for
    a person to look at (damaged, rolled back), and anything else, such as a folder a person renamed to look at
    (step_N.damaged-inspecting, step_N.bak). No launch of the project deletes them: only --overwrite, which
    replaces the whole run."""
    root = output_dir / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if not _known(p))


def _known(path: Path) -> bool:
    """A checkpoint folder (complete or cut short), or what the project leaves to be deleted or finished: a deletion
    cut short, a roll-back's note, a write's temporary file."""
    if path.is_dir() and step_of_name(path) is not None:
        return True
    if path.name == ROLLBACK_FILE or (path.name.startswith(".") and path.name.endswith(".tmp")):
        return True
    return _has_suffix(path, (DELETING_SUFFIX,))


def _has_suffix(path: Path, suffixes: tuple[str, ...]) -> bool:
    """step_N<suffix> or step_N<suffix>.<number>."""
    return any(re.fullmatch(rf"step_\d+{re.escape(suffix)}(\.\d+)?", path.name) for suffix in suffixes)


def nothing_to_continue(output_dir: Path) -> str:
    """The one line of a launch that would continue a run whose checkpoints are all set aside: it names them and
    the ways on, none of which deletes them but the one that says so."""
    names = ", ".join(p.name for p in kept_aside(output_dir))
    return (
        f"{output_dir / CHECKPOINTS_DIR} holds no intact checkpoint to continue, only folders set aside: {names} "
        f"(kept for a person to look at: never resumed from or deleted); to go on, either --overwrite (starts "
        f"afresh and deletes them), --init_from a verified checkpoint of another run (a new run from its weights, "
        f"in another --output_dir), or rename a folder whose files you restored back to step_N and --resume_step N"
    )


def set_aside_damaged(path: Path, problem: str) -> Path:
    """A checkpoint that failed verification: renamed step_N.damaged, with one warning line (main process)."""
    target = set_aside(path, DAMAGED_SUFFIX)
    if os.environ.get("RANK", "0") == "0":
        print(
            f"warning: checkpoint {path.name} is damaged ({problem}); set aside as {target.name}, never resumed from",
            file=sys.stderr,
            flush=True,
        )
    return target


def keep_decision(complete: list[Path], just_written: Path, newest_verified: Path | None, keep: int) -> list[Path]:
    """Which complete checkpoints (oldest step first) a save deletes: all but the newest `keep`, never the one
    just written and never the newest verified one, whatever `keep` says."""
    spared = {just_written, newest_verified}
    return [p for p in complete[: max(len(complete) - keep, 0)] if p not in spared]


def prune_checkpoints(output_dir: Path, just_written: Path, keep: int) -> None:
    """After `just_written` is marked complete: delete what `keep_decision` says, and interrupted saves.

    The checkpoint just written is verified by construction (its checksums are of the bytes just written), so
    when it is the newest nothing older needs reading. A newer complete one (a run resumed from an older
    step) is verified before anything is deleted: the damaged are set aside, and the newest verified kept.
    """
    complete = complete_checkpoints(output_dir)
    newest_verified = just_written
    for path in reversed(complete):
        if path == just_written or (step_of_name(path) or 0) < (step_of_name(just_written) or 0):
            break
        problem = checkpoint_problem(path)
        if problem is None:
            newest_verified = path
            break
        set_aside_damaged(path, problem)
    complete = complete_checkpoints(output_dir)
    for old in keep_decision(complete, just_written, newest_verified, keep):
        delete_folder(old)
    for partial in checkpoint_folders(output_dir):
        if partial != just_written and not (partial / COMPLETE_MARKER).exists():
            delete_folder(partial)
    sweep_deletions(output_dir)


def sweep_deletions(output_dir: Path) -> None:
    """Remove what a deletion cut short left (step_N.deleting): never a checkpoint, nor a folder set aside."""
    for leftover in (output_dir / CHECKPOINTS_DIR).glob(f"*{DELETING_SUFFIX}*"):
        if _has_suffix(leftover, (DELETING_SUFFIX,)):  # step_3.damaged.deleting-later is a person's, not ours
            shutil.rmtree(leftover, ignore_errors=True)


def delete_folder(path: Path) -> None:
    """Delete a checkpoint folder by renaming it out of every listing first (step_N.deleting), then its files."""
    shutil.rmtree(set_aside(path, DELETING_SUFFIX), ignore_errors=True)


def save_checkpoint(
    accelerator: Accelerator,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    output_dir: Path,
    step: int,
    model_config: dict[str, Any],
    keep: int,
    train_state: dict[str, Any] | None = None,
    origin: dict[str, Any] | None = None,
) -> Path:
    """Write a checkpoint on every rank, mark it complete, keep the newest `keep` complete ones; returns once
    it is complete (`start_checkpoint`, synchronous).

    `train_state`: what the loop needs besides the model's and optimizer's states (position, measurements,
    schedule); `origin`: who wrote it and what a resume must match (training/checkpoints/resume.py); both JSON, written
    by the main process.
    """
    pending = start_checkpoint(accelerator, model, optimizer, output_dir, step, model_config, keep, train_state, origin)
    pending.wait()
    return pending.path


@dataclass
class PendingSave:
    """A checkpoint being written: `future` gives the perf_counter time at which it was marked complete, or
    raises what failed writing it (the failing rank's own error, other ranks PeerCheckpointFailed)."""

    path: Path
    step: int
    started: float  # perf_counter when the save began
    blocked_s: float  # how long starting it paused training (for a synchronous save: the whole save)
    future: Future[float]
    asynchronous: bool

    def wait(self, timeout_s: float | None = None) -> float:
        """Block until the checkpoint is complete (or its write failed: raised); returns the seconds waited.

        TimeoutError after `timeout_s`: a write that hangs (a stalled file system) must end the run with its
        one line, not hold it for ever."""
        start = time.perf_counter()
        self.future.result(timeout=timeout_s)
        return time.perf_counter() - start

    @property
    def total_s(self) -> float:
        """Seconds from the start of the save to its complete.json, once done."""
        return self.future.result() - self.started


def background_groups(timeout_s: float) -> tuple[Any, Any] | None:
    """Process groups of their own for background saves, one per DCP save (model, optimizer), created on every
    rank at once; None in one process, where a save needs no collective.

    DCP's collectives run in a thread beside training's, and two threads' collectives on one group would
    interleave on the wire, so neither may share a group with training or with each other. gloo: async_save
    needs a CPU backend, whatever the device. `timeout_s` (--collective_timeout_s): a rank that died makes the
    others' background collectives fail after it, as training's do, instead of gloo's default 30 minutes."""
    import datetime

    import torch.distributed as dist

    if _single_process():
        return None
    timeout = datetime.timedelta(seconds=timeout_s)
    return dist.new_group(backend="gloo", timeout=timeout), dist.new_group(backend="gloo", timeout=timeout)


def start_checkpoint(
    accelerator: Accelerator,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    output_dir: Path,
    step: int,
    model_config: dict[str, Any],
    keep: int,
    train_state: dict[str, Any] | None = None,
    origin: dict[str, Any] | None = None,
    asynchronous: bool = False,
    groups: tuple[Any, Any] | None = None,
) -> PendingSave:
    """Begin a checkpoint on every rank; `save_checkpoint` describes it.

    Synchronous, it is written here and this returns once it is complete. `asynchronous` (with
    `background_groups()`'s groups) DCP's async_save copies the model's and optimizer's states to host memory
    and returns, training goes on, and a thread writes them, then makes every rank's files durable and has
    the main process mark the checkpoint complete and prune older ones: complete.json never comes before
    the files it lists are on disk. The caller waits on the returned save before the next one starts.
    """
    started = time.perf_counter()
    path = checkpoint_path(output_dir, step)
    if accelerator.is_main_process and path.exists():
        shutil.rmtree(path)  # a leftover of an interrupted save at the same step
    accelerator.wait_for_everyone()
    rank, main = accelerator.process_index, accelerator.is_main_process
    from torch.distributed.checkpoint.state_dict import get_state_dict

    # By parameter name, whatever wraps the model (DDP's `module.`, FSDP2's DTensor shards, checkpoint wrappers).
    model_state, optimizer_state = get_state_dict(model, _unwrapped(optimizer))
    stored_pickled = [name for state in (model_state, optimizer_state["state"]) for name in _not_tensors(state)]
    if stored_pickled:  # DCP would pickle them, and every resume refuses a checkpoint that holds one: before any write
        raise TypeError(f"a checkpoint stores tensors only; not tensors: {', '.join(stored_pickled)}")
    # The small files first, so that they are there when a background thread lists this rank's files.
    path.mkdir(parents=True, exist_ok=True)
    _save_small_states(accelerator, optimizer_state["param_groups"], path)
    if main:
        (path / MODEL_CONFIG).write_text(json.dumps(model_config, indent=2))
        if train_state is not None:
            (path / TRAIN_STATE).write_text(json.dumps(train_state))
        (path / ORIGIN).write_text(json.dumps({"format": FORMAT, **(origin or {})}, indent=2))
    writes = _save_tensors((model_state, optimizer_state["state"]), path, step, rank, asynchronous, groups)

    def complete() -> float:
        with checkpoint_failure_told_once(rank):
            for write in writes:
                write.result()
        during_checkpoint_write(step)  # GPT2S_FAULT's test-only fault (training/distributed/faults.py), if one is set
        _mark_complete(output_dir, path, step, keep, rank, main, None if groups is None else groups[0])
        return time.perf_counter()

    future = _in_background(complete) if asynchronous else _done(complete)
    return PendingSave(path, step, started, time.perf_counter() - started, future, asynchronous)


def _done(work: Callable[[], float]) -> Future[float]:
    """`work` run here, as a finished future; its exception is raised here, as a synchronous save's is."""
    future: Future[float] = Future()
    future.set_result(work())
    return future


def _in_background(work: Callable[[], float]) -> Future[float]:
    """`work` run in a daemon thread: a process that fails meanwhile exits without waiting on it."""
    future: Future[float] = Future()

    def run() -> None:
        try:
            future.set_result(work())
        except BaseException as exc:  # handed to whoever waits on the save
            future.set_exception(exc)

    threading.Thread(target=run, name="checkpoint-complete", daemon=True).start()
    return future


def _mark_complete(output_dir: Path, path: Path, step: int, keep: int, rank: int, main: bool, group: Any) -> None:
    """Each rank makes its own files durable and checksums them (in parallel, no rank re-reads another's);
    the main process gathers the lists (where every rank has finished writing) and marks the checkpoint."""
    import torch.distributed as dist

    manifest = _durable_manifest(path, _own_files(path, rank, main))
    parts = [manifest]
    if not _single_process():
        parts = [{}] * dist.get_world_size()
        dist.all_gather_object(parts, manifest, group=group)
    files = {name: entry for part in parts for name, entry in part.items()}
    if main:
        # Last, after every file is on disk: the marker that makes the checkpoint count, with what it must hold,
        # written whole or not at all and synced with its folder before anything older is deleted.
        write_atomic(path / COMPLETE_MARKER, json.dumps({"step": step, "files": files}), sync=True)
        sync_folder(path)
        sync_folder(path.parent)
        prune_checkpoints(output_dir, path, keep)
    if not _single_process():
        dist.barrier(group=group)  # every rank's save is done only once the checkpoint is complete


def _own_files(path: Path, rank: int, main: bool) -> list[Path]:
    """The files this rank wrote: its DCP shards (DCP names them __<rank>_<n>.distcp) and random states, and
    for the main process everything else (DCP's .metadata, the JSON files)."""
    found = []
    for file in sorted(path.rglob("*")):
        if not file.is_file() or file.name == COMPLETE_MARKER:
            continue
        shard = re.fullmatch(r"__(\d+)_\d+\.distcp", file.name)
        rng = re.fullmatch(r"rank_(\d+)\.json", file.name) if file.parent.name == RNG_DIR else None
        owner = int(shard.group(1)) if shard else int(rng.group(1)) if rng else None
        if owner == rank or (owner is None and main):
            found.append(file)
    return found


def _durable_manifest(folder: Path, files: list[Path]) -> dict[str, list[int]]:
    """Each file fsynced, then its folders; the files' sizes and CRC-32s by path in `folder`."""
    manifest = {}
    for file in files:
        with file.open("rb") as stream:
            os.fsync(stream.fileno())
        manifest[str(file.relative_to(folder))] = [file.stat().st_size, _crc32(file)]
    for parent in sorted({file.parent for file in files}):
        sync_folder(parent)
    return manifest


def _save_small_states(accelerator: Accelerator, param_groups: list[dict[str, Any]], path: Path) -> None:
    """This rank's random states; from the main process the optimizer's param groups and the grad scaler."""
    (path / RNG_DIR).mkdir(exist_ok=True)
    (path / RNG_DIR / f"rank_{accelerator.process_index}.json").write_text(json.dumps(rng_states()))
    if accelerator.is_main_process:
        (path / OPTIMIZER_GROUPS).write_text(json.dumps(param_groups))
        if accelerator.scaler is not None:
            (path / SCALER).write_text(json.dumps(accelerator.scaler.state_dict()))


def _not_tensors(state: dict[str, Any], prefix: str = "") -> list[str]:
    """The entries of a nested state dict that DCP would store as pickled objects (`pickled_entries`)."""
    import torch
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    found = []
    for key, value in state.items():
        if isinstance(value, dict):
            found += _not_tensors(value, f"{prefix}{key}.")
        elif not isinstance(value, (torch.Tensor, ShardedTensor)):
            found.append(f"{prefix}{key}")
    return found


def _save_tensors(
    states: tuple[dict[str, Any], dict[str, Any]],
    path: Path,
    step: int,
    rank: int,
    asynchronous: bool,
    groups: tuple[Any, Any] | None,
) -> list[Future[Any]]:
    """The model's and optimizer's states through DCP, each rank its part. Synchronous: written here, no
    futures. Else DCP's async_save: each copied to host memory here, written by a thread of DCP's, on a
    group of its own."""
    import torch.distributed.checkpoint as dcp

    single = _single_process()
    if single and asynchronous:
        # async_save's thread saves after _one_process_quiet has left: the same message, dropped for the process.
        warnings.filterwarnings("ignore", message=_ONE_PROCESS_WARNING)
    futures = []
    with _one_process_quiet():
        for index, (state, folder) in enumerate(zip(states, (MODEL_DIR, OPTIMIZER_DIR), strict=True)):
            writer = _writer(path / folder, step)
            if not asynchronous:
                with checkpoint_failure_told_once(rank):
                    dcp.save(state, storage_writer=writer, no_dist=single)
                continue
            group = None if groups is None else groups[index]
            futures.append(dcp.async_save(state, storage_writer=writer, process_group=group, no_dist=single))
    return futures


def _writer(folder: Path, step: int) -> Any:
    """DCP's file writer, without its fsync per file: each rank syncs its own files afterwards
    (`_durable_manifest`), together with their folders, which DCP does not sync. GPT2S_FAULT's write error
    fires inside it, where a full disk would."""
    import torch.distributed.checkpoint as dcp

    class Writer(dcp.FileSystemWriter):
        def write_data(self, plan: Any, planner: Any) -> Any:
            inside_checkpoint_writer(
                step
            )  # GPT2S_FAULT's test-only fault (training/distributed/faults.py), if one is set
            return super().write_data(plan, planner)

    return Writer(folder, sync_files=False)


def load_states(accelerator: Accelerator, model: torch.nn.Module, optimizer: Any, path: Path) -> bool:
    """Restore the model, optimizer, grad scaler and random states a checkpoint holds, at this world size.

    DCP re-shards the model and optimizer to this launch's layout. Each rank takes the random states its
    rank saved; under another number of processes there is no such correspondence (each rank draws its
    own dropout masks for its own share of the batch), so every rank takes the main process's states.
    Returns whether the random states are the saved ones of this very rank.
    """
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    # Templates laid out for this launch (with optimizer state initialised), filled in place by DCP.
    model_state, optimizer_state = get_state_dict(model, _unwrapped(optimizer))
    single = _single_process()
    _load_tensors(model_state, path / MODEL_DIR, single)
    _load_tensors(optimizer_state["state"], path / OPTIMIZER_DIR, single)
    optimizer_state["param_groups"] = _this_launchs_implementation(
        json.loads((path / OPTIMIZER_GROUPS).read_text()), _unwrapped(optimizer).param_groups
    )
    set_state_dict(model, _unwrapped(optimizer), model_state_dict=model_state, optim_state_dict=optimizer_state)
    if accelerator.scaler is not None and (path / SCALER).is_file():
        accelerator.scaler.load_state_dict(json.loads((path / SCALER).read_text()))
    own = path / RNG_DIR / f"rank_{accelerator.process_index}.json"
    same_rank = saved_num_processes(path) == accelerator.num_processes
    set_rng_states(json.loads((own if same_rank else path / RNG_DIR / "rank_0.json").read_text()))
    return same_rank


# How the optimizer computes its update, not what: this launch's levers choose (--fused_adamw), and the run record
# says so; torch's load_state_dict would take the checkpoint's (a run saved unfused would resume unfused).
_IMPLEMENTATION_KEYS = ("fused", "foreach", "capturable")


def _this_launchs_implementation(saved: list[dict[str, Any]], live: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The saved param groups with this launch's implementation flags, set before the load, so that the load also
    places the step counts as this implementation keeps them (on the device for a fused one)."""
    return [
        {**group, **{k: own[k] for k in _IMPLEMENTATION_KEYS if k in own}}
        for group, own in zip(saved, live, strict=True)
    ]


def pickled_entries(metadata: Any) -> list[str]:
    """The entries of a DCP index (`.metadata`, unpickled) stored as pickled Python objects: DCP's load would read
    them with torch.load(weights_only=False), which runs whatever code they name. The project writes none."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    return [name for name, entry in metadata.state_dict_metadata.items() if isinstance(entry, BytesStorageMetadata)]


def pickled_refusal(folder: Path, names: list[str]) -> str:
    """The one line that refuses a DCP folder holding pickled objects."""
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (
        f"{folder}/.metadata declares {shown} as pickled Python objects, which torch.distributed.checkpoint would "
        f"load with torch.load(weights_only=False), able to run any code; this project writes tensors only, so it "
        f"did not write this checkpoint: refused (load checkpoints only from sources you trust)"
    )


# What unpickling a file that is not the pickle it should be raises, besides OSError and ValueError.
UNPICKLING_ERRORS: tuple[type[Exception], ...] = (
    pickle.UnpicklingError,
    EOFError,
    AttributeError,
    ImportError,
    IndexError,
    KeyError,
    TypeError,
)


def read_index(folder: Path) -> Any:
    """DCP's index of `folder` (`.metadata`, unpickled: see docs/faults.md on trusting a source); ValueError, one
    line, for one that cannot be read, whatever unpickling it raised."""
    import torch.distributed.checkpoint as dcp

    try:
        return dcp.FileSystemReader(str(folder)).read_metadata()
    except (OSError, ValueError, *UNPICKLING_ERRORS) as exc:  # changed since it was verified, or not DCP's
        raise ValueError(f"{folder}/.metadata cannot be read ({type(exc).__name__}: {exc})") from exc


def pickled_problem(path: Path) -> str | None:
    """`pickled_refusal` for the first of a checkpoint's DCP folders (model, optimizer) that holds pickled objects;
    None when both hold tensors only. Reading each index unpickles it: see docs/faults.md on trusting a source."""
    for folder in (path / MODEL_DIR, path / OPTIMIZER_DIR):
        try:
            metadata = read_index(folder)
        except ValueError as exc:
            return str(exc)
        names = pickled_entries(metadata)
        if names:
            return pickled_refusal(folder, names)
    return None


class PickledEntry(ValueError):
    """A DCP load met an entry it would unpickle (`pickled_refusal`)."""


def _load_tensors(state: dict[str, Any], folder: Path, single: bool) -> None:
    """DCP's load of `folder` into `state`, with its default planner but for the one read that would unpickle,
    which raises PickledEntry instead: the checks before a load name it in one line (`pickled_problem`), this
    stops a folder changed since. Raised as this rank's own error, not inside DCP's report of every rank's
    failures (a BaseException)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    class TensorsOnly(dcp.DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: Any) -> None:
            raise PickledEntry(pickled_refusal(folder, [read_item.dest_index.fqn]))

    try:
        with _one_process_quiet():
            dcp.load(state, checkpoint_id=folder, planner=TensorsOnly(), no_dist=single)
    except CheckpointException as exc:
        refused = [own for own, _trace in exc.failures.values() if isinstance(own, PickledEntry)]
        if refused:
            raise refused[0] from None
        raise


def load_model_weights(model: torch.nn.Module, path: Path) -> None:
    """Only the model's weights of a checkpoint (any strategy and process count), re-sharded by DCP into this
    launch's prepared model, as `load_states` loads them; the optimizer, schedule and random states are left."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    model_state = get_model_state_dict(model)
    _load_tensors(model_state, path / MODEL_DIR, _single_process())
    set_model_state_dict(model, model_state)


def _unwrapped(optimizer: Any) -> Any:
    """The torch optimizer inside accelerate's AcceleratedOptimizer (DCP asks its param_groups and state)."""
    return getattr(optimizer, "optimizer", optimizer)


def _single_process() -> bool:
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized())


@contextlib.contextmanager
def _one_process_quiet() -> Iterator[None]:
    """DCP warns at every save and load in one process that it assumes one process, which is the case here;
    only that message is dropped."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_ONE_PROCESS_WARNING)
        yield


def saved_num_processes(path: Path) -> int:
    """How many processes wrote the checkpoint: one random-state file each."""
    return len(list((path / RNG_DIR).glob("rank_*.json")))


def rng_states() -> dict[str, Any]:
    """This process's random states (Python, NumPy, torch's CPU and current CUDA generators) as JSON values."""
    import random

    import numpy as np
    import torch

    kind, keys, position, has_gauss, cached = np.random.get_state()
    states: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": [kind, keys.tolist(), position, has_gauss, cached],
        "torch": torch.get_rng_state().tolist(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state().tolist()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    """Put back what `rng_states` returned (read back from JSON: tuples came back as lists)."""
    import random

    import numpy as np
    import torch

    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, position, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), position, has_gauss, cached))
    torch.set_rng_state(torch.tensor(states["torch"], dtype=torch.uint8))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state(torch.tensor(states["cuda"], dtype=torch.uint8))


def checkpoint_step(path: Path) -> int:
    return int(json.loads((path / COMPLETE_MARKER).read_text())["step"])


def read_origin(path: Path) -> dict[str, Any] | None:
    """origin.json of a checkpoint (format, writer, what a resume must match); None for an earlier layout."""
    file = path / ORIGIN
    return json.loads(file.read_text()) if file.is_file() else None


def _crc32(path: Path) -> int:
    crc = 0
    with path.open("rb") as f:
        while chunk := f.read(_CRC_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def checkpoint_problem(path: Path) -> str | None:
    """Why a complete checkpoint cannot be trusted (a file missing, truncated or changed), or None."""
    try:
        marker = json.loads((path / COMPLETE_MARKER).read_text())
    except (OSError, ValueError):
        return f"{COMPLETE_MARKER} is unreadable"
    listed = marker.get("files") if isinstance(marker, dict) else None
    if not isinstance(listed, dict):
        return "written by an earlier version of this project (no file list to verify); resuming it is not supported"
    for name, (size, crc) in listed.items():
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != size:
            return f"{name} has {file.stat().st_size} bytes, {size} were written"
        if _crc32(file) != crc:
            return f"{name} is corrupted (checksum differs from the one written)"
    return None


def newest_good_checkpoint(output_dir: Path) -> Path:
    """The newest complete checkpoint whose files are intact; each damaged one newer than it is set aside
    (step_N.damaged, one warning line), so that no later listing counts or chooses it.

    Raises RunError (one line) when there is none: `nothing_to_continue` when folders are set aside.
    """
    found = complete_checkpoints(output_dir)
    for path in reversed(found):
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        set_aside_damaged(path, problem)
    if kept_aside(output_dir):
        raise RunError(nothing_to_continue(output_dir))
    raise RunError(f"--resume: no complete checkpoint in {output_dir / CHECKPOINTS_DIR}; run without --resume")


def read_train_state(path: Path) -> dict[str, Any]:
    return json.loads((path / TRAIN_STATE).read_text())


def is_checkpoint_or_run(path: Path) -> bool:
    """A complete checkpoint folder, or a run directory holding one."""
    return (path / COMPLETE_MARKER).is_file() or newest_checkpoint(path) is not None


def earlier_layout_error(path: Path) -> str:
    """The one line that refuses a checkpoint of the earlier, strategy-dependent layout."""
    return (
        f"{path} was written by an earlier version of this project (accelerate's save_state layout, which "
        f"depends on the strategy); this version reads only its own checkpoints: load it with the version "
        f"that wrote it, or start a new run"
    )


def load_model_state_dict(path: Path) -> dict[str, Any]:
    """The full model state dict of a checkpoint written by any strategy and process count, read in one process."""
    import torch
    import torch.distributed.checkpoint as dcp

    model_dir = path / MODEL_DIR
    if not (model_dir / ".metadata").is_file():
        # ValueError: what the export and sampling commands report as one `error:` line.
        raise ValueError(earlier_layout_error(path) if read_origin(path) is None else f"{model_dir}: no DCP metadata")
    # Empty full-size tensors, laid out as DCP's metadata says, which it fills from whichever shards hold them.
    metadata = read_index(model_dir)
    pickled = pickled_entries(metadata)
    if pickled:
        raise ValueError(pickled_refusal(model_dir, pickled))
    state = {
        name: torch.empty(entry.size, dtype=entry.properties.dtype)
        for name, entry in metadata.state_dict_metadata.items()
        if isinstance(entry, dcp.metadata.TensorStorageMetadata)
    }
    _load_tensors(state, model_dir, single=True)
    return state


def load_model_from_checkpoint(path: str | Path):  # -> model.GPT2
    """Rebuild the trained GPT2 from a checkpoint folder (or a run directory: its newest checkpoint)."""
    from model import GPT2, GPT2Config

    path = Path(path)
    if not (path / COMPLETE_MARKER).is_file():
        newest = newest_checkpoint(path)
        if newest is None:
            raise FileNotFoundError(f"{path}: not a complete checkpoint and holds no {CHECKPOINTS_DIR}/step_*")
        path = newest
    config = GPT2Config.from_dict(json.loads((path / MODEL_CONFIG).read_text()))
    model = GPT2(config)
    state = load_model_state_dict(path)
    # The tied lm_head may be stored once or twice; the tie restores it.
    state.setdefault("lm_head.weight", state["transformer.wte.weight"])
    model.load_state_dict(state)
    return model
