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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from accelerate import Accelerator
from accelerate.utils import DistributedType

from training.distributed import registry
from training.distributed.registry import FsdpMode, Wrapper
from training.records.record import EffectiveRecord
from training.versions import NEWEST_TESTED

# The accelerate series with which `_enable_fsdp_on_cpu` was verified to take effect: the newest tested.
_FSDP_ON_CPU_TESTED_ACCELERATE = (f"{NEWEST_TESTED['accelerate']}.",)


def _env_flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    # accelerate writes these as str(bool).lower(); FSDP1 spellings of the sharding strategy are accepted too.
    value = env.get(name)
    if value is None:
        return default
    return value.strip().lower() in ("true", "1", "yes", "full_shard")


class StrategyMismatch(RuntimeError):
    """The strategy in effect is not the one requested; the message is one line naming both."""


@dataclass(frozen=True)
class MeshLayout:
    """The data-parallel device mesh of accelerate's parallelism_config: replicas x shard group size.

    Under hybrid sharding (HSDP) the shard groups are meant to be the devices of one machine and the
    replicas the machines, so that only the gradient all-reduce between replicas crosses machines.
    """

    dp_replicate_size: int
    dp_shard_size: int

    @property
    def size(self) -> int:
        return self.dp_replicate_size * self.dp_shard_size

    def describe(self) -> str:
        return f"mesh replicate {self.dp_replicate_size} x shard {self.dp_shard_size}"


@dataclass(frozen=True)
class RequestedLaunch:
    """What the launch (accelerate config + command line) asked for."""

    strategy: str  # a training.distributed.registry name
    world_size: int | None  # None: the config asked for several processes, how many is not visible
    num_machines: int
    mixed_precision: str  # no | fp16 | bf16
    mesh: MeshLayout | None = None  # the launch's parallelism_config sizes; None when it has none

    def describe(self) -> str:
        processes = "several" if self.world_size is None else str(self.world_size)
        mesh = f" on a {self.mesh.describe()}" if self.mesh is not None else ""
        return f"{self.strategy} with {processes} process(es){mesh}"


def requested_from_env(env: Mapping[str, str], expected: str = "auto") -> RequestedLaunch:
    """Read the request from the variables `accelerate launch` (or torchrun) sets for the script."""
    world_size = int(env.get("WORLD_SIZE", "1"))
    group_world = int(env.get("GROUP_WORLD_SIZE", "1"))
    use_fsdp = env.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    mesh = _requested_mesh(env)
    # A MULTI_CPU config sets ACCELERATE_USE_CPU and a rendezvous address, yet without an MPI host
    # file accelerate starts a single process and no WORLD_SIZE: the config asked for several.
    multi_cpu_config = env.get("ACCELERATE_USE_CPU", "").lower() == "true" and "MASTER_ADDR" in env
    if use_fsdp:
        launched = registry.fsdp_mode_name(
            FsdpMode(
                _env_flag(env, "FSDP_RESHARD_AFTER_FORWARD", True),
                _env_flag(env, "FSDP_OFFLOAD_PARAMS", False),
                hybrid=mesh is not None and mesh.dp_replicate_size > 1,
            )
        )
    else:
        launched = registry.unsharded(multi_process=world_size > 1 or multi_cpu_config).name
    if expected != registry.AUTO and expected != launched:
        raise StrategyMismatch(
            f"--strategy {expected} was requested but the launch config gives {launched} "
            f"({world_size} process(es)); launch with accelerate_configs/{registry.get(expected).config_file}"
        )
    _check_mesh_fits(mesh, world_size, group_world, int(env.get("LOCAL_WORLD_SIZE", str(world_size))))
    return RequestedLaunch(
        strategy=launched,
        world_size=None if multi_cpu_config and world_size == 1 else world_size,
        num_machines=group_world,
        mixed_precision=env.get("ACCELERATE_MIXED_PRECISION", "no"),
        mesh=mesh,
    )


