"""One process failing alone, every process killed during a checkpoint write, and torchrun's automatic
restart, with real two-process DDP launches made to fail by GPT2S_FAULT (training/distributed/faults.py).

The launches take the shared runs' flags (tests/launch.py shared_args: 12 steps, seed 3, a checkpoint every 3),
so the shared DDP run is the uninterrupted reference at no extra cost.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.launch import (
    CONFIGS,
    SHARED_STEPS,
    accelerate_command,
    launch_env,
    run,
    start_on_machines,
    train_lines,
    wait_on_machines,
)
from tests.test_checkpoint_keeping import _digest, _prepared, damage, save
from training.checkpoints.store import COMPLETE_MARKER, checkpoint_path, complete_checkpoints, newest_good_checkpoint
from training.config import RunConfig, RunError
from training.distributed.faults import (
    Fault,
    FaultKind,
    fresh_store_on_restart,
    is_broken_collective,
    parse_fault,
    planned_faults,
    rank_failure,
    stopped_by_launcher,
)
from training.run_folder import check_output_dir, claim_output_dir

# --------------------------------------------------------------------------------------------- no launch


def test_a_fault_is_parsed_and_fires_only_on_its_rank_in_the_first_attempt() -> None:
    assert parse_fault("raise:rank=1:step=5") == Fault(FaultKind.RAISE, 5, 1)
    assert parse_fault("kill:step=6") == Fault(FaultKind.KILL, 6, None)
    for bad in ("explode:step=1", "raise:rank=1", "save_error:step=x", "raise:when=3:step=1"):
        with pytest.raises(ValueError, match="GPT2S_FAULT"):
            parse_fault(bad)
    env = {"GPT2S_FAULT": "raise:rank=1:step=5"}
    assert planned_faults({**env, "RANK": "0"}) == ()
    assert planned_faults({**env, "RANK": "1"}) == (Fault(FaultKind.RAISE, 5, 1),)
    assert planned_faults({**env, "RANK": "1", "TORCHELASTIC_RESTART_COUNT": "1"}) == ()
    assert planned_faults({"RANK": "1"}) == ()


def test_several_faults_and_a_range_of_steps_are_parsed() -> None:
    env = {"GPT2S_FAULT": "inf_grad:step=3,term:rank=1:step=5,nan_grad:step=1:to=30", "RANK": "0"}
    overflow, nan = planned_faults(env)  # the rank-1 SIGTERM is not rank 0's
    assert overflow == Fault(FaultKind.INF_GRAD, 3, None) and nan == Fault(FaultKind.NAN_GRAD, 1, None, 30)
    assert [s for s in range(40) if overflow.fires_at(s)] == [3]
    assert [s for s in range(40) if nan.fires_at(s)] == list(range(1, 31))
    with pytest.raises(ValueError, match="GPT2S_FAULT"):
        planned_faults({"GPT2S_FAULT": "inf_grad:step=3,bogus:step=1"})


def test_an_overflow_fault_sets_the_last_element_of_the_first_gradient() -> None:
    import torch

    from training.distributed.faults import poison_gradient

    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    model(torch.ones(1, 3)).sum().backward()
    first, second = (p.grad.clone() for p in list(model.parameters())[:2])
    poison_gradient(model, float("inf"))
    grad = list(model.parameters())[0].grad
    assert grad[-1, -1] == float("inf") and torch.equal(grad.flatten()[:-1], first.flatten()[:-1])
    assert torch.equal(list(model.parameters())[1].grad, second)  # one element of one gradient, no more


def test_a_switch_exported_in_the_shell_reaches_no_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A test passes GPT2S_FAULT or GPT2S_CPU_FP16 in its launch's env; one left exported would reach them all."""
    monkeypatch.setenv("GPT2S_FAULT", "raise:step=1")
    monkeypatch.setenv("GPT2S_CPU_FP16", "1")
    env = launch_env()
    assert "GPT2S_FAULT" not in env and "GPT2S_CPU_FP16" not in env
    monkeypatch.setenv("GPT2S_OTHER", "kept")
    assert launch_env()["GPT2S_OTHER"] == "kept"  # the rest of the shell's environment goes on


