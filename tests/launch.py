"""Launching train.py (or a probe script) with accelerate, as a user would, for the multi-process tests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from lab.launch import (  # noqa: F401 -- the tests import these from here
    CONFIGS,
    LAUNCH_TIMEOUT_S,
    OFFLINE,
    REPO,
    accelerate_command,
    free_port,
    launch_env,
    run,
    write_news_csv,
)

# The shared runs (tests/conftest.py `shared_runs`): one per registry entry, the same seed, data and
# global batch (16 x 64 tokens), W&B at its default (offline without a login) and the export on.
SHARED_STEPS = 12
SHARED_EVAL_BLOCKS = 20
# The offload run also checkpoints activations through accelerate's FSDP option: one launch shows both
# leave the training unchanged (tests/test_fsdp_modes.py).
# The jobs over several machines run as 3 "machines" x 2 processes (6 gloo processes on loopback): a shape
# other than the configs' 2 x 2 examples, so the mesh and the process counts must follow the launch. 16 blocks
# do not split over 6 processes: those jobs train on 24 (micro-batches of 2, accumulation 2), against a
# one-process run of the same 24 (`single_24`), which accumulates 2 micro-batches of 12.
MACHINES, PROCESSES_PER_MACHINE = 3, 2
MACHINES_BATCH = ["--global_batch_tokens", str(24 * 64), "--micro_batch_size", "2"]
SHARED_EXTRA = {"fsdp_offload": ["--activation_checkpointing"], "hsdp": MACHINES_BATCH}
# Shared runs beyond the registry's entries: name -> (the strategy it trains, its extra flags).
SHARED_VARIANTS = {"single_24": ("single", ["--global_batch_tokens", str(24 * 64), "--micro_batch_size", "12"])}


def shared_flags(name: str) -> tuple[str, list[str]]:
    """The strategy a shared run (a registry entry or a SHARED_VARIANTS name) trains, and its extra flags."""
    return SHARED_VARIANTS.get(name, (name, SHARED_EXTRA.get(name, [])))


SLURM_LAUNCH_LINE = REPO / "scripts" / "slurm" / "launch_node.sh"
# The shared bf16 runs (tests/conftest.py `bf16_runs`): single and FSDP under accelerate's --mixed_precision
# bf16, which CPU honours; W&B off, the export on (its check compares like with like).
# As long as the fp32 runs: 6 steps leave the validation loss at 10.2, next to the uniform guess's 10.8, where
# an export check would say little.
BF16_STEPS = SHARED_STEPS
# A checkpoint at step 9 (and one at the end) for the exact bf16 resume (tests/test_resume_anywhere.py).
BF16_CHECKPOINT = 9
BF16_EXTRA = ["--max_steps", str(BF16_STEPS), "--checkpoint_interval", str(BF16_CHECKPOINT), "--wandb_mode", "disabled"]


# The shared fp16 runs (tests/conftest.py `fp16_runs`): the GPU's fp16 path on the CPU (GPT2S_CPU_FP16), every
# strategy on the shared runs' flags and global batch, stopped after 6 steps of their 12-step schedule, each with
# an fp16 overflow (GPT2S_FAULT) at step 3, ddp's at its last step (so that one fp16 run trains every step fp32
# takes and is compared with it throughout), validation on 2 blocks, W&B off and no export. The sharded ones hold
# the element overflowed on one rank of each replica only (training/distributed/faults.py poison_gradient). fsdp_zero2
# accumulates 2 micro-batches per process (FSDP2's fp16 gradients kept unreduced between them). HSDP runs as
# 2 "machines" x 2 processes (the config's own example shape), on the global batch of 16 blocks the others train on.
FP16_STEPS = 6
FP16_OVERFLOW_STEP = 3
FP16_OVERFLOW_STEPS = {"ddp": FP16_STEPS}  # by strategy, where not FP16_OVERFLOW_STEP
FP16_ENV = {"GPT2S_CPU_FP16": "1"}
FP16_OVERFLOW = f"inf_grad:step={FP16_OVERFLOW_STEP}"
# Their checkpoints (every 3 steps, the last at the stop) all kept: step 3's holds the scale the overflow halved.
FP16_EXTRA = [
    "--stop_after_steps",
    str(FP16_STEPS),
    "--eval_blocks",
    "2",
    "--keep_checkpoints",
    "3",
    "--wandb_mode",
    "disabled",
    "--no-export_hf",
]
FP16_STRATEGY_EXTRA = {
    "fsdp_zero2": ["--micro_batch_size", "4"],
    "fsdp_offload": SHARED_EXTRA["fsdp_offload"],
    "hsdp": ["--micro_batch_size", "4"],
}
# fsdp stopped by SIGTERM (tests/test_fp16_resume.py) checkpoints every step and keeps them all: its weights
# before and after the overflow are compared.
FP16_STOPPED_EXTRA = ["--checkpoint_interval", "1", "--keep_checkpoints", str(FP16_STEPS)]


def fp16_overflow_step(strategy: str) -> int:
    """The step at which `strategy`'s shared fp16 run overflows."""
    return FP16_OVERFLOW_STEPS.get(strategy, FP16_OVERFLOW_STEP)