def _check_mesh_fits(mesh: MeshLayout | None, world_size: int, machines: int, per_machine: int) -> None:
    """Refuse, in one line, a hybrid mesh that is not the launch's machines x processes per machine.

    HSDP's shard groups are meant to be the processes of one machine and its replicas the machines; any
    other mesh either does not cover the processes launched or makes a shard group's all-gathers cross the
    link between machines. The fix named is accelerate's own override, which scripts/slurm/launch_node.sh
    passes from the launch.
    """
    if mesh is None:
        return
    fits = mesh.size == world_size
    if mesh.dp_replicate_size > 1 and machines > 1:
        fits = fits and (mesh.dp_replicate_size, mesh.dp_shard_size) == (machines, per_machine)
    if not fits:
        raise StrategyMismatch(
            f"the launch config's {mesh.describe()} needs {mesh.size} processes and does not fit the "
            f"{world_size} launched ({machines} machine(s) x {per_machine}); launch with "
            f"--num_processes {world_size} --parallelism_config_dp_replicate_size {machines} "
            f"--parallelism_config_dp_shard_size {per_machine} (scripts/slurm/launch_node.sh passes them)"
        )


def _requested_mesh(env: Mapping[str, str]) -> MeshLayout | None:
    """The data-parallel sizes of the launch's parallelism_config, as `accelerate launch` passes them on."""
    if env.get("ACCELERATE_USE_PARALLELISM_CONFIG", "false").lower() != "true":
        return None
    return MeshLayout(
        int(env.get("PARALLELISM_CONFIG_DP_REPLICATE_SIZE", "1")), int(env.get("PARALLELISM_CONFIG_DP_SHARD_SIZE", "1"))
    )


# The test-only switch (docs/guide.md) that runs the GPU's fp16 path on the CPU: autocast in float16 and
# accelerate's grad scaler, as `Accelerator` sets them up on a GPU (`_enable_fp16_on_cpu`). Off, a CPU run
# asked for fp16 trains in fp32. Slow, and nothing a CPU run needs: it exists so that the path every T4 user
# takes is tested where no GPU is.
CPU_FP16_VARIABLE = "GPT2S_CPU_FP16"
CPU_FP16_SWITCH = f"{CPU_FP16_VARIABLE}=1"


def cpu_fp16_switched_on(env: Mapping[str, str]) -> bool:
    return env.get(CPU_FP16_VARIABLE, "").strip() == "1"


def choose_precision(
    requested: str, device_type: str, device_name: str, cpu_fp16: bool = False
) -> tuple[str, str | None]:
    """The accelerate mixed-precision mode to use, and a one-line warning when it differs from the request
    (or when `cpu_fp16`, the test-only switch, keeps fp16 on the CPU)."""
    if device_type != "cuda":
        if requested == "fp16" and cpu_fp16:
            return requested, f"fp16 on the CPU by {CPU_FP16_SWITCH}: the GPU's fp16 path, slow, for tests only"
        if requested == "fp16":
            # The precision is accelerate's flag, not train.py's: name where it goes.
            return "no", (
                "fp16 is not available on CPU: training in fp32 "
                "(for bf16: accelerate launch --mixed_precision bf16 ... train.py)"
            )
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
    mixed_precision, warning = choose_precision(
        requested.mixed_precision, "cuda" if has_gpu else "cpu", device_name, cpu_fp16_switched_on(os.environ)
    )
    mesh_on_cpu = requested.mesh is not None and not has_gpu
    if mesh_on_cpu:
        # accelerate validates a parallelism_config as soon as the Accelerator is built, and refuses one whose
        # distributed type is MULTI_CPU, which is what every CPU launch is until `_enable_fsdp_on_cpu` makes it
        # FSDP. A config of size 1 keeps it from reading the launch's one now (it reads the environment only
        # when given none); `_apply_parallelism_config_on_cpu` applies the launch's one after the switch.
        from accelerate.parallelism_config import ParallelismConfig

        accelerator_kwargs["parallelism_config"] = ParallelismConfig(
            dp_replicate_size=1, dp_shard_size=1, tp_size=1, cp_size=1, sp_size=1
        )
    # Without cpu=True on a GPU-less machine accelerate leaves every process unconnected (type NO).
    accelerator = Accelerator(cpu=not has_gpu, mixed_precision=mixed_precision, **accelerator_kwargs)
    if registry.shards(requested.strategy) and not has_gpu:
        _enable_fsdp_on_cpu(accelerator, mixed_precision)
    if mesh_on_cpu:
        _apply_parallelism_config_on_cpu(accelerator)
    if mixed_precision == "fp16" and not has_gpu:
        _enable_fp16_on_cpu(accelerator)
    return accelerator, warning


