"""The strategy guard: what the launch requested vs what is in effect (unit level).

The same fallbacks are reproduced with real processes in test_strategies.py.
"""

from __future__ import annotations

import dataclasses

import pytest

from training.distributed.strategy import (
    StrategyMismatch,
    check_strategy,
    choose_precision,
    requested_from_env,
)
from training.records.record import EffectiveRecord

FSDP_LAUNCH = {"ACCELERATE_USE_FSDP": "true", "WORLD_SIZE": "2", "ACCELERATE_MIXED_PRECISION": "fp16"}
DDP_LAUNCH = {"WORLD_SIZE": "2", "ACCELERATE_MIXED_PRECISION": "fp16"}
MULTI_CPU_ONE_PROCESS = {"ACCELERATE_USE_CPU": "True", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def _effective(strategy: str, world_size: int, wrapper: str, sharded: bool = False) -> EffectiveRecord:
    return EffectiveRecord(
        strategy=strategy,
        world_size=world_size,
        num_machines=1,
        backend="gloo",
        distributed_type="MULTI_CPU",
        wrapper=wrapper,
        params_sharded=sharded,
        local_param_numel=1,
        global_param_numel=2,
        precision="fp32",
        device_type="cpu",
    )


def test_launch_variables_name_the_requested_strategy() -> None:
    assert requested_from_env(FSDP_LAUNCH).strategy == "fsdp"
    assert requested_from_env(DDP_LAUNCH).strategy == "ddp"
    assert requested_from_env({}).strategy == "single"
    assert requested_from_env(DDP_LAUNCH).world_size == 2
    assert requested_from_env(MULTI_CPU_ONE_PROCESS).world_size is None


@pytest.mark.parametrize(
    "launch, effective",
    [
        (FSDP_LAUNCH, _effective("fsdp", 2, "FSDPModule", sharded=True)),
        (DDP_LAUNCH, _effective("ddp", 2, "DistributedDataParallel")),
        ({}, _effective("single", 1, "GPT2")),
    ],
)
def test_matching_strategies_pass(launch: dict[str, str], effective: EffectiveRecord) -> None:
    requested = requested_from_env(launch)
    assert check_strategy(requested, effective) is None  # no StrategyMismatch
    # The same pair with the world size changed is refused: the guard did compare this pair.
    other = dataclasses.replace(effective, world_size=effective.world_size + 2)
    with pytest.raises(StrategyMismatch, match=f"requested {requested.strategy}"):
        check_strategy(requested, other)


def test_fsdp_silently_become_ddp_is_refused() -> None:
    with pytest.raises(StrategyMismatch, match="requested fsdp with 2 .* strategy ddp"):
        check_strategy(requested_from_env(FSDP_LAUNCH), _effective("ddp", 2, "DistributedDataParallel"))


def test_unconnected_processes_are_refused() -> None:
    # Each of the two launched processes sees a world of one: two separate trainings.
    with pytest.raises(StrategyMismatch, match="1 connected process"):
        check_strategy(requested_from_env(DDP_LAUNCH), _effective("single", 1, "GPT2"))
    with pytest.raises(StrategyMismatch, match="requested fsdp"):
        check_strategy(requested_from_env(FSDP_LAUNCH), _effective("single", 1, "GPT2"))


def test_multi_cpu_config_that_started_one_process_is_refused() -> None:
    with pytest.raises(StrategyMismatch, match="requested ddp with several process"):
        check_strategy(requested_from_env(MULTI_CPU_ONE_PROCESS), _effective("single", 1, "GPT2"))


def test_strategy_flag_must_agree_with_the_launch() -> None:
    with pytest.raises(StrategyMismatch, match="--strategy fsdp was requested but the launch config gives ddp"):
        requested_from_env(DDP_LAUNCH, expected="fsdp")
    assert requested_from_env(FSDP_LAUNCH, expected="fsdp").strategy == "fsdp"


def test_fp16_on_cpu_falls_back_to_fp32_with_a_warning() -> None:
    assert choose_precision("fp16", "cpu", "cpu")[0] == "no"
    assert "fp32" in choose_precision("fp16", "cpu", "cpu")[1]
    assert choose_precision("bf16", "cpu", "cpu") == ("bf16", None)
    assert choose_precision("fp16", "cuda", "Tesla T4") == ("fp16", None)
    assert "T4" in choose_precision("bf16", "cuda", "Tesla T4")[1]


def test_the_test_only_switch_keeps_fp16_on_the_cpu_and_says_so() -> None:
    from training.distributed.strategy import CPU_FP16_SWITCH, cpu_fp16_switched_on

    precision, warning = choose_precision("fp16", "cpu", "cpu", cpu_fp16=True)
    assert precision == "fp16" and CPU_FP16_SWITCH in warning and "tests only" in warning
    # It changes nothing else: another precision asked for, or a GPU, goes as without it.
    assert choose_precision("no", "cpu", "cpu", cpu_fp16=True) == ("no", None)
    assert choose_precision("bf16", "cpu", "cpu", cpu_fp16=True) == ("bf16", None)
    assert choose_precision("fp16", "cuda", "Tesla T4", cpu_fp16=True) == ("fp16", None)
    assert cpu_fp16_switched_on({"GPT2S_CPU_FP16": "1"}) and not cpu_fp16_switched_on({"GPT2S_CPU_FP16": "0"})
    assert not cpu_fp16_switched_on({})


@pytest.mark.parametrize("sharded", [False, True], ids=["one_process", "fsdp2"])
def test_the_switch_sets_up_accelerates_gpu_scaler_and_fsdp2s_float16_policy(
    sharded: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`_enable_fp16_on_cpu` as `create_accelerator` calls it, in one process without a launch: accelerate's own
    scaler (torch.amp.GradScaler on the CPU, enabled, at torch's defaults), autocast on, and under FSDP2 the
    MixedPrecisionPolicy a GPU gets, computing and reducing in float16."""
    import torch
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from training.distributed.strategy import _enable_fp16_on_cpu, _enable_fsdp_on_cpu

    monkeypatch.setenv("FSDP_VERSION", "2")
    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        accelerator = Accelerator(cpu=True, mixed_precision="fp16")
        assert accelerator.scaler is None  # what accelerate leaves on the CPU
        if sharded:
            _enable_fsdp_on_cpu(accelerator, "fp16")
        _enable_fp16_on_cpu(accelerator)
        scaler = accelerator.scaler
        assert type(scaler) is torch.amp.GradScaler and scaler.is_enabled() and accelerator.native_amp
        assert scaler.state_dict() == torch.amp.GradScaler("cpu").state_dict()
        assert accelerator.is_fsdp2 is sharded
        if sharded:
            policy = accelerator.state.fsdp_plugin.mixed_precision_policy
            assert policy.param_dtype == policy.reduce_dtype == torch.float16
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


@pytest.mark.parametrize("autocast", [True, False], ids=["autocast", "none"])
def test_the_observer_records_the_autocast_the_first_block_runs_under(autocast: bool) -> None:
    import contextlib

    import torch

    from model import GPT2, GPT2Config
    from training.distributed.strategy import ShardingObserver

    model = GPT2(GPT2Config.from_preset("tiny"))
    observer = ShardingObserver(model, torch.optim.SGD(model.parameters(), lr=0.0))
    ids = torch.zeros((1, 8), dtype=torch.long)
    with torch.autocast("cpu", dtype=torch.float16) if autocast else contextlib.nullcontext():
        model(ids, ids)
    assert observer.result["autocast_dtype_in_forward"] == ("float16" if autocast else None)
    assert observer.result["block_param_dtype_in_forward"] == "float32"


ZERO2_LAUNCH = {**FSDP_LAUNCH, "FSDP_RESHARD_AFTER_FORWARD": "false", "FSDP_OFFLOAD_PARAMS": "false"}
OFFLOAD_LAUNCH = {**FSDP_LAUNCH, "FSDP_RESHARD_AFTER_FORWARD": "true", "FSDP_OFFLOAD_PARAMS": "true"}


def test_fsdp_mode_is_read_from_the_launch_variables() -> None:
    assert requested_from_env(ZERO2_LAUNCH).strategy == "fsdp_zero2"
    assert requested_from_env(OFFLOAD_LAUNCH).strategy == "fsdp_offload"
    assert requested_from_env({**FSDP_LAUNCH, "FSDP_RESHARD_AFTER_FORWARD": "true"}).strategy == "fsdp"
    assert requested_from_env({**ZERO2_LAUNCH, "FSDP_OFFLOAD_PARAMS": "true"}).strategy == "fsdp_zero2_offload"


def test_fsdp_mode_in_effect_must_be_the_launched_one() -> None:
    check_strategy(requested_from_env(ZERO2_LAUNCH), _effective("fsdp_zero2", 2, "FSDPModule", sharded=True))
    with pytest.raises(StrategyMismatch, match="requested fsdp_zero2 with 2 .* strategy fsdp "):
        check_strategy(requested_from_env(ZERO2_LAUNCH), _effective("fsdp", 2, "FSDPModule", sharded=True))
    with pytest.raises(StrategyMismatch, match="requested fsdp_offload .* unsharded parameters"):
        check_strategy(requested_from_env(OFFLOAD_LAUNCH), _effective("fsdp_offload", 2, "FSDPModule"))
    with pytest.raises(StrategyMismatch, match="--strategy fsdp was requested but the launch config gives fsdp_zero2"):
        requested_from_env(ZERO2_LAUNCH, expected="fsdp")
    with pytest.raises(StrategyMismatch, match="launch with accelerate_configs/fsdp_offload.yaml"):
        requested_from_env(FSDP_LAUNCH, expected="fsdp_offload")


def test_every_strategy_has_its_config_file() -> None:
    from tests.launch import CONFIGS
    from training.config import STRATEGIES
    from training.distributed.registry import config_files

    # One registry serves the guard and the experiment driver alike.
    CONFIG_FILES = EXPERIMENT_CONFIGS = config_files()

    assert set(CONFIG_FILES) == set(STRATEGIES) - {"auto"} == set(EXPERIMENT_CONFIGS)
    for strategy, name in CONFIG_FILES.items():
        assert (CONFIGS / name).is_file(), strategy
        assert EXPERIMENT_CONFIGS[strategy] == name
