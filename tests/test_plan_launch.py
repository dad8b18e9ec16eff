"""The adaptive launch and the memory wall (planner/launch.py, planner/sweep.py), in this process:
arithmetic only, nothing launched (the launched command runs in tests/test_model_size_runs.py)."""

from __future__ import annotations

import json
import subprocess

import pytest

from model.config import GPT2Config
from planner.cost_model import Workload, model_state, step_memory
from tests.test_plan import _plan
from training.config import preset_overrides
from training.distributed import registry

GPT2_FAMILY = ("gpt2-medium", "gpt2-large", "gpt2-xl")
T4_PAIR = ("--gpu", "T4", "--num_gpus", "2")


def launch(*args: str) -> dict:
    result = _plan(*args, "--launch", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_gpt2_large_on_two_t4_in_fp16_launches_an_fsdp_mode_because_single_and_ddp_do_not_fit() -> None:
    chosen = launch("--preset", "gpt2-large", *T4_PAIR, "--precision", "fp16")
    assert registry.shards(chosen["strategy"]), chosen
    fits = {c["strategy"]: c["fits"] for c in chosen["candidates"]}
    assert fits == {**fits, "single": False, "ddp": False}, fits  # not even at micro-batch 1, checkpointed
    assert chosen["command"][:4] == [
        "accelerate",
        "launch",
        "--config_file",
        f"accelerate_configs/{registry.get(chosen['strategy']).config_file}",
    ]
    assert "train.py" in chosen["command"] and "--micro_batch_size" in chosen["command"]
    assert "do not fit" in chosen["why"] and chosen["strategy"] in chosen["why"]
    # The figures: model states alone about 12.4 GB, and DDP's fp32 buckets 3.1 GB.
    w = Workload(GPT2Config.from_preset("gpt2-large"), 1, 1024, "fp16")
    assert model_state(w, "single").total == pytest.approx(12.4e9, rel=0.01)
    ddp = step_memory(Workload(w.model, 1, 1024, "fp16", world_size=2), "ddp")
    assert ddp.communication == pytest.approx(3.1e9, rel=0.01)


@pytest.mark.parametrize("preset", GPT2_FAMILY)
def test_the_family_presets_train_as_the_launch_sizes_them_for_two_t4(preset: str) -> None:
    """The presets' micro-batch and activation checkpointing are the launch's choice on 2x T4 in fp16, and
    the launched command adds neither (the preset says them)."""
    chosen = launch("--preset", preset, *T4_PAIR)
    values = preset_overrides(preset)
    assert (chosen["micro_batch_size"], chosen["activation_checkpointing"]) == (
        values["micro_batch_size"],
        values.get("activation_checkpointing", False),
    )
    assert "--activation_checkpointing" not in chosen["command"]


def test_a_cpu_budget_only_fsdp_meets_makes_the_launch_choose_fsdp() -> None:
    chosen = launch("--preset", "mini", "--cpu", "--gpu_memory_gib", "0.19", "--num_gpus", "2")
    fits = {c["strategy"]: c["fits"] for c in chosen["candidates"]}
    assert fits["single"] is False and fits["ddp"] is False and fits["fsdp"] is True, chosen["candidates"]
    assert registry.shards(chosen["strategy"])
    assert not any(registry.get(c["strategy"]).offloads for c in chosen["candidates"])  # nothing to offload to
    assert chosen["command"][chosen["command"].index("--mixed_precision") + 1] == "no"


def test_a_cpu_budget_everything_meets_lets_single_and_ddp_fit() -> None:
    """The twin of the test above: only the budget differs."""
    chosen = launch("--preset", "mini", "--cpu", "--gpu_memory_gib", "1", "--num_gpus", "2")
    assert all(c["fits"] for c in chosen["candidates"]), chosen["candidates"]


def test_execute_runs_the_printed_command(monkeypatch: pytest.MonkeyPatch) -> None:
    import planner.launch as plan_launch

    ran = []
    monkeypatch.setattr(
        plan_launch.subprocess, "run", lambda cmd, check: ran.append(cmd) or subprocess.CompletedProcess(cmd, 7)
    )
    result = _plan("--preset", "gpt2-large", *T4_PAIR, "--launch", "--execute")
    assert result.returncode == 7
    assert ran and " ".join(ran[0]) == result.stdout.splitlines()[0]


def test_the_sweep_draws_the_memory_wall_of_two_t4(tmp_path) -> None:
    figure = tmp_path / "wall.png"
    result = _plan("--sweep", *T4_PAIR, "--micro_batch_size", "1", "--json", "--figure", str(figure))
    assert result.returncode == 0, result.stderr
    sweep = json.loads(result.stdout)
    presets = [r["preset"] for r in sweep["presets"]]
    assert set(GPT2_FAMILY) <= set(presets) and [r["parameters"] for r in sweep["presets"]] == sorted(
        r["parameters"] for r in sweep["presets"]
    )
    assert sweep["largest_that_fits"]["single"] == "gpt2-medium"
    assert sweep["largest_with_levers"]["fsdp"] == "gpt2-xl"
    assert figure.stat().st_size > 10_000
    text = _plan("--sweep", *T4_PAIR).stdout
    assert "largest preset each strategy trains here" in text and "gpt2-xl" in text


def test_the_sweep_over_two_machines_adds_hsdp_sharded_over_one_machine() -> None:
    result = _plan(
        "--sweep",
        "--gpu",
        "H100",
        "--num_gpus",
        "8",
        "--num_nodes",
        "2",
        "--inter_node_gb_s",
        "45",
        "--precision",
        "bf16",
        "--micro_batch_size",
        "1",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    sweep = json.loads(result.stdout)
    assert sweep["num_nodes"] == 2
    xl = next(r for r in sweep["presets"] if r["preset"] == "gpt2-xl")["strategies"]
    hybrid = [name for name in sweep["strategies"] if registry.get(name).multi_machine]
    assert hybrid and all(xl[name]["fits"] for name in sweep["strategies"])
    for name in hybrid:  # its shard is an eighth of the model (one machine's GPUs), FSDP's a sixteenth
        assert xl["fsdp"]["peak_bytes"] < xl[name]["peak_bytes"] < xl["single"]["peak_bytes"]
    one_machine = json.loads(
        _plan(
            "--sweep", "--gpu", "H100", "--num_gpus", "8", "--precision", "bf16", "--micro_batch_size", "1", "--json"
        ).stdout
    )
    assert not any(registry.get(name).multi_machine for name in one_machine["strategies"])


@pytest.mark.parametrize(
    "args,message",
    [
        (["--gpu", "T4", "--execute"], "--execute runs the command of --launch"),
        (
            [
                "--gpu",
                "H100",
                "--num_gpus",
                "8",
                "--num_nodes",
                "2",
                "--inter_node_gb_s",
                "45",
                "--launch",
                "--execute",
            ],
            "--execute runs one machine's command; with --num_nodes run each machine's printed line there",
        ),
        (["--gpu", "T4", "--cpu"], "--cpu plans a launch"),
        (["--gpu", "T4", "--cpu", "--launch"], "takes --gpu_memory_gib"),
        (["--preset", "gpt2-xl", "--gpu", "T4", "--launch"], "no strategy fits"),
        (["--sweep"], "--sweep needs --gpu"),
        (["--gpu", "T4", "--sweep", "--launch"], "give one of them"),
        (["--gpu", "T4", "--figure", "wall.png"], "--figure draws the sweep"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = _plan(*args)
    assert result.returncode == 2, result
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_train_py_auto_on_two_t4_says_when_the_launched_strategy_is_not_the_plans() -> None:
    """The start-up check of `train.py --strategy auto`, given the device a T4 pair reports."""
    from planner.launch import Device, startup_note
    from planner.request import DEFAULT_MFU
    from training.cli import parse_config

    t4_pair = Device("Tesla T4", 15102 / 1024, 2)
    config = parse_config(["--preset", "gpt2-large"])
    note = startup_note(config, "ddp", "fp16", t4_pair, DEFAULT_MFU)
    assert note is not None and note.startswith("plan: launched ddp, but on 2 x Tesla T4 the plan picks fsdp")
    assert "--micro_batch_size 2" in note
    assert startup_note(config, "fsdp", "fp16", t4_pair, DEFAULT_MFU) is None  # the plan's own pick
    shallow = parse_config(["--preset", "gpt2-large", "--n_layer", "1"])  # not the preset's model: no plan
    assert startup_note(shallow, "ddp", "fp16", t4_pair, DEFAULT_MFU) is None