def _enable_fp16_on_cpu(accelerator: Accelerator) -> None:
    """Set up fp16 on the CPU exactly as `Accelerator.__init__` does on a GPU, where it declines to on the CPU.

    accelerate 1.16 (accelerator.py, "Mixed precision attributes") turns on autocast in float16 (`native_amp`,
    which `prepare()` wraps the model's forward in, except under FSDP2, whose MixedPrecisionPolicy casts alone)
    and builds the grad scaler: `get_fsdp2_grad_scaler` under
    FSDP2 (torch.amp.GradScaler, whose unscale of DTensor gradients finds an inf on any rank through DTensor's
    all-reduce of found_inf), `get_grad_scaler` otherwise (torch.amp.GradScaler("cpu") here). FSDP2's
    MixedPrecisionPolicy(param_dtype=float16, reduce_dtype=float16) is set already, by `_enable_fsdp_on_cpu`'s
    `set_mixed_precision` as accelerate's state sets it on a GPU. Called after the switch to FSDP, which decides
    the scaler, and before `prepare()`, which hands the scaler to the optimizer.
    """
    import accelerate
    from accelerate.utils import get_grad_scaler
    from accelerate.utils.fsdp_utils import get_fsdp2_grad_scaler

    kwargs = accelerator.scaler_handler.to_kwargs() if accelerator.scaler_handler is not None else {}
    if accelerator.is_fsdp2:
        accelerator.scaler = get_fsdp2_grad_scaler(device=accelerator.device.type, **kwargs)
    else:
        accelerator.scaler = get_grad_scaler(accelerator.distributed_type, **kwargs)
    accelerator.native_amp = True
    if accelerator.mixed_precision != "fp16" or not accelerator.scaler.is_enabled():
        raise StrategyMismatch(
            f"could not set up fp16 on the CPU with accelerate {accelerate.__version__} "
            f"(mixed precision {accelerator.mixed_precision}); unset {CPU_FP16_VARIABLE}"
        )


def _apply_parallelism_config_on_cpu(accelerator: Accelerator) -> None:
    """Give accelerate the launch's parallelism_config and device mesh once it runs FSDP on the CPU.

    Everything here is accelerate's own: the config reads the launch's PARALLELISM_CONFIG_* sizes, builds the
    mesh (init_device_mesh on "cpu", over gloo) and validates itself against the accelerator, exactly as
    `Accelerator.__init__` does on a GPU; only the moment differs (after `_enable_fsdp_on_cpu`, so that the
    validation sees FSDP). `prepare()` then hands FSDP2 the mesh's (dp_replicate, dp_shard) dimensions.
    """
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.state import AcceleratorState

    config = ParallelismConfig()
    AcceleratorState._shared_state["parallelism_config"] = config
    accelerator.state.device_mesh = config.get_device_mesh(accelerator.device.type)
    try:
        config._validate_accelerator(accelerator)
    except ValueError as exc:
        raise StrategyMismatch(f"accelerate refuses the launch's parallelism_config: {exc}") from None


def _enable_fsdp_on_cpu(accelerator: Accelerator, mixed_precision: str) -> None:
    """Make accelerate apply FSDP2 on a CPU device mesh, which it would silently replace by DDP.

    accelerate (state.py) switches to FSDP only inside its branch for GPU-like device types, never for
    MULTI_CPU, although PyTorch's FSDP2 (`fully_shard` on a gloo CPU mesh) works there. Setting the
    distributed type in both shared-state dicts (AcceleratorState and PartialState: setting one only is
    undone) and handing AcceleratorState the FSDP plugin built from the launch's FSDP_* variables, as
    accelerate itself would, makes `prepare()` shard parameters as DTensors on the CPU mesh. This touches
    accelerate's private state, so it is verified right away and fails loudly if it did not take.

    The plugin reads FSDP_RESHARD_AFTER_FORWARD and FSDP_OFFLOAD_PARAMS itself, so the zero2 and offload
    modes take effect as on a GPU. Offloading "to the CPU" from the CPU moves nothing, but runs FSDP2's
    offload path (shards copied to the compute device for the all-gather, gradients copied back, the
    optimizer stepping the CPU shards); only pinned memory, which needs an accelerator, is turned off.
    """
    import accelerate
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import CPUOffloadPolicy

    if not accelerate.__version__.startswith(_FSDP_ON_CPU_TESTED_ACCELERATE):
        warnings.warn(
            f"FSDP on CPU is verified with accelerate {NEWEST_TESTED['accelerate']}, found "
            f"{accelerate.__version__}; the strategy guard will stop the run if sharding does not take",
            stacklevel=2,
        )
    plugin = FullyShardedDataParallelPlugin()
    if isinstance(plugin.cpu_offload, CPUOffloadPolicy):
        plugin.cpu_offload = CPUOffloadPolicy(pin_memory=False)
    if mixed_precision != "no":
        plugin.set_mixed_precision(mixed_precision)
    AcceleratorState._shared_state["distributed_type"] = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    AcceleratorState._shared_state["fsdp_plugin"] = plugin
    if accelerator.distributed_type != DistributedType.FSDP or accelerator.state.fsdp_plugin is not plugin:
        raise StrategyMismatch(
            f"could not switch accelerate {accelerate.__version__} to FSDP on CPU "
            f"(distributed type stays {accelerator.distributed_type}); use a GPU or accelerate "
            f"{NEWEST_TESTED['accelerate']}"
        )


