"""Which strategy a run asked for, which one is really in effect, and the guard between them.

accelerate picks the strategy from the launch config, but on a machine without a GPU it degrades
silently (measured with accelerate 1.16, torch 2.13 CPU):
  * an FSDP config with `Accelerator(cpu=True)` wraps the model in DDP instead;
  * an FSDP or DDP config with `Accelerator()` runs N unconnected single-process trainings;
  * a MULTI_CPU config without an MPI host file starts one process.
A comparison of strategies is worthless if one of them is secretly another, so every run records what
was requested and what is in effect, and stops at start-up when they differ.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Mapping

import torch
import torch.nn as nn
from accelerate import Accelerator
from accelerate.utils import DistributedType

# accelerate versions with which `_enable_fsdp_on_cpu` was verified to take effect.
_FSDP_ON_CPU_TESTED_ACCELERATE = ("1.16.",)


class StrategyMismatch(RuntimeError):
    """The strategy in effect is not the one requested; the message is one line naming both."""


@dataclass(frozen=True)
class RequestedLaunch:
    """What the launch (accelerate config + command line) asked for."""

    strategy: str  # single | ddp | fsdp
    world_size: int | None  # None: the config asked for several processes, how many is not visible
    num_machines: int
    mixed_precision: str  # no | fp16 | bf16

    def describe(self) -> str:
        processes = "several" if self.world_size is None else str(self.world_size)
        return f"{self.strategy} with {processes} process(es)"


@dataclass(frozen=True)
class EffectiveStrategy:
    """What is really running, read off the process group and the prepared model."""

    strategy: str  # single | ddp | fsdp
    world_size: int
    num_machines: int
    backend: str
    distributed_type: str
    wrapper: str
    params_sharded: bool
    local_param_numel: int
    global_param_numel: int
    precision: str  # fp32 | fp16 | bf16
    device_type: str
    block_shard_fractions: tuple[float, ...] = ()  # local/global parameter share of each FSDP-wrapped block

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def requested_from_env(env: Mapping[str, str], expected: str = "auto") -> RequestedLaunch:
    """Read the request from the variables `accelerate launch` (or torchrun) sets for the script."""
    world_size = int(env.get("WORLD_SIZE", "1"))
    group_world = int(env.get("GROUP_WORLD_SIZE", "1"))
    use_fsdp = env.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    # A MULTI_CPU config sets ACCELERATE_USE_CPU and a rendezvous address, yet without an MPI host
    # file accelerate starts a single process and no WORLD_SIZE: the config asked for several.
    multi_cpu_config = env.get("ACCELERATE_USE_CPU", "").lower() == "true" and "MASTER_ADDR" in env
    launched = "fsdp" if use_fsdp else ("ddp" if world_size > 1 or multi_cpu_config else "single")
    if expected != "auto" and expected != launched:
        raise StrategyMismatch(
            f"--strategy {expected} was requested but the launch config gives {launched} "
            f"({world_size} process(es)); launch with accelerate_configs/{_config_file(expected)}"
        )
    return RequestedLaunch(
        strategy=launched,
        world_size=None if multi_cpu_config and world_size == 1 else world_size,
        num_machines=group_world,
        mixed_precision=env.get("ACCELERATE_MIXED_PRECISION", "no"),
    )


def _config_file(strategy: str) -> str:
    return {"single": "single_gpu.yaml", "ddp": "ddp.yaml", "fsdp": "fsdp.yaml"}[strategy]


def choose_precision(requested: str, device_type: str, device_name: str) -> tuple[str, str | None]:
    """The accelerate mixed-precision mode to use, and a one-line warning when it differs from the request."""
    if device_type != "cuda":
        if requested == "fp16":
            return "no", "fp16 is not available on CPU: training in fp32 (pass --mixed_precision bf16 for bf16)"
        return requested, None
    if requested == "bf16" and "T4" in device_name:
        # torch.cuda.is_bf16_supported() says True on a T4, but it has no bf16 tensor cores: bf16 is emulated.
        return requested, "bf16 on a T4 is emulated without tensor cores and slow: fp16 is the T4's fast precision"
    return requested, None


def precision_name(mixed_precision: str) -> str:
    return {"no": "fp32", "fp16": "fp16", "bf16": "bf16"}.get(mixed_precision, mixed_precision)


def create_accelerator(requested: RequestedLaunch, **accelerator_kwargs: Any) -> tuple[Accelerator, str | None]:
    """An Accelerator that runs the requested strategy on GPUs and, without GPUs, on the CPU over gloo.

    Returns the accelerator and a warning line for a precision change (None when there is none).
    """
    has_gpu = torch.cuda.is_available()
    device_name = torch.cuda.get_device_name(0) if has_gpu else "cpu"
    mixed_precision, warning = choose_precision(requested.mixed_precision, "cuda" if has_gpu else "cpu", device_name)
    # Without cpu=True on a GPU-less machine accelerate leaves every process unconnected (type NO).
    accelerator = Accelerator(cpu=not has_gpu, mixed_precision=mixed_precision, **accelerator_kwargs)
    if requested.strategy == "fsdp" and not has_gpu:
        _enable_fsdp_on_cpu(accelerator, mixed_precision)
    return accelerator, warning


def _enable_fsdp_on_cpu(accelerator: Accelerator, mixed_precision: str) -> None:
    """Make accelerate apply FSDP2 on a CPU device mesh, which it would silently replace by DDP.

    accelerate (state.py) switches to FSDP only inside its branch for GPU-like device types, never for
    MULTI_CPU, although PyTorch's FSDP2 (`fully_shard` on a gloo CPU mesh) works there. Setting the
    distributed type in both shared-state dicts (AcceleratorState and PartialState: setting one only is
    undone) and handing AcceleratorState the FSDP plugin built from the launch's FSDP_* variables, as
    accelerate itself would, makes `prepare()` shard parameters as DTensors on the CPU mesh. This touches
    accelerate's private state, so it is verified right away and fails loudly if it did not take.
    """
    import accelerate
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import FullyShardedDataParallelPlugin

    if not accelerate.__version__.startswith(_FSDP_ON_CPU_TESTED_ACCELERATE):
        warnings.warn(
            f"FSDP on CPU is verified with accelerate {_FSDP_ON_CPU_TESTED_ACCELERATE}, found "
            f"{accelerate.__version__}; the strategy guard will stop the run if sharding does not take",
            stacklevel=2,
        )
    plugin = FullyShardedDataParallelPlugin()
    if mixed_precision != "no":
        plugin.set_mixed_precision(mixed_precision)
    AcceleratorState._shared_state["distributed_type"] = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    AcceleratorState._shared_state["fsdp_plugin"] = plugin
    if accelerator.distributed_type != DistributedType.FSDP or accelerator.state.fsdp_plugin is not plugin:
        raise StrategyMismatch(
            f"could not switch accelerate {accelerate.__version__} to FSDP on CPU "
            f"(distributed type stays {accelerator.distributed_type}); use a GPU or accelerate 1.16"
        )


def _wrapper_name(model: nn.Module) -> str:
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        return "DistributedDataParallel"
    if isinstance(model, FSDPModule):
        return "FSDPModule"
    return type(model).__name__


def parameter_sizes(model: nn.Module) -> tuple[bool, int, int]:
    """(any parameter is a DTensor shard, local element count, global element count)."""
    from torch.distributed.tensor import DTensor

    sharded, local, total = False, 0, 0
    for p in model.parameters():
        if isinstance(p, DTensor):
            sharded = True
            local += p.to_local().numel()
        else:
            local += p.numel()
        total += p.numel()
    return sharded, local, total


def block_shard_fractions(model: nn.Module) -> tuple[float, ...]:
    """For each FSDP unit below the root: the fraction of its parameters this rank holds."""
    from torch.distributed.fsdp import FSDPModule

    fractions = []
    for name, module in model.named_modules():
        if name and isinstance(module, FSDPModule):
            _, local, total = parameter_sizes(module)
            fractions.append(local / total if total else 0.0)
    return tuple(fractions)


def effective_strategy(accelerator: Accelerator, prepared_model: nn.Module) -> EffectiveStrategy:
    wrapper = _wrapper_name(prepared_model)
    sharded, local, total = parameter_sizes(prepared_model)
    if wrapper == "FSDPModule" and sharded:
        strategy = "fsdp"
    elif wrapper == "DistributedDataParallel":
        strategy = "ddp"
    elif accelerator.num_processes == 1:
        strategy = "single"
    else:
        strategy = f"unwrapped x{accelerator.num_processes}"
    num_machines = int(os.environ.get("GROUP_WORLD_SIZE", "1"))
    backend = torch.distributed.get_backend() if torch.distributed.is_initialized() else "none"
    return EffectiveStrategy(
        strategy=strategy,
        world_size=accelerator.num_processes,
        num_machines=num_machines,
        backend=backend,
        distributed_type=str(accelerator.distributed_type).split(".")[-1],
        wrapper=wrapper,
        params_sharded=sharded,
        local_param_numel=local,
        global_param_numel=total,
        precision=precision_name(accelerator.mixed_precision),
        device_type=accelerator.device.type,
        block_shard_fractions=block_shard_fractions(prepared_model),
    )


def check_strategy(requested: RequestedLaunch, effective: EffectiveStrategy) -> None:
    """Stop the run when the strategy in effect is not the one requested (one line naming both)."""
    problems = []
    if effective.strategy != requested.strategy:
        problems.append(f"strategy {effective.strategy} ({effective.wrapper})")
    if requested.world_size is None:
        if effective.world_size < 2:
            problems.append(f"{effective.world_size} connected process")
    elif effective.world_size != requested.world_size:
        problems.append(f"{effective.world_size} connected process(es)")
    if requested.strategy == "fsdp" and effective.world_size > 1 and not effective.params_sharded:
        problems.append("unsharded parameters")
    if problems:
        raise StrategyMismatch(
            f"requested {requested.describe()}, but in effect: {', '.join(problems)} "
            f"(distributed type {effective.distributed_type}); "
            "refusing to record one strategy's figures under another's name"
        )
