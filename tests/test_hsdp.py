"""HSDP over three "machines": FSDP2 on accelerate's 2-D mesh trains exactly as one process does.

One real job, shared with the registry's tests (tests/conftest.py `shared_runs`): the SLURM recipe's launch
line (scripts/slurm/launch_node.sh) run three times with SLURM's variables for three nodes, 2 processes each,
over loopback; each runs `accelerate launch --machine_rank 0|1|2 --main_process_ip 127.0.0.1` with
accelerate_configs/hsdp.yaml, whose own mesh (the 2 x 2 example) the launch line replaces by replicate 3 x
shard 2. The 2 x 2 shape is the same code with one replica fewer. The rest here needs no launch.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.launch import (
    LAUNCH_TIMEOUT_S,
    MACHINES,
    PROCESSES_PER_MACHINE,
    REPO,
    SHARED_EXTRA,
    SHARED_STEPS,
    SLURM_LAUNCH_LINE,
    free_port,
    kill_rank_after_step,
    start_on_machines,
    summary,
    train_lines,
    wait_on_machines,
)
from tests.test_strategies import assert_same_validation
from training.distributed.strategy import StrategyMismatch, check_strategy, requested_from_env
from training.records.record import EffectiveRecord

HSDP_LAUNCH = {
    "ACCELERATE_USE_FSDP": "true",
    "WORLD_SIZE": "4",
    "GROUP_WORLD_SIZE": "2",
    "LOCAL_WORLD_SIZE": "2",
    "ACCELERATE_USE_PARALLELISM_CONFIG": "true",
    "PARALLELISM_CONFIG_DP_REPLICATE_SIZE": "2",
    "PARALLELISM_CONFIG_DP_SHARD_SIZE": "2",
}


@pytest.fixture(scope="module")
def hsdp(shared_runs) -> Path:
    return shared_runs["hsdp"]


@pytest.fixture(scope="module")
def single(shared_runs) -> Path:
    """One process on the HSDP job's global batch of 24 blocks."""
    return shared_runs["single_24"]


@pytest.mark.multiprocess
def test_hsdp_trains_as_one_process_does_step_by_step(hsdp: Path, single: Path) -> None:
    assert summary(hsdp)["grad_accum_steps"] == summary(single)["grad_accum_steps"] == 2
    assert summary(hsdp)["global_batch_tokens"] == summary(single)["global_batch_tokens"]
    got, want = train_lines(hsdp), train_lines(single)
    assert len(want) == SHARED_STEPS >= 8
    for step in want:
        assert got[step]["loss"] == pytest.approx(want[step]["loss"], rel=1e-5), f"loss at step {step}"
        assert got[step]["grad_norm"] == pytest.approx(want[step]["grad_norm"], rel=1e-5), f"grad norm at {step}"
    assert got[SHARED_STEPS]["loss"] < got[1]["loss"] - 0.5  # it learns: equal is not equally idle
    assert_same_validation(hsdp, single)


@pytest.mark.multiprocess
def test_the_summary_records_the_mesh_and_each_ranks_half_of_the_model(hsdp: Path) -> None:
    s = summary(hsdp)
    launched = ("hsdp", "hsdp", MACHINES * PROCESSES_PER_MACHINE, MACHINES)
    assert (s["strategy"], s["requested_strategy"], s["world_size"], s["num_machines"]) == launched
    # The mesh the launch asked for, not the config's 2 x 2 example: one row (shard group) per machine.
    assert (s["dp_replicate_size"], s["dp_shard_size"], s["shard_groups"]) == (3, 2, [[0, 1], [2, 3], [4, 5]])
    parameters = [rank["parameters"] for rank in s["memory"]["model_state_bytes"]]
    whole = s["n_params"] * 4  # fp32
    # Each machine's two ranks hold the model between them, half each (rows cut as torch.chunk cuts them),
    # and every machine holds the same shards as the first.
    machines = [parameters[i : i + 2] for i in range(0, len(parameters), 2)]
    assert len(machines) == 3 and all(sum(m) == whole and m == machines[0] for m in machines)
    assert all(abs(p / whole - 0.5) < 1e-3 for p in parameters)
    assert abs(s["local_param_numel"] / s["n_params"] - 0.5) < 1e-3
    config = json.loads((hsdp / "config.json").read_text())["launch"]["effective"]
    assert config["shard_groups_within_machines"] is True
    # The job measured nothing at start (the machine profile holds the link, planner/measure.py).
    assert "link" not in json.loads((hsdp / "config.json").read_text())["launch"]