def _wrapper_name(model: nn.Module) -> str:
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        return Wrapper.DDP.value
    if isinstance(model, FSDPModule):
        return Wrapper.FSDP.value
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


def block_units(model: nn.Module) -> list[nn.Module]:
    """The FSDP units of the transformer blocks (`transformer.h.N`, with or without a checkpoint wrapper)."""
    from torch.distributed.fsdp import FSDPModule

    return [
        m
        for name, m in model.named_modules()
        if isinstance(m, FSDPModule) and name.split(".")[-2:-1] == ["h"] and name.split(".")[-1].isdigit()
    ]


def fsdp_mode(model: nn.Module) -> tuple[bool | None, bool | None]:
    """(reshard after forward, offload to CPU) as the blocks' FSDP units hold them; None when not one value.

    Read from FSDP2's parameter group, the object that acts on them: it reshards after forward exactly
    when it has a post-forward mesh, and offloads when its offload policy is a CPUOffloadPolicy. The one
    private read left: torch 2.13's FSDPModule has setters for both (set_reshard_after_forward, the policy
    given to fully_shard) and no getter, and neither shows in a public tensor property at start-up (on the
    CPU an offloaded shard lives where a kept one does). The mesh and the placements are read publicly
    (hybrid_mesh); ShardingObserver checks the reshard mode again from the live DTensors in the first step.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy

    groups = [unit._get_fsdp_state()._fsdp_param_group for unit in block_units(model)]
    groups = [g for g in groups if g is not None]
    reshard = {g.post_forward_mesh_info is not None for g in groups}
    offload = {isinstance(g.offload_policy, CPUOffloadPolicy) for g in groups}
    return (reshard.pop() if len(reshard) == 1 else None), (offload.pop() if len(offload) == 1 else None)


@dataclass(frozen=True)
class HybridMesh:
    """The 2-D mesh the blocks' FSDP units shard over, as their parameter groups hold it (HSDP only)."""

    layout: MeshLayout
    shard_groups: tuple[tuple[int, ...], ...]  # the ranks of each shard group (the mesh's rows)


def hybrid_mesh(model: nn.Module) -> HybridMesh | None:
    """The mesh of the blocks' parameters when they are sharded over one dimension and replicated over the
    other; None when they shard over all ranks (plain FSDP), or disagree.

    Read through DTensor's public `device_mesh` and `placements`: under hybrid sharding FSDP2 places each
    parameter as (Replicate(), Shard(0)) on a 2-D mesh, whose rank tensor lists every rank, row by row.
    """
    from torch.distributed.tensor import DTensor, Replicate, Shard

    meshes = set()
    for p in (p for unit in block_units(model) for p in unit.parameters()):
        placements = p.placements if isinstance(p, DTensor) else ()
        replicated = [dim for dim, placement in enumerate(placements) if isinstance(placement, Replicate)]
        sharded = [dim for dim, placement in enumerate(placements) if isinstance(placement, Shard)]
        if len(placements) != 2 or len(replicated) != 1 or len(sharded) != 1:
            return None
        meshes.add((p.device_mesh, replicated[0], sharded[0]))
    if len(meshes) != 1:
        return None
    mesh, replicate_dim, shard_dim = meshes.pop()
    ranks = mesh.mesh.transpose(replicate_dim, shard_dim) if replicate_dim > shard_dim else mesh.mesh
    return HybridMesh(
        MeshLayout(mesh.size(replicate_dim), mesh.size(shard_dim)),
        tuple(tuple(int(r) for r in row) for row in ranks.reshape(mesh.size(replicate_dim), -1)),
    )


