"""Train the from-scratch GPT-2 under the strategy given by the accelerate launch config.

    python train.py --preset tiny
    accelerate launch --config_file accelerate_configs/fsdp.yaml train.py --preset gpt2 --data articles*.csv

`python train.py --help` lists every flag. See README.md and docs/run_directory.md.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import sys
import threading
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from training.config import TrainConfig


def main(argv: list[str] | None = None) -> int:
    from training.versions import told_by, untested_releases, version_problem

    problem = version_problem()  # before anything imports torch or accelerate: one line, not a crash at step N
    # Below the declared bounds it stops; above the newest tested it says so once and goes on.
    kind, message = ("error", problem) if problem else ("warning", untested_releases())
    line = told_by(kind, message, os.environ, socket.gethostname()) if message else None
    if line:
        print(line, file=sys.stderr, flush=True)
    if problem:
        with contextlib.suppress(ImportError):  # no torch at all: no process group to leave
            _leave_together()
        return 2

    from training.cli import parse_config

    try:
        config = parse_config(argv)
    except ValueError as exc:  # a config dataclass rejected a value
        if os.environ.get("RANK", "0") == "0":
            print(f"error: {exc}", file=sys.stderr, flush=True)
        _leave_together()
        return 2

    from data import DataError
    from training.distributed import registry
    from training.distributed.faults import RankFailed
    from training.distributed.strategy import StrategyMismatch
    from training.loop import RunError, run_training

    if config.run.strategy == registry.AUTO and os.environ.get("RANK", "0") == "0":
        _say_what_the_plan_picks(config)

    try:
        summary = run_training(config)
    except (DataError, RunError, StrategyMismatch, ValueError, FileNotFoundError) as exc:
        # Every rank fails the same way (set-up agrees on failures); one line from the first is enough.
        if os.environ.get("RANK", "0") == "0":
            print(f"error: {exc}", file=sys.stderr, flush=True)
        _leave_together()
        return 3 if isinstance(exc, StrategyMismatch) else 2
    except RankFailed as failure:
        return _tell_rank_failure(failure, config.run.output_dir)
    stop = summary.get("stop")
    if stop is None:
        return 0
    if os.environ.get("RANK", "0") == "0":
        print(f"{'error' if stop['reason'] == 'nonfinite' else 'stopped'}: {stop['message']}", file=sys.stderr)
    return int(stop["exit_status"])


def _tell_rank_failure(failure: Exception, output_dir: str) -> int:
    """One `error:` line from the process that failed (its traceback kept in the run folder); nothing from
    one that only saw it go. No collective: the others are not waiting in the same one."""
    import signal
    import traceback
    from pathlib import Path

    from training.distributed.faults import EXIT_RANK_FAILED

    if failure.quiet:
        return 128 + signal.SIGTERM  # stopped by the launcher after another process failed
    where = Path(output_dir) / f"failure-rank{os.environ.get('RANK', '0')}.txt"
    try:
        where.write_text("".join(traceback.format_exception(failure.__cause__ or failure)))
        kept = f" (traceback: {where})"
    except OSError:  # the failure may be the disk's: the traceback then goes to the console
        traceback.print_exception(failure.__cause__ or failure)
        kept = ""
    print(f"error: {failure}{kept}", file=sys.stderr, flush=True)
    return EXIT_RANK_FAILED


def _say_what_the_plan_picks(config: TrainConfig) -> None:
    """--strategy auto on a GPU: one line when the plan, on this device, would launch another strategy."""
    import torch

    if not torch.cuda.is_available():  # no GPU, nothing to plan: the planner is not even imported
        return
    from planner.launch import cuda_device, startup_note
    from planner.request import DEFAULT_MFU
    from training.distributed.strategy import precision_name, requested_from_env

    launched = requested_from_env(os.environ)
    device = cuda_device(launched.world_size or 1)
    if device is not None:
        note = startup_note(config, launched.strategy, precision_name(launched.mixed_precision), device, DEFAULT_MFU)
        if note:
            print(note, file=sys.stderr, flush=True)


def _leave_together() -> None:
    """After a failure every process agreed on: wait for all (so the first has printed its line before
    torchrun, seeing one process end, stops the others), then close the process group.

    A process that exits with its gloo group open can abort in C++ ("terminate called without an
    active exception", SIGABRT) instead of ending with its status. A failure found before the group
    exists (a config value, the strategy the launch gives) is the same in every process; they meet in a
    group of their own for the wait, else on a loaded machine the first was stopped before its line was out.
    """
    import datetime

    import torch.distributed as dist

    if not dist.is_available():
        return
    if not dist.is_initialized():
        if int(os.environ.get("WORLD_SIZE", "1")) < 2 or "MASTER_ADDR" not in os.environ:
            return
        try:
            dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
        except (RuntimeError, ValueError):  # the others are gone already: nothing to wait for
            return
    dist.barrier()
    dist.destroy_process_group()


def exit_without_teardown(status: int) -> NoReturn:
    """End the process as the interpreter would (other threads joined, exit handlers run, output flushed),
    but without tearing the interpreter down.

    A gloo worker thread drops its last reference to a finished collective (and to the tensors in it)
    a moment after the waiting thread has woken. On a loaded machine that moment can fall inside the
    interpreter's teardown, where releasing a tensor that Python knew needs the GIL, and the process
    aborts (SIGABRT, "terminate called without an active exception") after a run that finished and wrote
    everything. destroy_process_group does not prevent it: FSDP's per-module state keeps the process
    groups alive past the run (gc cannot free it), so their worker threads live until the teardown.
    """
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # the run-directory lock's release, W&B's and logging's handlers
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe or stream: nothing left to say
            stream.flush()
    os._exit(status)


if __name__ == "__main__":
    exit_without_teardown(main())