@pytest.mark.multiprocess
def test_the_report_compares_hsdp_from_machine_rank_0s_run_with_every_ranks_memory(
    hsdp: Path, single: Path, tmp_path: Path
) -> None:
    from analysis.compare import main as compare

    assert compare([str(single), str(hsdp), "--out", str(tmp_path)]) == 0
    rows = {row["strategy"]: row for row in csv.DictReader((tmp_path / "table.csv").open(encoding="utf-8"))}
    assert rows["hsdp"]["world size (devices)"] == "6"
    # The peak over the 6 ranks of the three machines, and their mean: the summary holds every rank's figures.
    peaks = [float(rows["hsdp"][f"peak allocated, {how} over devices (MiB)"]) for how in ("max", "mean")]
    assert peaks[0] >= peaks[1] > 0
    # The plan beside the measurement: HSDP's model state, predicted and measured, agree.
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert re.search(r"^\| hsdp \| hsdp \| ([\d.]+) \| \1 \| \+0\.0 \|", report, flags=re.M), report[-2000:]


def test_the_slurm_scripts_parse() -> None:
    for script in (SLURM_LAUNCH_LINE, REPO / "scripts" / "slurm" / "train_multinode.sbatch"):
        result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, result.stderr


def test_the_slurm_launch_line_without_its_variables_is_one_line_and_nonzero() -> None:
    result = subprocess.run(
        ["bash", str(SLURM_LAUNCH_LINE), "accelerate_configs/hsdp.yaml"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert result.returncode != 0 and "usage: launch_node.sh" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


# -- the launch line for N machines x M GPUs, read by accelerate's own launcher (no launch) ----------------


def _launch_line(tmp_path: Path, config: str, nodes: int, node: int, per_node: int, **env_extra: str) -> list[str]:
    """The `accelerate launch` arguments scripts/slurm/launch_node.sh gives on node `node` of `nodes`, with
    `per_node` GPUs each, as a stand-in `accelerate` on the PATH receives them (train.py's flags: --preset gpt2,
    or FLAGS, split on spaces)."""
    stub = tmp_path / "bin" / "accelerate"
    stub.parent.mkdir(exist_ok=True)
    stub.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    stub.chmod(0o755)
    env = {
        "PATH": f"{stub.parent}{os.pathsep}/usr/bin{os.pathsep}/bin",
        "SLURM_NNODES": str(nodes),
        "SLURM_NODEID": str(node),
        "SLURM_GPUS_ON_NODE": str(per_node),
        "MAIN_PROCESS_IP": "10.0.0.1",
        "MAIN_PROCESS_PORT": str(free_port()),
        **env_extra,
    }
    flags = env.pop("FLAGS", "--preset gpt2").split()
    command = ["bash", str(SLURM_LAUNCH_LINE), f"accelerate_configs/{config}", *flags]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "launch"
    return result.stdout.splitlines()[1:]


def _as_accelerate_reads_it(argv: list[str], nodes: int, per_node: int) -> tuple[Any, dict[str, str]]:
    """accelerate's parsed launch arguments, and the environment a train.py process of that launch gets
    (accelerate's variables plus torchrun's counts)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(argv))
    env = prepare_multi_gpu_env(args)
    counts = {"WORLD_SIZE": str(nodes * per_node), "GROUP_WORLD_SIZE": str(nodes), "LOCAL_WORLD_SIZE": str(per_node)}
    return args, {**env, **counts}


@pytest.mark.parametrize(
    ("config", "nodes", "strategy", "mesh"),
    [("hsdp.yaml", 2, "hsdp", (2, 8)), ("hsdp.yaml", 4, "hsdp", (4, 8)), ("fsdp.yaml", 4, "fsdp", None)]
    + [("ddp_multinode.yaml", 3, "ddp", None)],
)
def test_the_slurm_launch_line_gives_every_machine_the_mesh_of_the_launch(
    tmp_path: Path, config: str, nodes: int, strategy: str, mesh: tuple[int, int] | None
) -> None:
    for node in (0, nodes - 1):
        argv = _launch_line(tmp_path, config, nodes, node, 8)
        args, env = _as_accelerate_reads_it(argv, nodes, 8)
        assert (int(args.num_processes), int(args.nnodes), args.node_rank) == (nodes * 8, nodes, node)
        # The rendezvous the line relies on: accelerate hands torchrun the first machine's address as the c10d
        # endpoint, because --same_network is not passed (it would set only a master address instead).
        assert not args.same_network and args.rdzv_endpoint.startswith("10.0.0.1:") and args.rdzv_backend == "c10d"
        assert args.rdzv_conf == f"is_host={int(node == 0)}"
        requested = requested_from_env(env, strategy)
        assert requested.strategy == strategy and requested.world_size == nodes * 8
        got = None if requested.mesh is None else (requested.mesh.dp_replicate_size, requested.mesh.dp_shard_size)
        assert got == mesh


@pytest.mark.parametrize(("inter_node_gb_s", "strategy"), [("10", "hsdp"), ("400", "fsdp")])
def test_the_plans_lines_for_several_machines_are_the_recipes(
    tmp_path: Path, inter_node_gb_s: str, strategy: str
) -> None:
    """`python -m planner --num_nodes 2 --launch`: the sbatch line hands the batch script the config and
    train.py's flags, and each machine's line is, argument for argument, what launch_node.sh runs there."""
    from tests.test_plan import _plan

    plan = ["--preset", "gpt2", "--gpu", "H100", "--num_gpus", "8", "--num_nodes", "2", "--precision", "bf16"]
    plan += ["--global_batch_tokens", "65536", "--inter_node_gb_s", inter_node_gb_s]
    result = _plan(*plan, "--launch", "--json", "--main_process_ip", "10.0.0.1")
    assert result.returncode == 0, result.stderr
    chosen = json.loads(result.stdout)
    assert chosen["strategy"] == strategy  # over Ethernet hybrid sharding, over InfiniBand all GPUs' FSDP
    slurm = chosen["slurm"]
    assert slurm[:4] == ["MIXED_PRECISION=bf16", "sbatch", "--nodes=2", "--gpus-per-node=8"]
    assert (REPO / slurm[4]).is_file() and slurm[4].endswith("train_multinode.sbatch")
    config, flags = Path(slurm[5]).name, slurm[6:]
    assert flags[flags.index("--strategy") + 1] == strategy
    assert len(chosen["machines"]) == 2 and chosen["command"] is None
    for node, line in enumerate(chosen["machines"]):
        recipe = _launch_line(
            tmp_path, config, 2, node, 8, MIXED_PRECISION="bf16", MAIN_PROCESS_PORT="29500", FLAGS=" ".join(flags)
        )
        recipe[recipe.index(str(REPO / "train.py"))] = "train.py"
        assert line == ["accelerate", "launch", *recipe]
    mesh = ["--parallelism_config_dp_replicate_size", "2", "--parallelism_config_dp_shard_size", "8"]
    assert all((" ".join(mesh) in " ".join(line)) == (strategy == "hsdp") for line in chosen["machines"])


def test_a_launch_line_with_a_machine_rank_outside_the_job_is_one_error_line(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="error: machine rank 2 is not one of the job's 2 machines"):
        _launch_line(tmp_path, "hsdp.yaml", 2, 2, 8)


# -- the guard: the launch's mesh against the live one (unit level) ----------------------------------------


def _live(**changes: object) -> EffectiveRecord:
    values = dict(
        strategy="hsdp",
        world_size=4,
        num_machines=2,
        backend="gloo",
        distributed_type="FSDP",
        wrapper="FSDPModule",
        params_sharded=True,
        local_param_numel=1,
        global_param_numel=2,
        precision="fp32",
        device_type="cpu",
        dp_replicate_size=2,
        dp_shard_size=2,
        shard_groups=((0, 1), (2, 3)),
        shard_groups_within_machines=True,
    )
    return EffectiveRecord(**{**values, **changes})


def test_the_launch_variables_ask_for_hsdp_on_their_mesh() -> None:
    requested = requested_from_env(HSDP_LAUNCH, "hsdp")
    assert (requested.strategy, requested.world_size, requested.num_machines) == ("hsdp", 4, 2)
    assert (requested.mesh.dp_replicate_size, requested.mesh.dp_shard_size) == (2, 2)
    # A parallelism_config that replicates nothing is plain FSDP, whatever --strategy says.
    fsdp_only = {**HSDP_LAUNCH, "PARALLELISM_CONFIG_DP_REPLICATE_SIZE": "1", "PARALLELISM_CONFIG_DP_SHARD_SIZE": "4"}
    with pytest.raises(StrategyMismatch, match="--strategy hsdp was requested but the launch config gives fsdp"):
        requested_from_env(fsdp_only, "hsdp")
    with pytest.raises(StrategyMismatch, match="needs 4 processes and does not fit the 8 launched"):
        requested_from_env({**HSDP_LAUNCH, "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"})


def test_a_mesh_other_than_machines_by_processes_per_machine_is_one_error_naming_the_fix() -> None:
    three_by_two = {**HSDP_LAUNCH, "WORLD_SIZE": "6", "GROUP_WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "2"}
    with pytest.raises(StrategyMismatch) as raised:
        requested_from_env(three_by_two, "hsdp")  # the config's 2 x 2 example, launched as 3 x 2
    message = str(raised.value)
    assert "\n" not in message and "does not fit the 6 launched (3 machine(s) x 2)" in message
    assert "--parallelism_config_dp_replicate_size 3 --parallelism_config_dp_shard_size 2" in message
    # The right size the wrong way round: a shard group of 3 would span machines.
    turned = {**three_by_two, "PARALLELISM_CONFIG_DP_REPLICATE_SIZE": "2", "PARALLELISM_CONFIG_DP_SHARD_SIZE": "3"}
    with pytest.raises(StrategyMismatch, match="mesh replicate 2 x shard 3 needs 6 processes and does not fit"):
        requested_from_env(turned, "hsdp")
    fitted = requested_from_env({**three_by_two, "PARALLELISM_CONFIG_DP_REPLICATE_SIZE": "3"}, "hsdp")
    assert (fitted.mesh.dp_replicate_size, fitted.mesh.dp_shard_size, fitted.num_machines) == (3, 2, 3)


def test_a_live_mesh_other_than_the_launched_one_is_refused() -> None:
    requested = requested_from_env(HSDP_LAUNCH)
    assert check_strategy(requested, _live()) is None
    with pytest.raises(StrategyMismatch, match="in effect: mesh replicate 1 x shard 4"):
        check_strategy(requested, _live(dp_replicate_size=1, dp_shard_size=4))
    spanning = _live(shard_groups=((0, 2), (1, 3)), shard_groups_within_machines=False)
    with pytest.raises(StrategyMismatch, match=r"shard groups \[\[0, 2\], \[1, 3\]\] spanning machines"):
        check_strategy(requested, spanning)
    with pytest.raises(StrategyMismatch, match="requested hsdp .* strategy fsdp"):
        check_strategy(requested, dataclasses.replace(_live(), strategy="fsdp"))


# -- a rank killed on one machine -----------------------------------------------------------------------
# Two more 6-process launches, the second resuming from the checkpoint of step 3. Rank 0 killed in DDP's 3 x 2
# job by plain `accelerate launch` (static rendezvous): test_strategies.py; here a rank of another machine, in
# the SLURM launch line's job (c10d rendezvous).

# --collective_timeout_s of the killed job: longer than the hang guard of the whole wait for its launchers
# (wait_on_machines: LAUNCH_TIMEOUT_S for all of them together), so a job that ends within the guard ended by
# its failure path, not by waiting out the timeout; no wall-clock bound a loaded machine could stretch past
# (over gloo on loopback it takes seconds).
COLLECTIVE_TIMEOUT_S = 2 * LAUNCH_TIMEOUT_S


@pytest.mark.multiprocess
def test_rank_3_killed_on_the_second_machine_ends_every_machine_and_resume_continues_exactly(
    hsdp: Path, base_args: list[str], tmp_path: Path
) -> None:
    """At the defaults (W&B on), the SLURM launch line's HSDP job over 3 "machines" x 2: kill -9 of rank 3 (the
    second machine's, a rank that writes only its own shards) ends every process of every machine with a
    non-zero exit, without waiting for the collective timeout; --resume on every machine continues the job bit
    for bit past the step it was killed in, in the same W&B run."""
    run_dir = tmp_path / "hsdp-killed"
    timeout = ["--collective_timeout_s", str(COLLECTIVE_TIMEOUT_S)]
    args = [*base_args, "--strategy", "hsdp", *SHARED_EXTRA["hsdp"], *timeout]
    launchers = start_on_machines("hsdp.yaml", run_dir, args)
    logged = kill_rank_after_step(run_dir, launchers, rank=3, step=4)  # past the checkpoint of step 3
    assert 4 <= logged < SHARED_STEPS  # stopped in the middle
    # The resume redoes the steps lost since the checkpoint and one more, then stops (the steps after are the
    # same code again): --stop_after_steps keeps the 12-step schedule of the shared run.
    stop = min(logged + 1, SHARED_STEPS)
    resume = [*args, "--resume", "--stop_after_steps", str(stop)]
    resumed = wait_on_machines(start_on_machines("hsdp.yaml", run_dir, resume))
    assert "resumed from" in resumed.stdout
    # One W&B run for the job, from rank 0, continued by the resume.
    run_id = (run_dir / "wandb_run_id").read_text()
    assert [d.name.endswith(run_id) for d in (run_dir / "wandb").glob("offline-run-*")] == [True, True]
    # The same job as the shared run, bit for bit: before the kill, and after the resume from its checkpoint.
    got, want = train_lines(run_dir), train_lines(hsdp)
    assert sorted(got) == list(range(1, stop + 1)) and summary(run_dir)["steps"] == stop
    for step in got:
        assert (got[step]["loss"], got[step]["grad_norm"]) == (want[step]["loss"], want[step]["grad_norm"]), step