def machine_of_each_rank() -> tuple[int, ...]:
    """Which machine (torchrun's GROUP_RANK) each rank runs on, gathered from all ranks."""
    own = int(os.environ.get("GROUP_RANK", "0"))
    if not torch.distributed.is_initialized():
        return (own,)
    machines: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(machines, own)
    return tuple(machines)


def parameter_devices(model: nn.Module) -> tuple[str, ...]:
    """The device types the parameters (their local shards, for DTensors) are stored on."""
    return tuple(sorted({local_tensor(p).device.type for p in model.parameters()}))


def effective_strategy(accelerator: Accelerator, prepared_model: nn.Module) -> EffectiveRecord:
    wrapper = _wrapper_name(prepared_model)
    sharded, local, total = parameter_sizes(prepared_model)
    reshard, offload = fsdp_mode(prepared_model) if wrapper == Wrapper.FSDP.value else (None, None)
    hybrid = hybrid_mesh(prepared_model) if wrapper == Wrapper.FSDP.value else None
    strategy = _strategy_in_effect(wrapper, sharded, reshard, offload, hybrid is not None, accelerator.num_processes)
    num_machines = int(os.environ.get("GROUP_WORLD_SIZE", "1"))
    within_machines = None
    if hybrid is not None:
        machines = machine_of_each_rank()
        within_machines = all(len({machines[r] for r in group}) == 1 for group in hybrid.shard_groups)
    backend = torch.distributed.get_backend() if torch.distributed.is_initialized() else "none"
    cpu_fp16 = accelerator.scaler is not None and accelerator.device.type == "cpu"  # only the switch makes one there
    return EffectiveRecord(
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
        fsdp_reshard_after_forward=reshard,
        fsdp_offload_params=offload,
        param_devices=parameter_devices(prepared_model),
        checkpoint_wrapped_blocks=sum(type(m).__name__.endswith("CheckpointWrapper") for m in prepared_model.modules()),
        dp_replicate_size=hybrid.layout.dp_replicate_size if hybrid else None,
        dp_shard_size=hybrid.layout.dp_shard_size if hybrid else None,
        shard_groups=hybrid.shard_groups if hybrid else None,
        shard_groups_within_machines=within_machines,
        precision_switch=CPU_FP16_SWITCH if cpu_fp16 else None,
    )


def _strategy_in_effect(
    wrapper: str, sharded: bool, reshard: bool | None, offload: bool | None, hybrid: bool, num_processes: int
) -> str:
    """The registry name of what is running, read from the wrapper and FSDP's units; a description when none fits."""
    if wrapper == Wrapper.FSDP.value and sharded:
        known = reshard is not None and offload is not None
        return registry.fsdp_mode_name(FsdpMode(reshard, offload, hybrid) if known else None)
    by_wrapper = registry.by_wrapper(wrapper)
    if by_wrapper is not None and not by_wrapper.shards:
        return by_wrapper.name
    if num_processes == 1:
        return registry.unsharded(multi_process=False).name
    return f"unwrapped x{num_processes}"


def check_strategy(requested: RequestedLaunch, effective: EffectiveRecord) -> None:
    """Stop the run when the strategy in effect is not the one requested (one line naming both)."""
    problems = []
    if effective.strategy != requested.strategy:
        problems.append(f"strategy {effective.strategy} ({effective.wrapper})")
    if requested.world_size is None:
        if effective.world_size < 2:
            problems.append(f"{effective.world_size} connected process")
    elif effective.world_size != requested.world_size:
        problems.append(f"{effective.world_size} connected process(es)")
    if registry.shards(requested.strategy) and effective.world_size > 1 and not effective.params_sharded:
        problems.append("unsharded parameters")
    problems += _mesh_problems(requested, effective)
    if problems:
        raise StrategyMismatch(
            f"requested {requested.describe()}, but in effect: {', '.join(problems)} "
            f"(distributed type {effective.distributed_type}); "
            "refusing to record one strategy's figures under another's name"
        )


def _mesh_problems(requested: RequestedLaunch, effective: EffectiveRecord) -> list[str]:
    """How the live hybrid mesh differs from the launch's: its sizes, and shard groups that span machines
    (whose all-gathers would then cross the slow link every step)."""
    if requested.mesh is None or requested.mesh.dp_replicate_size == 1:
        return []
    live = (effective.dp_replicate_size, effective.dp_shard_size)
    if live != (requested.mesh.dp_replicate_size, requested.mesh.dp_shard_size):
        return [f"mesh replicate {live[0]} x shard {live[1]}" if live[0] else "no 2-D mesh"]
    if effective.num_machines > 1 and not effective.shard_groups_within_machines:
        return [f"shard groups {[list(g) for g in effective.shard_groups or ()]} spanning machines"]
    return []


