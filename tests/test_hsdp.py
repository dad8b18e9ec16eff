"""HSDP over two "machines": FSDP2 on accelerate's 2-D mesh trains exactly as one process does.

One real job, shared with the registry's tests (tests/conftest.py `shared_runs`): the SLURM recipe's launch
line (scripts/slurm/launch_node.sh) run twice with SLURM's variables for two nodes, 2 processes each, over
loopback; each runs `accelerate launch --machine_rank 0|1 --main_process_ip 127.0.0.1` with
accelerate_configs/hsdp.yaml (replicate 2 x shard 2). The rest here needs no launch.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.launch import (
    REPO,
    SHARED_EXTRA,
    SHARED_STEPS,
    SLURM_LAUNCH_LINE,
    rank_process,
    start_on_machines,
    summary,
    train_lines,
    wait_for_step,
    wait_on_machines,
)
from tests.test_strategies import assert_same_validation
from training.record import EffectiveRecord
from training.strategy import StrategyMismatch, check_strategy, requested_from_env

TIMEOUT_S = 60  # --collective_timeout_s of the killed job: the bound on how long the other ranks may wait
HSDP_LAUNCH = {
    "ACCELERATE_USE_FSDP": "true",
    "WORLD_SIZE": "4",
    "GROUP_WORLD_SIZE": "2",
    "ACCELERATE_USE_PARALLELISM_CONFIG": "true",
    "PARALLELISM_CONFIG_DP_REPLICATE_SIZE": "2",
    "PARALLELISM_CONFIG_DP_SHARD_SIZE": "2",
}


@pytest.fixture(scope="module")
def hsdp(shared_runs) -> Path:
    return shared_runs["hsdp"]


@pytest.fixture(scope="module")
def single(shared_runs) -> Path:
    return shared_runs["single"]


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
    assert (s["strategy"], s["requested_strategy"], s["world_size"], s["num_machines"]) == ("hsdp", "hsdp", 4, 2)
    assert (s["dp_replicate_size"], s["dp_shard_size"], s["shard_groups"]) == (2, 2, [[0, 1], [2, 3]])
    parameters = [rank["parameters"] for rank in s["memory"]["model_state_bytes"]]
    whole = s["n_params"] * 4  # fp32
    # Each machine's two ranks hold the model between them, half each (rows cut as torch.chunk cuts them),
    # and the second machine holds the same shards as the first.
    assert parameters[0] + parameters[1] == parameters[2] + parameters[3] == whole
    assert parameters[:2] == parameters[2:] and all(abs(p / whole - 0.5) < 1e-3 for p in parameters)
    assert abs(s["local_param_numel"] / s["n_params"] - 0.5) < 1e-3
    config = json.loads((hsdp / "config.json").read_text())["launch"]["effective"]
    assert config["shard_groups_within_machines"] is True


@pytest.mark.multiprocess
def test_the_report_compares_hsdp_from_machine_rank_0s_run_with_every_ranks_memory(
    hsdp: Path, single: Path, tmp_path: Path
) -> None:
    from analysis.compare import main as compare

    assert compare([str(single), str(hsdp), "--out", str(tmp_path)]) == 0
    rows = {row["strategy"]: row for row in csv.DictReader((tmp_path / "table.csv").open(encoding="utf-8"))}
    assert rows["hsdp"]["world size (devices)"] == "4"
    # The peak over the 4 ranks of both machines, and their mean: the summary holds every rank's figures.
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
    with pytest.raises(StrategyMismatch, match="needs 4 processes but 8 were launched"):
        requested_from_env({**HSDP_LAUNCH, "WORLD_SIZE": "8"})


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
# Two more 4-process launches (about 35 s on 2 cores). The same for two machines with DDP, one process each:
# test_strategies.py::test_two_machines_on_loopback_match_one_machine_through_a_killed_rank_and_a_resume.


@pytest.mark.multiprocess
def test_a_rank_killed_on_one_machine_ends_both_and_resume_continues_exactly(
    hsdp: Path, base_args: list[str], tmp_path: Path
) -> None:
    run_dir = tmp_path / "hsdp-killed"
    args = [*base_args, "--strategy", "hsdp", *SHARED_EXTRA["hsdp"], "--collective_timeout_s", str(TIMEOUT_S)]
    launchers = start_on_machines("hsdp.yaml", run_dir, args)
    wait_for_step(run_dir, 4, launchers)  # past the checkpoint of step 3
    rank_process(launchers, 3).kill()  # kill -9 of the second machine's last rank
    killed = time.monotonic()
    ended = wait_on_machines(launchers, check=False)
    # Both machines' launchers fail, the first one's ranks within the collective timeout.
    assert all(p.returncode != 0 for p in launchers) and time.monotonic() - killed < TIMEOUT_S, ended.stderr[-3000:]
    resumed = wait_on_machines(start_on_machines("hsdp.yaml", run_dir, [*args, "--resume"]))
    assert "resumed from" in resumed.stdout
    # The same job as the shared run, bit for bit: before the kill, and after the resume from its checkpoint.
    got, want = train_lines(run_dir), train_lines(hsdp)
    assert sorted(got) == list(range(1, SHARED_STEPS + 1)) and summary(run_dir)["complete"]
    for step in want:
        assert (got[step]["loss"], got[step]["grad_norm"]) == (want[step]["loss"], want[step]["grad_norm"]), step
