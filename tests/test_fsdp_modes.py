"""The two other FSDP modes, fsdp_zero2 and fsdp_offload, are what they claim and train as one process does.

Real launches with the project's config files: 2 processes over gloo on CPU, fp32, the tiny preset.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.launch import SHARED_STEPS, assert_planned_exactly, summary, train
from tests.test_strategies import _assert_same_steps, assert_same_validation, assert_same_weights

pytestmark = pytest.mark.multiprocess

STEPS = SHARED_STEPS
CONFIGS = {"single": "single_gpu.yaml", "fsdp_zero2": "fsdp_zero2.yaml", "fsdp_offload": "fsdp_offload.yaml"}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fsdp_modes")


@pytest.fixture(scope="module")
def runs(shared_runs) -> dict[str, Path]:
    """The shared runs (tests/conftest.py): each mode launched once, at the defaults (W&B on, export on);
    the offload run also checkpoints activations (tests/launch.py SHARED_EXTRA)."""
    return {strategy: shared_runs[strategy] for strategy in CONFIGS}


@pytest.mark.parametrize("strategy", ["fsdp_zero2", "fsdp_offload"])
def test_fsdp_mode_matches_the_single_process_step_by_step(runs: dict[str, Path], strategy: str) -> None:
    _assert_same_steps(runs[strategy], runs["single"], range(1, STEPS + 1))
    assert summary(runs[strategy])["global_batch_tokens"] == summary(runs["single"])["global_batch_tokens"]
    assert (summary(runs[strategy])["world_size"], summary(runs[strategy])["precision"]) == (2, "fp32")


@pytest.mark.parametrize("strategy", ["fsdp_zero2", "fsdp_offload"])
def test_fsdp_mode_validates_as_the_single_process(runs: dict[str, Path], strategy: str) -> None:
    assert_same_validation(runs[strategy], runs["single"])


@pytest.mark.parametrize("strategy", ["fsdp_zero2", "fsdp_offload"])
def test_fsdp_mode_ends_with_the_weights_of_the_single_process(runs: dict[str, Path], strategy: str) -> None:
    assert_same_weights(runs[strategy], runs["single"])


def test_each_mode_is_recorded_as_read_from_the_live_fsdp_units(runs: dict[str, Path]) -> None:
    zero2, offload, single = (summary(runs[s]) for s in ("fsdp_zero2", "fsdp_offload", "single"))
    assert (zero2["strategy"], zero2["fsdp_reshard_after_forward"], zero2["fsdp_offload_params"]) == (
        "fsdp_zero2",
        False,
        False,
    )
    assert (offload["strategy"], offload["fsdp_reshard_after_forward"], offload["fsdp_offload_params"]) == (
        "fsdp_offload",
        True,
        True,
    )
    assert (single["fsdp_reshard_after_forward"], single["fsdp_offload_params"]) == (None, None)
    for s in (zero2, offload):
        assert s["params_sharded"] and s["wrapper"] == "FSDPModule" and s["param_devices"] == ["cpu"]
        assert s["block_shard_fractions"] == [pytest.approx(0.5, abs=0.02)] * 2


def test_zero2_keeps_block_parameters_whole_between_forward_and_backward(runs: dict[str, Path]) -> None:
    seen = summary(runs["fsdp_zero2"])["sharding_observed"]
    assert seen["block_params_between_forward_and_backward"] == "whole"
    assert seen["block_param_fraction_held_between_forward_and_backward"] == 1.0
    # ... while gradients and optimizer state are sharded, as ZeRO-2.
    assert seen["grads"] == "sharded" and seen["grad_fraction_held"] == pytest.approx(0.5, abs=0.01)
    assert seen["optimizer_state_fraction_held"] == pytest.approx(0.5, abs=0.01)


def test_full_sharding_reshards_block_parameters_after_forward(runs: dict[str, Path]) -> None:
    seen = summary(runs["fsdp_offload"])["sharding_observed"]
    assert seen["block_params_between_forward_and_backward"] == "sharded"
    assert seen["block_param_fraction_held_between_forward_and_backward"] == pytest.approx(0.5, abs=0.01)
    assert seen["grads"] == "sharded" and seen["optimizer_state_fraction_held"] == pytest.approx(0.5, abs=0.01)
    assert seen["grad_devices"] == seen["optimizer_state_devices"] == seen["param_devices_after_step"] == ["cpu"]
    single = summary(runs["single"])["sharding_observed"]
    assert single["block_params_between_forward_and_backward"] == "whole" and single["grads"] == "whole"
    assert single["optimizer_state_fraction_held"] == 1.0


def test_fsdp_activation_checkpointing_is_accelerates_wrapper(runs: dict[str, Path]) -> None:
    offload, zero2 = summary(runs["fsdp_offload"]), summary(runs["fsdp_zero2"])
    assert offload["levers"]["activation_checkpointing"] == "fsdp" and offload["checkpoint_wrapped_blocks"] == 2
    assert zero2["levers"]["activation_checkpointing"] == "off" and zero2["checkpoint_wrapped_blocks"] == 0


@pytest.mark.parametrize("strategy", ["fsdp_zero2", "fsdp_offload"])
def test_planned_memory_matches_what_each_rank_measured(runs: dict[str, Path], strategy: str) -> None:
    """zero2 keeps every block gathered; offload (with checkpointing here) holds its state on the host,
    which on a CPU is the same memory: model state byte for byte, the step peak within 0.05%."""
    assert_planned_exactly(runs[strategy])


def test_guard_refuses_a_strategy_flag_the_config_does_not_give(workdir: Path, base_args: list[str]) -> None:
    out = workdir / "mismatch"
    result = train("fsdp_zero2.yaml", out, [*base_args, "--wandb_mode", "disabled", "--strategy", "fsdp"], check=False)
    # Each rank exits 3; torchrun reports them and `accelerate launch` itself exits 1.
    assert result.returncode != 0 and "exitcode  : 3" in result.stdout + result.stderr
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert error_lines == [
        "error: --strategy fsdp was requested but the launch config gives fsdp_zero2 "
        "(2 process(es)); launch with accelerate_configs/fsdp.yaml"
    ]
    assert not (out / "metrics.jsonl").exists()