class ShardingObserver:
    """What is sharded when, read once from the live tensors during the first training step.

    A forward hook on the prepared model, registered after FSDP's own, sees the state between forward
    and backward: whether the first block's parameters are then whole tensors (FSDP kept them gathered:
    zero2) or DTensor shards (resharded: full sharding), and how much of the block this rank holds. A
    post-step hook on the optimizer sees the gradients and optimizer state: their share and devices. A
    pre-forward hook on the first block sees the dtype its parameters are computed in and the autocast it runs under.
    The forward hooks remove themselves after their first call; the optimizer hook cannot (torch iterates over
    the live dict of step hooks, which another hook's removal would change under it), so it returns at
    once from the second step on.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.result: dict[str, Any] = {}
        units = block_units(model)
        self._block = units[0] if units else _first_block(model)
        self._handles = [
            model.register_forward_hook(self._after_forward),
            optimizer.register_step_post_hook(self._after_optimizer_step),
        ]
        if self._block is not None:  # after FSDP's own pre-forward hook: it sees the parameters as computed with
            self._handles.append(self._block.register_forward_pre_hook(self._in_block_forward))

    def _in_block_forward(self, module: nn.Module, args: Any) -> None:
        """The dtype the first block computes with: FSDP2's MixedPrecisionPolicy param_dtype, else the stored one
        (autocast casts each operation's inputs, not the parameters); and the autocast the block runs under, on
        the device of its input (None: autocast off)."""
        self.result["block_param_dtype_in_forward"] = str(next(module.parameters()).dtype).removeprefix("torch.")
        device = args[0].device.type if args and isinstance(args[0], torch.Tensor) else "cpu"
        on = torch.is_autocast_enabled(device)
        dtype = torch.get_autocast_dtype(device)
        self.result["autocast_dtype_in_forward"] = str(dtype).removeprefix("torch.") if on else None
        self._handles[2].remove()

    def _after_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        if not (module.training and torch.is_grad_enabled()) or self._block is None:
            return
        params = list(self._block.parameters())
        whole_numel = sum(_global_numel(p) for p in params)
        held = sum(local_tensor(p).numel() for p in params)
        self.result["block_params_between_forward_and_backward"] = (
            "sharded" if all(_is_dtensor(p) for p in params) else "whole"
        )
        self.result["block_param_fraction_held_between_forward_and_backward"] = held / whole_numel
        self._handles[0].remove()

    def _after_optimizer_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if "grads" in self.result:
            return
        params, grads, states = optimizer_tensors(optimizer)
        states = [t for t in states if t.dim() > 0]  # the moments; not AdamW's scalar step counters
        self.result["grads"] = "sharded" if grads and all(_is_dtensor(g) for g in grads) else "whole"
        self.result["grad_fraction_held"] = _fraction(grads)
        self.result["grad_devices"] = sorted({local_tensor(g).device.type for g in grads})
        self.result["optimizer_state_fraction_held"] = _fraction(states)
        self.result["optimizer_state_devices"] = sorted({local_tensor(t).device.type for t in states})
        self.result["param_devices_after_step"] = sorted({local_tensor(p).device.type for p in params})


def optimizer_tensors(
    optimizer: torch.optim.Optimizer,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """The live tensors an optimizer holds: its parameters, their gradients (those set) and its state tensors."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    grads = [p.grad for p in params if p.grad is not None]
    states = [t for p in params for t in optimizer.state.get(p, {}).values() if isinstance(t, torch.Tensor)]
    return params, grads, states


def _is_dtensor(t: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """What this rank holds of `t`: its local shard for a DTensor, else `t` itself."""
    return t.to_local() if _is_dtensor(t) else t


def _global_numel(t: torch.Tensor) -> int:
    return t.numel()  # a DTensor's numel is its global one


def _fraction(tensors: list[torch.Tensor]) -> float | None:
    total = sum(_global_numel(t) for t in tensors)
    return sum(local_tensor(t).numel() for t in tensors) / total if total else None


def _first_block(model: nn.Module) -> nn.Module | None:
    for name, module in model.named_modules():
        if name.split(".")[-2:] == ["h", "0"]:
            return module
    return None