def test_a_term_fault_sends_one_sigterm_per_step_however_many_micro_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    import training.distributed.faults as faults

    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(faults, "_this_process_fault", lambda: (parse_fault("term:step=2"),))
    monkeypatch.setattr(faults.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    assert faults.with_step_faults(1, None, None) is None  # not its step: nothing added
    after_backward = faults.with_step_faults(2, None, None)
    for _ in range(3):  # three micro-batches' backwards
        after_backward()
    assert sent == [(os.getpid(), signal.SIGTERM)]


def test_only_the_process_that_failed_tells_it() -> None:
    broken = RuntimeError("[../gloo/transport/tcp/pair.cc:538] Connection closed by peer [127.0.0.1]:1234")
    assert is_broken_collective(broken) and not is_broken_collective(OSError(28, "No space left on device"))
    assert stopped_by_launcher(lambda: 15, grace_s=0) and not stopped_by_launcher(lambda: 0, grace_s=0.1)
    # A broken collective, then the launcher's SIGTERM: the echo of another process's failure, said by that one.
    assert rank_failure(broken, 0, 5, lambda: 15, multi=True).quiet
    # A broken collective and no SIGTERM (the launcher saw nothing fail): this process's own failure to tell.
    echo = rank_failure(broken, 0, 5, lambda: 0, multi=True)
    assert not echo.quiet and str(echo).startswith("rank 0 failed after step 5: RuntimeError: ")
    own = rank_failure(OSError(28, "No space left on device"), 1, 6, lambda: 15, multi=True)
    assert not own.quiet and str(own) == "rank 1 failed after step 6: OSError: [Errno 28] No space left on device"


def test_a_restart_hosts_its_store_on_a_port_it_keeps_and_the_process_group_serves_from_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 0 of a restarted attempt (one process, in this process) opens a store on a port the kernel picks,
    publishes the port under the restart's key in the agent's store, and the process group's env:// store
    serves from that same open server (multi_tenant): a key set before init_process_group is there after it.
    A store closed and made again on the port (or a port probed and released) would have lost the key."""
    import datetime

    import torch.distributed as dist
    from torch.distributed import TCPStore

    agent = TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=10))
    env = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(agent.port),
        "RANK": "0",
        "WORLD_SIZE": "1",
        "TORCHELASTIC_RESTART_COUNT": "1",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    fresh_store_on_restart(os.environ, timeout_s=10)
    port = os.environ["MASTER_PORT"]
    assert port != str(agent.port) and agent.get("gpt2s/restart_1/master_port").decode() == port
    assert os.environ["TORCHELASTIC_USE_AGENT_STORE"] == "False"  # rank 0 hosts the process group's store
    hosted = TCPStore("127.0.0.1", int(port), is_master=False, timeout=datetime.timedelta(seconds=10))
    hosted.set("hosted_before_the_process_group", "yes")
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=10))
    try:
        store = dist.distributed_c10d._get_default_store()
        while isinstance(store, dist.PrefixStore):
            store = store.underlying_store
        assert isinstance(store, TCPStore) and store.port == int(port)
        assert store.check(["hosted_before_the_process_group"])  # the same server, not a new one on the port
    finally:
        dist.destroy_process_group()


def _complete(run_dir: Path, step: int) -> None:
    folder = run_dir / "checkpoints" / f"step_{step:07d}"
    folder.mkdir(parents=True)
    (folder / COMPLETE_MARKER).write_text(f'{{"step": {step}, "files": {{}}}}')


def test_auto_resume_resumes_when_it_can_and_starts_afresh_when_it_cannot(tmp_path: Path) -> None:
    assert check_output_dir(tmp_path, resume=False, overwrite=False, auto_resume=True) is None
    (tmp_path / "metrics.jsonl").write_text("")  # an attempt that crashed before its first checkpoint
    assert check_output_dir(tmp_path, resume=False, overwrite=False, auto_resume=True) is None
    (tmp_path / "checkpoints" / "step_0000006").mkdir(parents=True)  # a write that never completed
    _complete(tmp_path, 3)
    assert check_output_dir(tmp_path, resume=False, overwrite=False, auto_resume=True).name == "step_0000003"
    with pytest.raises(ValueError, match="--auto_resume and --overwrite contradict"):
        RunConfig(auto_resume=True, overwrite=True)


def test_auto_resume_refuses_to_replace_a_finished_run_it_cannot_continue(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text("")
    (tmp_path / "summary.json").write_text("{}")  # finished, checkpoints off
    with pytest.raises(RunError, match="holds a finished run and no checkpoint: --auto_resume has nothing"):
        check_output_dir(tmp_path, resume=False, overwrite=False, auto_resume=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "summary.json"]
    _complete(tmp_path, 3)  # one that stopped with a checkpoint continues
    assert check_output_dir(tmp_path, resume=False, overwrite=False, auto_resume=True).name == "step_0000003"


@pytest.mark.parametrize("renamed", ["step_0000003.damaged-inspecting", "step_0000003.bak", "notes"])
def test_a_fresh_start_deletes_nothing_in_checkpoints_it_does_not_know(tmp_path: Path, renamed: str) -> None:
    """A person renamed a checkpoint folder to look at it; --auto_resume then finds no checkpoint to continue. It may
    start afresh over an interrupted save and a deletion cut short, never over a folder it did not leave there."""
    save(_prepared(), tmp_path, 3, keep=2)
    root = tmp_path / "checkpoints"
    kept = _digest(checkpoint_path(tmp_path, 3))
    checkpoint_path(tmp_path, 3).rename(root / renamed)
    (root / "step_0000006").mkdir()  # a save cut short
    (root / "step_0000002.deleting").mkdir()  # a deletion cut short
    run = RunConfig(output_dir=str(tmp_path), auto_resume=True)
    with pytest.raises(RunError) as refused:
        claim_output_dir(tmp_path, run, restart=0)
    assert renamed in str(refused.value) and "\n" not in str(refused.value)
    assert _digest(root / renamed) == kept
    shutil.rmtree(root / renamed)  # what the project leaves is deleted by a fresh start
    assert claim_output_dir(tmp_path, run, restart=0) is None and not root.exists()


def test_a_claim_sweeps_only_the_leftovers_it_names_itself(tmp_path: Path) -> None:
    """A resume sweeps a deletion or a clear cut short (step_N.deleting, checkpoints.deleting-ID); folders a person
    named alike (step_3.damaged.deleting-later, checkpoints.deleting-old) are theirs and stay."""
    save(_prepared(), tmp_path, 6, keep=2)
    root = tmp_path / "checkpoints"
    ours = [root / "step_0000002.deleting", root / "step_0000004.deleting.1", tmp_path / "hf.deleting-0123abcd"]
    theirs = [root / "step_0000003.damaged.deleting-later", tmp_path / "checkpoints.deleting-old"]
    for folder in (*ours, *theirs):
        folder.mkdir()
    assert claim_output_dir(tmp_path, RunConfig(output_dir=str(tmp_path), resume=True), restart=0) == checkpoint_path(
        tmp_path, 6
    )
    assert [p.exists() for p in ours] == [False] * len(ours) and all(p.is_dir() for p in theirs)


def _killed_with_damaged_checkpoints(run_dir: Path) -> dict[str, dict[str, str]]:
    """A run killed in its first epoch (no summary.json) whose checkpoints at steps 3 and 6 a bad disk damaged;
    returns each checkpoint's files (their digests) by the name it has once set aside."""
    for step in (3, 6):
        save(_prepared(), run_dir, step, keep=2)
        damage(checkpoint_path(run_dir, step))
    (run_dir / "metrics.jsonl").write_text('{"kind": "train", "step": 1}\n')
    (run_dir / "config.json").write_text("{}")
    return {f"{checkpoint_path(run_dir, s).name}.damaged": _digest(checkpoint_path(run_dir, s)) for s in (3, 6)}


def _assert_kept_and_named(run_dir: Path, damaged: dict[str, dict[str, str]], message: str) -> None:
    """Every damaged checkpoint is still there, set aside with its files, the run's files untouched, and the one
    line names each folder and the ways on."""
    root = run_dir / "checkpoints"
    assert {p.name: _digest(p) for p in root.iterdir()} == damaged
    assert (run_dir / "metrics.jsonl").read_text() == '{"kind": "train", "step": 1}\n'
    assert (run_dir / "config.json").read_text() == "{}"
    assert "\n" not in message and all(name in message for name in damaged), message
    assert all(choice in message for choice in ("--overwrite", "--resume_step", "--init_from")), message


@pytest.mark.parametrize(
    ("flags", "restart"),
    [({"auto_resume": True}, 0), ({}, 1), ({"overwrite": True}, 2)],
    ids=["auto_resume", "restart", "restart_of_an_overwrite"],
)
def test_only_damaged_checkpoints_are_kept_by_every_launch_that_would_continue(
    tmp_path: Path, flags: dict, restart: int
) -> None:
    """--auto_resume and torchrun restarts (also of an --overwrite job), launched twice: the first launch sets
    the damaged checkpoints aside, and neither starts afresh over them; each stops with one line."""
    damaged = _killed_with_damaged_checkpoints(tmp_path)
    for _ in range(2):
        with pytest.raises(RunError) as refused:
            claim_output_dir(tmp_path, RunConfig(output_dir=str(tmp_path), **flags), restart)
        _assert_kept_and_named(tmp_path, damaged, str(refused.value))


# --------------------------------------------------------------------------------------------- launches

FAULT_STEP, SAVE_STEP = 5, 6  # a step between checkpoints (3 and 6), and a checkpoint's step


@pytest.fixture(scope="module")
def args(base_args: list[str]) -> list[str]:
    # The shared DDP run's flags; the export and W&B change no loss and are left out to save time.
    return [*base_args, "--strategy", "ddp", "--no-export_hf", "--wandb_mode", "disabled"]


def _ddp(out: Path, args: list[str], fault: str = "", launch_args: list[str] = ()) -> subprocess.CompletedProcess:
    command = accelerate_command(
        CONFIGS / "ddp.yaml", "train.py", [*args, "--output_dir", str(out)], launch_args=launch_args
    )
    env = {**launch_env(), **({"GPT2S_FAULT": fault} if fault else {})}
    return subprocess.run(command, cwd=CONFIGS.parent, env=env, capture_output=True, text=True, timeout=600)


def _errors(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("error:")]


def _assert_continues_exactly(run_dir: Path, reference: Path) -> None:
    got, want = train_lines(run_dir), train_lines(reference)
    assert sorted(got) == sorted(want) == list(range(1, SHARED_STEPS + 1))
    for step in want:
        assert (got[step]["loss"], got[step]["grad_norm"]) == (want[step]["loss"], want[step]["grad_norm"]), step


@pytest.mark.multiprocess
def test_a_restarted_job_continues_from_its_newest_checkpoint_by_itself(
    tmp_path: Path, args: list[str], shared_runs
) -> None:
    """W&B at its default here (offline without a login), the twin of the launches above that turn it off: the
    restarted attempt reopens the first attempt's W&B run rather than starting another."""
    run_dir = tmp_path / "restarted"
    with_wandb = [a for a in args if a not in ("--wandb_mode", "disabled")]
    assert len(with_wandb) == len(args) - 2
    result = _ddp(run_dir, with_wandb, f"raise:rank=1:step={FAULT_STEP}", ["--max_restarts", "1"])
    assert result.returncode == 0, result.stderr[-3000:]
    (error,) = _errors(result)  # the first attempt's failure, told once, by the process that failed
    assert error.startswith(f"error: rank 1 failed after step {FAULT_STEP}: InjectedFault: ")
    assert (run_dir / "failure-rank1.txt").read_text().startswith("Traceback")
    assert "restart 1 of the job: continuing from " in result.stderr and "step_0000003" in result.stderr
    _assert_continues_exactly(run_dir, shared_runs["ddp"])
    run_id = (run_dir / "wandb_run_id").read_text().strip()
    attempts = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(attempts) == 2 and all(a.name.endswith(f"-{run_id}") for a in attempts), attempts


@pytest.mark.multiprocess
def test_a_write_error_inside_dcp_on_rank_1_is_told_once_and_keeps_the_checkpoint_before(
    tmp_path: Path, args: list[str]
) -> None:
    """The full disk strikes inside DCP's storage writer on rank 1: DCP hands every rank its CheckpointException,
    and only rank 1 tells it, exit 5; step 3 stays the newest complete checkpoint, intact."""
    run_dir = tmp_path / "save-error"
    result = _ddp(run_dir, args, f"save_error:rank=1:step={SAVE_STEP}")
    assert result.returncode != 0
    (error,) = _errors(result)
    assert error.startswith(f"error: rank 1 failed after step {SAVE_STEP}: OSError: [Errno 28] No space left")
    assert "exitcode  : 5" in result.stderr and "CheckpointException" not in result.stdout + result.stderr
    assert [c.name for c in complete_checkpoints(run_dir)] == ["step_0000003"]
    assert newest_good_checkpoint(run_dir).name == "step_0000003"  # what --resume takes
    written = run_dir / "checkpoints" / f"step_{SAVE_STEP:07d}"
    assert not (written / COMPLETE_MARKER).exists()
    assert not list(written.glob("model/__1_*.distcp"))  # it failed inside the writer, before rank 1's shard


@pytest.mark.multiprocess
def test_a_job_over_two_machines_restarts_as_one_and_continues(tmp_path: Path, args: list[str], shared_runs) -> None:
    """2 "machines" x 1 process by the SLURM launch line, --max_restarts 1: rank 1 fails; its machine counts a
    restart, the other machine restarts its process for the new round without counting. The job agrees it is
    a restart, continues from the step-3 checkpoint, and ends with the uninterrupted DDP run's steps."""
    run_dir = tmp_path / "restarted-machines"
    env = {"GPT2S_FAULT": f"raise:rank=1:step={FAULT_STEP}", "MAX_RESTARTS": "1"}
    procs = start_on_machines("ddp_multinode.yaml", run_dir, args, machines=2, per_machine=1, env=env)
    result = wait_on_machines(procs, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    (error,) = _errors(result)
    assert error.startswith(f"error: rank 1 failed after step {FAULT_STEP}: InjectedFault: ")
    assert "restart 1 of the job: continuing from " in result.stderr and "step_0000003" in result.stderr
    _assert_continues_exactly(run_dir, shared_runs["ddp"])


@pytest.mark.multiprocess
def test_every_rank_killed_during_a_checkpoint_write_resumes_from_the_one_before(
    tmp_path: Path, args: list[str], shared_runs
) -> None:
    run_dir = tmp_path / "killed"
    result = _ddp(run_dir, args, f"kill:step={SAVE_STEP}")
    assert result.returncode != 0 and _errors(result) == []  # SIGKILL leaves no line of train.py's
    assert [c.name for c in complete_checkpoints(run_dir)] == ["step_0000003"]
    # Run again as a re-run notebook cell or a requeued job runs it: --auto_resume finds the checkpoint itself.
    resumed = run(
        accelerate_command(CONFIGS / "ddp.yaml", "train.py", [*args, "--output_dir", str(run_dir), "--auto_resume"])
    )
    assert "resumed from " in resumed.stdout and "step_0000003 at step 3" in resumed.stdout
    _assert_continues_exactly(run_dir, shared_runs["ddp"])


@pytest.mark.multiprocess
def test_two_auto_resume_launches_over_only_damaged_checkpoints_keep_them_all(tmp_path: Path, base_args) -> None:
    """The issue's case with `python train.py` (accelerate's one-process launcher would echo each line in its
    own traceback): the first --auto_resume launch sets the damaged checkpoints aside and stops,
    the same command again stops the same way; each says one error line, and the run folder keeps everything."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    damaged = _killed_with_damaged_checkpoints(run_dir)
    args = [*base_args, "--strategy", "single", "--wandb_mode", "disabled", "--output_dir", str(run_dir)]
    for launch in range(2):
        result = run([sys.executable, "train.py", *args, "--auto_resume"], check=False)
        assert result.returncode != 0, launch
        (error,) = _errors(result)
        _assert_kept_and_named(run_dir, damaged, error)
