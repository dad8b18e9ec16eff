"""Single process, DDP and FSDP really run as named, train the same model, and resume exactly.

Real launches: `accelerate launch` with the project's own config files, 2 processes over gloo on CPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

from tests.launch import (
    BF16_STEPS,
    CONFIGS,
    LAUNCH_TIMEOUT_S,
    MACHINES,
    MACHINES_BATCH,
    PROCESSES_PER_MACHINE,
    REPO,
    SHARED_EVAL_BLOCKS,
    SHARED_STEPS,
    accelerate_command,
    assert_planned_exactly,
    free_port,
    kill_rank_after_step,
    launch_env,
    metric_lines,
    run,
    summary,
    train,
    train_lines,
    wait_on_machines,
)

pytestmark = pytest.mark.multiprocess
# Every `timeout=` below is a hang guard (a launch or command here takes seconds to a minute), not a bound
# on speed: each call waits for its process to end.

STRATEGY_CONFIGS = {"single": "single_gpu.yaml", "ddp": "ddp.yaml", "fsdp": "fsdp.yaml"}
MAX_STEPS = SHARED_STEPS
EVAL_BLOCKS = SHARED_EVAL_BLOCKS


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("strategies")


@pytest.fixture(scope="module")
def common_args(base_args: list[str]) -> list[str]:
    # W&B off for the extra runs here, which compare numbers; the shared runs keep W&B at its default.
    return [*base_args, "--wandb_mode", "disabled"]


@pytest.fixture(scope="module")
def runs(shared_runs) -> dict[str, Path]:
    """The shared uninterrupted run per strategy (tests/conftest.py), the same seed, data and global batch."""
    return {strategy: shared_runs[strategy] for strategy in STRATEGY_CONFIGS}


def _assert_same_steps(run: Path, reference: Path, steps: range) -> None:
    got, want = train_lines(run), train_lines(reference)
    for step in steps:
        assert got[step]["loss"] == pytest.approx(want[step]["loss"], rel=1e-5), f"loss at step {step}"
        assert got[step]["grad_norm"] == pytest.approx(want[step]["grad_norm"], rel=1e-5), f"grad norm at step {step}"


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_distributed_runs_match_the_single_process_step_by_step(runs: dict[str, Path], strategy: str) -> None:
    _assert_same_steps(runs[strategy], runs["single"], range(1, MAX_STEPS + 1))
    assert summary(runs[strategy])["global_batch_tokens"] == summary(runs["single"])["global_batch_tokens"] == 1024
    assert summary(runs["single"])["grad_accum_steps"] == 2 and summary(runs[strategy])["grad_accum_steps"] == 1
    losses = [train_lines(runs[strategy])[s]["loss"] for s in (1, MAX_STEPS)]
    assert losses[1] < losses[0] - 0.5  # they learn, so equality is not the equality of doing nothing


def _eval_lines(run: Path) -> dict[int, dict]:
    return {line["step"]: line for line in metric_lines(run, "eval")}


def assert_same_validation(run: Path, reference: Path) -> None:
    """The same validation blocks, measured at the same steps, to the same losses as the reference run."""
    config = json.loads((run / "config.json").read_text())
    assert config["launch"]["data_stats"]["val"]["blocks"] > EVAL_BLOCKS  # the budget is a real subset
    assert summary(run)["eval_blocks"] == summary(reference)["eval_blocks"] == EVAL_BLOCKS
    got, want = _eval_lines(run), _eval_lines(reference)
    assert sorted(got) == sorted(want) and len(want) >= 3  # every eval_interval, each epoch end, the end
    for step in want:
        assert got[step]["val_loss"] == pytest.approx(want[step]["val_loss"], rel=1e-5), f"val loss at step {step}"
    assert len({round(line["val_loss"], 3) for line in want.values()}) == len(want)  # they move as it trains


def assert_same_weights(run: Path, reference: Path) -> None:
    got = load_file(str(run / "hf" / "model.safetensors"))
    want = load_file(str(reference / "hf" / "model.safetensors"))
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_validation_measures_the_same_blocks_as_the_single_process(runs: dict[str, Path], strategy: str) -> None:
    assert_same_validation(runs[strategy], runs["single"])


ACCUMULATION_STEPS = 6


@pytest.fixture(scope="module")
def accumulation_runs(workdir: Path, common_args: list[str]) -> dict[str, Path]:
    """The shared runs' global batch in micro-batches of 4: DDP and FSDP accumulate 2 per process, as the
    shared single process does with its 8. The 12-step schedule of the shared runs (the learning rate
    depends on it), stopped after 6 steps by --stop_after_steps."""
    out = {}
    for strategy in ("ddp", "fsdp"):
        out[strategy] = workdir / f"{strategy}-accumulation"
        train(
            STRATEGY_CONFIGS[strategy],
            out[strategy],
            [
                *common_args,
                "--strategy",
                strategy,
                "--micro_batch_size",
                "4",
                "--stop_after_steps",
                str(ACCUMULATION_STEPS),
                "--checkpoint_interval",
                "0",
                "--no-export_hf",
            ],
        )
    return out


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_accumulating_over_two_processes_matches_one_process_step_by_step(
    accumulation_runs: dict[str, Path], runs: dict[str, Path], strategy: str
) -> None:
    assert summary(runs["single"])["grad_accum_steps"] == summary(accumulation_runs[strategy])["grad_accum_steps"] == 2
    assert summary(accumulation_runs[strategy])["steps"] == ACCUMULATION_STEPS
    assert not summary(accumulation_runs[strategy])["complete"]  # stopped where --stop_after_steps said
    assert sorted(train_lines(accumulation_runs[strategy])) == list(range(1, ACCUMULATION_STEPS + 1))
    _assert_same_steps(accumulation_runs[strategy], runs["single"], range(1, ACCUMULATION_STEPS + 1))


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_accumulating_runs_hold_the_memory_their_plan_counts(accumulation_runs: dict[str, Path], strategy: str) -> None:
    assert_planned_exactly(accumulation_runs[strategy])


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_final_weights_match_the_single_process(runs: dict[str, Path], strategy: str) -> None:
    assert_same_weights(runs[strategy], runs["single"])


# bf16_runs: the session's bf16 single and FSDP runs (tests/conftest.py), BF16_STEPS long.


def test_bf16_fsdp_reports_the_losses_of_bf16_single(runs: dict[str, Path], bf16_runs: dict[str, Path]) -> None:
    # FSDP casts parameters to bf16 (its logits are bf16), a single process autocasts; the two compute
    # differently but must report losses of the same training, not one of them rounded to bf16.
    steps, out = BF16_STEPS, bf16_runs
    for strategy in out:
        assert summary(out[strategy])["precision"] == "bf16"
    single, fsdp, fp32 = train_lines(out["single"]), train_lines(out["fsdp"]), train_lines(runs["single"])
    for step in range(1, steps + 1):
        assert fsdp[step]["loss"] == pytest.approx(single[step]["loss"], rel=2e-3), f"loss at step {step}"
    assert any(single[s]["loss"] != fp32[s]["loss"] for s in range(1, steps + 1))  # bf16 really in effect


@pytest.mark.parametrize("strategy", ["single", "fsdp"])
def test_bf16_runs_hold_the_memory_their_plan_counts(bf16_runs: dict[str, Path], strategy: str) -> None:
    assert_planned_exactly(bf16_runs[strategy])


def test_each_config_runs_the_strategy_it_names(runs: dict[str, Path]) -> None:
    single, ddp, fsdp = (summary(runs[s]) for s in ("single", "ddp", "fsdp"))
    assert (single["strategy"], single["world_size"], single["wrapper"]) == ("single", 1, "GPT2")
    assert (ddp["strategy"], ddp["world_size"], ddp["wrapper"], ddp["backend"]) == (
        "ddp",
        2,
        "DistributedDataParallel",
        "gloo",
    )
    assert (fsdp["strategy"], fsdp["world_size"], fsdp["wrapper"], fsdp["backend"]) == ("fsdp", 2, "FSDPModule", "gloo")
    for s in (single, ddp, fsdp):
        assert s["precision"] == "fp32" and s["requested_precision"] == "fp16"  # the CPU fallback, recorded


def test_fsdp_shards_every_block_over_both_ranks(runs: dict[str, Path]) -> None:
    fsdp, ddp = summary(runs["fsdp"]), summary(runs["ddp"])
    fractions = fsdp["block_shard_fractions"]
    assert len(fractions) == 2  # the tiny preset's two GPT2Blocks, each its own FSDP unit
    assert all(f == pytest.approx(0.5, abs=0.02) for f in fractions)
    assert fsdp["params_sharded"] and not ddp["params_sharded"]
    assert fsdp["local_param_numel"] == pytest.approx(ddp["local_param_numel"] / 2, rel=0.02)


@pytest.mark.parametrize("strategy", list(STRATEGY_CONFIGS))
def test_planned_memory_matches_what_each_rank_measured(runs: dict[str, Path], strategy: str) -> None:
    """Model state from the live tensors byte for byte (FSDP's local shards), the step peak within 0.05%."""
    assert_planned_exactly(runs[strategy])


# A resume over a damaged newest checkpoint (one byte flipped, the size kept): the file the byte is flipped in.
# ddp resumes from its intact newest checkpoint; single and fsdp from the one before a damaged newest.
def test_fsdp_checkpoint_loads_into_one_process(runs: dict[str, Path]) -> None:
    from model.hf import from_hf
    from training.checkpoints.store import load_model_from_checkpoint

    sharded = load_model_from_checkpoint(runs["fsdp"])  # newest checkpoint: step 12, the final weights
    exported = from_hf(runs["fsdp"] / "hf")
    tokens = torch.randint(0, 50257, (2, 16), generator=torch.Generator().manual_seed(0))
    sharded.eval(), exported.eval()
    torch.testing.assert_close(sharded(tokens)[0], exported(tokens)[0])
    sample = subprocess.run(
        [
            sys.executable,
            "-m",
            "training.sample",
            "--model",
            str(runs["fsdp"] / "checkpoints" / "step_0000012"),
            "--prompt",
            "The council",
            "--max_new_tokens",
            "4",
            "--temperature",
            "0",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert sample.returncode == 0, sample.stderr
    assert sample.stdout == "The council" + _greedy(exported, "The council", 4) + "\n"


def _greedy(model, prompt: str, new_tokens: int) -> str:
    """The greedy continuation computed here, token by token, from the model's logits."""
    from data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer()
    ids = tokenizer(prompt).input_ids
    with torch.no_grad():
        for _ in range(new_tokens):
            ids.append(int(model(torch.tensor([ids]))[0][0, -1].argmax()))
    continuation = tokenizer.decode(ids[len(tokenizer(prompt).input_ids) :])
    assert continuation  # something was generated
    return continuation


def test_fsdp_checkpoint_exports_to_a_hugging_face_folder(runs: dict[str, Path], tmp_path: Path) -> None:
    import transformers

    from model.hf import from_hf

    checkpoint = runs["fsdp"] / "checkpoints" / "step_0000012"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "training.checkpoints.export",
            "--checkpoint",
            str(checkpoint),
            "--out",
            str(tmp_path / "hf"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    hf_model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    ours = from_hf(runs["fsdp"] / "hf").eval()
    tokens = torch.randint(0, 50257, (1, 12), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(hf_model(tokens).logits, ours(tokens)[0])
    missing = subprocess.run(
        [
            sys.executable,
            "-m",
            "training.checkpoints.export",
            "--checkpoint",
            str(tmp_path / "none"),
            "--out",
            str(tmp_path / "x"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert missing.returncode == 2 and missing.stderr.startswith("error:") and len(missing.stderr.splitlines()) == 1


def _machines(args: list[str], port: int) -> list[psutil.Popen]:
    """docs/multinode.md's DDP command without SLURM, on loopback: `accelerate launch` once per "machine" with
    the launch's counts (3 x 2, not the config's 2 x 2 example), its --machine_rank and one rendezvous port."""
    counts = ["--num_machines", str(MACHINES), "--num_processes", str(MACHINES * PROCESSES_PER_MACHINE)]
    return [
        psutil.Popen(
            accelerate_command(
                CONFIGS / "ddp_multinode.yaml",
                "train.py",
                args,
                [*counts, "--machine_rank", str(rank), "--main_process_ip", "127.0.0.1"],
                port=port,
            ),
            cwd=REPO,
            env=launch_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(MACHINES)
    ]


# --collective_timeout_s of the killed job: longer than the hang guard of the whole wait for its launchers
# (wait_on_machines: LAUNCH_TIMEOUT_S for all of them together), so a job that ends within the guard ended by
# its failure path, not by waiting out the timeout; no wall-clock bound a loaded machine could stretch past.
COLLECTIVE_TIMEOUT_S = 2 * LAUNCH_TIMEOUT_S


def test_machines_on_loopback_match_one_process_step_by_step_through_a_rank_0_kill_and_a_resume(
    shared_runs, workdir: Path, base_args: list[str]
) -> None:
    """At the defaults (W&B on), DDP over 3 "machines" x 2 processes by plain `accelerate launch` on each (static
    rendezvous): kill -9 of rank 0 (the first machine's, which writes the run folder and the W&B run) after step
    4 ends every process of every machine with a non-zero exit, without waiting for the collective timeout;
    --resume on every machine continues in the same W&B run, and every step, before the kill and after the
    resume, equals one process's on the same global batch. Two launches answer both questions."""
    out = workdir / "ddp-machines"
    args = [*base_args, *MACHINES_BATCH, "--collective_timeout_s", str(COLLECTIVE_TIMEOUT_S), "--output_dir", str(out)]
    procs = _machines(args, free_port())
    logged = kill_rank_after_step(out, procs, rank=0, step=4)  # past the checkpoint of step 3
    assert 4 <= logged < MAX_STEPS  # stopped in the middle
    # The resume redoes the steps lost since the checkpoint and one more, then stops (the steps after are the
    # same code again): --stop_after_steps keeps the 12-step schedule of the one-process run.
    stop = min(logged + 1, MAX_STEPS)
    resumed = wait_on_machines(_machines([*args, "--resume", "--stop_after_steps", str(stop)], free_port()))
    assert "resumed from" in resumed.stdout + resumed.stderr
    s = summary(out)
    assert (s["strategy"], s["world_size"], s["num_machines"], s["steps"]) == ("ddp", 6, 3, stop)
    # One W&B run for the job, from rank 0, continued by the resume.
    run_id = (out / "wandb_run_id").read_text()
    assert [d.name.endswith(run_id) for d in (out / "wandb").glob("offline-run-*")] == [True, True]
    assert sorted(train_lines(out)) == list(range(1, stop + 1))
    single = shared_runs["single_24"]
    assert summary(single)["global_batch_tokens"] == s["global_batch_tokens"] == 24 * 64
    _assert_same_steps(out, single, range(1, stop + 1))


# -- the guard, against each silent fallback reproduced for real -----------------------------------------
# The scripts exit 3 on a mismatch; `accelerate launch` reports any failing process as its own exit 1.


def test_guard_stops_fsdp_that_accelerate_turned_into_ddp() -> None:
    result = run(accelerate_command(CONFIGS / "fsdp.yaml", "tests/strategy_fallback_probe.py", ["cpu"]), check=False)
    assert result.returncode != 0, result.stderr[-2000:]
    assert "exitcode  : 3" in result.stdout + result.stderr
    assert "GUARD: requested fsdp with 2 process(es), but in effect: strategy ddp" in result.stdout


def test_guard_stops_unconnected_processes() -> None:
    result = run(accelerate_command(CONFIGS / "ddp.yaml", "tests/strategy_fallback_probe.py", ["default"]), check=False)
    assert result.returncode != 0, result.stderr[-2000:]
    assert "GUARD: requested ddp with 2 process(es), but in effect: strategy single" in result.stdout
    assert "1 connected process" in result.stdout


def test_guard_stops_a_multi_cpu_config_that_started_one_process(workdir: Path, common_args: list[str]) -> None:
    command = accelerate_command(
        REPO / "tests" / "configs" / "multi_cpu_no_mpi.yaml",
        "train.py",
        [*common_args, "--output_dir", str(workdir / "multi-cpu")],
    )
    result = run(command, check=False)
    assert result.returncode != 0, result.stderr[-2000:]
    assert "returned non-zero exit status 3" in result.stderr
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and "requested ddp with several process(es)" in error_lines[0]
    assert not (workdir / "multi-cpu" / "metrics.jsonl").exists()