FP16_HSDP_LAYOUT = (2, 2)


def shared_args(corpus: Path, cache_dir: Path) -> list[str]:
    """The shared runs' flags (fp32 on CPU, dropout off: the runs differ only by strategy).

    A validation split of about 60 blocks, larger than the budget of 20 (which no batch divides evenly);
    about 9 optimizer steps of 16 blocks per epoch, so 12 steps cross an epoch boundary.
    """
    return [
        "--preset",
        "tiny",
        "--data",
        str(corpus),
        "--cache_dir",
        str(cache_dir),
        "--max_steps",
        str(SHARED_STEPS),
        "--log_interval",
        "1",
        "--seed",
        "3",
        "--val_fraction",
        "0.3",
        "--eval_blocks",
        str(SHARED_EVAL_BLOCKS),
        "--eval_interval",
        "4",
        "--perf_warmup_steps",
        "1",
        "--checkpoint_interval",
        "3",
    ]


def train(
    config_name: str,
    output_dir: Path,
    args: list[str],
    check: bool = True,
    launch_args: list[str] = (),
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    command = accelerate_command(
        CONFIGS / config_name, "train.py", [*args, "--output_dir", str(output_dir)], launch_args=launch_args
    )
    return run(command, check=check, env=env)


def config_processes(config_name: str) -> int:
    """The total process count an accelerate config launches (num_processes over all its machines)."""
    from analysis.experiment import read_num_processes

    return read_num_processes(CONFIGS / config_name)


def slurm_node_env(node: int, nodes: int, per_node: int, port: int) -> dict[str, str]:
    """What SLURM sets in a job's task on node `node` (and the batch script adds: the first node's address),
    for `nodes` "machines" on this one over loopback. The PATH leads to this interpreter's `accelerate`."""
    return {
        **launch_env(),
        "SLURM_NNODES": str(nodes),
        "SLURM_NODEID": str(node),
        "SLURM_GPUS_ON_NODE": str(per_node),
        "MAIN_PROCESS_IP": "127.0.0.1",
        "MAIN_PROCESS_PORT": str(port),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }


def start_on_machines(
    config_name: str,
    output_dir: Path | list[Path],
    args: list[str],
    machines: int = MACHINES,
    per_machine: int = PROCESSES_PER_MACHINE,
    env: dict[str, str] | None = None,
) -> list[subprocess.Popen[str]]:
    """The SLURM recipe's launch line (scripts/slurm/launch_node.sh) started once per "machine", as srun starts
    it on each node, here all on loopback: one launcher process per machine, machine 0 first. The process
    counts and the mesh come from the launch (SLURM's variables), whatever the config's own example says.
    A list of output folders gives each machine its own, as machines that share no file system would have."""
    import psutil

    port = free_port()
    folders = output_dir if isinstance(output_dir, list) else [output_dir] * machines
    command = ["bash", str(SLURM_LAUNCH_LINE), str(CONFIGS / config_name), *args]
    return [
        psutil.Popen(
            [*command, "--output_dir", str(folders[node])],
            cwd=REPO,
            env={**slurm_node_env(node, machines, per_machine, port), **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for node in range(machines)
    ]


def wait_on_machines(procs: list[subprocess.Popen[str]], check: bool = True) -> subprocess.CompletedProcess[str]:
    """Every machine's launcher ended; what they printed, machine 0 first; the worst exit status.

    One hang guard of LAUNCH_TIMEOUT_S for all the launchers together, not one each: a test that gives its
    job a collective timeout longer than the guard then knows the whole wait ended before that timeout."""
    import time

    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    outputs = [p.communicate(timeout=max(0.0, deadline - time.monotonic())) for p in procs]
    stdout, stderr = "".join(o for o, _ in outputs), "".join(e for _, e in outputs)
    status = max(p.returncode for p in procs)
    if check and status != 0:
        raise AssertionError(f"a machine's launch exited {status}:\n{stderr[-4000:]}")
    return subprocess.CompletedProcess(procs[0].args, status, stdout, stderr)


def train_on_machines(
    config_name: str,
    output_dir: Path,
    args: list[str],
    machines: int = MACHINES,
    per_machine: int = PROCESSES_PER_MACHINE,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """A job over `machines` x `per_machine` on loopback, launched as the SLURM recipe launches it, run to its end."""
    return wait_on_machines(start_on_machines(config_name, output_dir, args, machines, per_machine, env))


def rank_process(launchers: list, rank: int) -> Any:
    """The train.py process of that global rank among the launchers' children (one launcher per machine),
    told by the RANK torchrun gives it: a launcher's child order is not the rank order."""
    import psutil

    found = {}
    for launcher in launchers:
        for p in launcher.children(recursive=True):
            try:
                if "train.py" in " ".join(p.cmdline()):
                    found[int(p.environ()["RANK"])] = p
            except (psutil.NoSuchProcess, KeyError):
                continue  # gone, or not a worker (no RANK)
    assert rank in found, f"no training process of rank {rank} among {sorted(found)}"
    return found[rank]


def wait_for_step(out: Path, step: int, launchers: list, timeout_s: float = LAUNCH_TIMEOUT_S) -> None:
    """Polls metrics.jsonl until the step is logged; the timeout is a hang guard, not a speed bound."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in launchers):
            ended = next(p for p in launchers if p.poll() is not None)
            raise AssertionError(f"a launch ended before step {step}:\n{ended.stdout.read()[-3000:]}")
        if (out / "metrics.jsonl").exists() and max(train_lines(out), default=0) >= step:
            return
        time.sleep(0.2)
    raise AssertionError(f"step {step} not reached in {timeout_s} s")


def metric_lines(output_dir: Path, kind: str) -> list[dict[str, Any]]:
    """The run's metrics.jsonl lines of one kind ("train", "eval"), in the order written."""
    lines = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [line for line in lines if line["kind"] == kind]


def kill_rank_after_step(out: Path, launchers: list, rank: int, step: int) -> int:
    """kill -9 of one global rank of a job over several machines once `step` is logged: every launcher must end
    non-zero within its hang guard (so before a collective timeout longer than it) and every worker of every
    machine be gone. The last step logged before the kill took hold."""
    import psutil

    wait_for_step(out, step, launchers)
    workers = [rank_process(launchers, r) for r in range(MACHINES * PROCESSES_PER_MACHINE)]
    workers[rank].kill()
    ended = wait_on_machines(launchers, check=False)
    assert all(p.returncode != 0 for p in launchers), ended.stderr[-3000:]
    gone, alive = psutil.wait_procs(workers, timeout=LAUNCH_TIMEOUT_S)  # a hang guard: they are gone already
    assert not alive and len(gone) == len(workers)
    return max(train_lines(out))


def train_lines(output_dir: Path) -> dict[int, dict[str, Any]]:
    """The run's train lines by step. A step logged twice or out of order (a resume that did not cut
    metrics.jsonl back, or that wrote a step again) fails here, where a dict by step would keep only the last."""
    lines = metric_lines(output_dir, "train")
    steps = [line["step"] for line in lines]
    assert steps == sorted(set(steps)), f"train steps not each once and in order: {steps}"
    return {line["step"]: line for line in lines}


def copy_cut_at_checkpoint(run: Path, to: Path, step: int) -> Path:
    """`run`'s folder as a pre-emption right after `step`'s checkpoint leaves it: the later checkpoints, the
    summary and every metrics line past `step` gone (and no W&B or export folder), so that whatever a resume
    shows past `step` it wrote itself. The cut is made here, not by the project's own truncation, which the
    resume under test is meant to exercise."""
    later = {p.name for p in (run / "checkpoints").iterdir() if int(p.name.split("_")[1].split(".")[0]) > step}
    shutil.copytree(
        run, to, ignore=lambda folder, names: [n for n in names if n in later or n in ("wandb", "hf", "summary.json")]
    )
    metrics = to / "metrics.jsonl"
    kept = [line for line in metrics.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
    metrics.write_text("".join(line + "\n" for line in kept))
    return to


def summary(output_dir: Path) -> dict[str, Any]:
    return json.loads((output_dir / "summary.json").read_text())


def plan_errors(output_dir: Path) -> list[dict[str, float]]:
    """Per rank: the planner's error in percent on each figure the run measured (planner.plan --run)."""
    from planner.plan import compare_run

    entry = compare_run(output_dir)
    assert len(entry["ranks"]) == summary(output_dir)["world_size"]
    return [rank["error_pct"] for rank in entry["ranks"]]


MODEL_STATE = ("parameters", "gradients", "optimizer")
STEP_PEAK_PCT = 0.05  # lab/results/planning_checks.md measures 0.003%; FSDP and its ZeRO-2 mode differ by 0.06%


def assert_planned_exactly(output_dir: Path) -> None:
    """Every rank holds exactly the model-state bytes the planner counts; its step peak is within 0.05%."""
    from planner.plan import compare_run

    entry = compare_run(output_dir)
    assert len(entry["ranks"]) == summary(output_dir)["world_size"]
    for rank in entry["ranks"]:
        predicted, measured = rank["predicted"], rank["measured"]
        assert set(measured) == {*MODEL_STATE, "step_peak"}, (output_dir, rank)
        assert {k: measured[k] for k in MODEL_STATE} == {k: predicted[k] for k in MODEL_STATE}, (output_dir, rank)
        assert abs(rank["error_pct"]["step_peak"]) < STEP_PEAK_PCT, (output_dir, rank)
