"""The adaptive launch: the fastest strategy that fits, with the levers it needs, as one `accelerate launch`.

  python -m planner --preset gpt2-large --gpu T4 --num_gpus 2 --launch [--execute]
  python -m planner --preset mini --cpu --gpu_memory_gib 0.05 --num_gpus 2 --launch

For every strategy the planner's own figures (planner/plan.py `plan_strategy`) are asked for each way of
making it fit, fastest first: the largest micro-batch the global batch allows (or --micro_batch_size), then
smaller ones that divide it (accumulation keeps the global batch), each without and then with activation
checkpointing.
A strategy's first fitting way is its candidate; the planner's recommendation over the candidates (fastest
beyond its uncertainty, else the one with the most memory left) is the launch. Offload is a strategy of its
own (fsdp_offload), so it competes like the others.

A CPU plan (`--cpu`) plans the processes the tests and development runs start: fp32, the CPU's unfused
optimizer, no CUDA reserve, and no offload strategy (its "host" is the same memory). Without a peak FLOP/s
there is no speed prediction, and the planner's rule for that case (least memory among those that fit) decides.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from planner.errors import PlanError
from planner.gpus import PLANNER_GPUS
from planner.plan import hardware, plan_strategy, planned_strategies, recommend, workload_for
from planner.request import PlanRequest
from training.config import preset_overrides
from training.distributed import registry

if TYPE_CHECKING:
    from training.config import TrainConfig

CONFIG_DIR = "accelerate_configs"
GIB = 2**30


@dataclass(frozen=True)
class Way:
    """One way to run a strategy: its micro-batch and whether activations are checkpointed."""

    micro_batch_size: int
    activation_checkpointing: bool


def hardware_for(args: PlanRequest) -> Any:
    """The GPUs of the plan (the launch's and the sweep's), with the link between machines when there are
    several; with --cpu, CPU processes of --gpu_memory_gib each (no CUDA reserve)."""
    if not args.cpu:
        return hardware(
            args.gpu, args.precision, args.gpu_memory_gib, args.link_gb_s, inter_node_gb_s=args.inter_node_gb_s
        )
    if args.gpu is not None or args.gpu_memory_gib is None:
        raise PlanError("a CPU plan (--cpu) takes --gpu_memory_gib as the memory per process, not --gpu")
    return replace(hardware(None, "fp32", args.gpu_memory_gib, args.link_gb_s), name="CPU process", reserve_gib=0.0)


def strategies_for(args: PlanRequest) -> list[str]:
    """The planned strategies on --num_gpus per machine and --num_nodes machines; on the CPU without the
    offloading ones (nothing to offload to)."""
    return [s for s in planned_strategies(args.num_gpus, args.num_nodes) if not (args.cpu and registry.get(s).offloads)]


def ways(args: PlanRequest, strategy: str) -> list[Way]:
    """Every way to try, fastest first: the largest micro-batch the global batch allows on this many devices
    (fewer, larger micro-steps), then smaller ones it divides by; without activation checkpointing before
    with it (it recomputes the forward in backward). A micro-batch given on the command line is the largest."""
    base = workload_for(args, strategy)
    sequences = base.micro_batch_size * base.grad_accum_steps  # per device per optimizer step
    largest = args.micro_batch_size or sequences
    micro = [m for m in range(min(largest, sequences), 0, -1) if sequences % m == 0]
    levels = (True,) if args.activation_checkpointing else (False, True)
    return [Way(m, ac) for ac in levels for m in micro]


def _plan_way(args: PlanRequest, strategy: str, way: Way, hw: Any) -> dict[str, Any]:
    shaped = replace(args, micro_batch_size=way.micro_batch_size, activation_checkpointing=way.activation_checkpointing)
    w = workload_for(shaped, strategy)
    if args.cpu:  # what a CPU process runs: fp32 and torch's per-tensor (unfused) AdamW
        w = replace(w, precision="fp32", fused_adamw=False, device="cpu")
    return {**plan_strategy(w, strategy, hw, args.assumed_mfu, args.overlap), "way": way}


def candidate(args: PlanRequest, strategy: str, hw: Any) -> dict[str, Any]:
    """The strategy's first way that fits, or its last (least memory; it does not fit) when none does."""
    planned = [_plan_way(args, strategy, way, hw) for way in ways(args, strategy)]
    return next((p for p in planned if p["fits"]), planned[-1])


def choose_launch(args: PlanRequest) -> dict[str, Any]:
    """The launch the plan picks: strategy, its way, the one line of why, and every candidate."""
    hw = hardware_for(args)
    # A launch over several machines runs on all of them: not a one-process strategy.
    launchable = [s for s in strategies_for(args) if args.num_nodes == 1 or registry.get(s).multi_process]
    candidates = [candidate(args, s, hw) for s in launchable]
    fitting = [c for c in candidates if c["fits"]]
    if not fitting:
        least = min(candidates, key=lambda c: c["per_device_bytes"]["total"])
        raise PlanError(
            f"no strategy fits {args.preset} on {args.num_gpus} x {hw.name} ({hw.memory_gib:.4g} GiB) "
            f"even at micro-batch 1 with activation checkpointing: the least is {least['strategy']} at "
            f"{least['per_device_bytes']['total'] / GIB:.2f} GiB; use more devices or more memory per device"
        )
    rec = recommend(fitting, hw, fitting[0]["way"].micro_batch_size)
    chosen = next(c for c in fitting if c["strategy"] == rec["strategy"])
    return {
        "strategy": chosen["strategy"],
        "way": chosen["way"],
        "candidates": candidates,
        "hardware": hw,
        "why": why(chosen, candidates, hw, rec),
    }


def why(chosen: dict[str, Any], candidates: list[dict[str, Any]], hw: Any, rec: dict[str, Any]) -> str:
    """One line: what does not fit, the levers the chosen strategy needs, and the planner's reason."""
    out = [c for c in candidates if not c["fits"]]
    wall = (
        (
            ", ".join(f"{c['strategy']} {c['per_device_bytes']['total'] / GIB:.1f} GiB" for c in out)
            + f" do not fit (a peak may reach {hw.budget_bytes / GIB:.2f} of {hw.memory_gib:.4g} GiB) even at micro-batch 1 "
            "with activation checkpointing; "
        )
        if out
        else ""
    )
    way = chosen["way"]
    levers = [f"micro-batch {way.micro_batch_size} x {chosen['grad_accum_steps']} accumulation"]
    levers += ["activation checkpointing"] if way.activation_checkpointing else []
    levers += ["CPU offload"] if registry.get(chosen["strategy"]).offloads else []
    return f"{wall}{chosen['strategy']} with {', '.join(levers)}: {rec['reason']}"


def command(args: PlanRequest, chosen: dict[str, Any]) -> list[str]:
    """The `accelerate launch` of the choice on one machine: the strategy's config, its processes and
    precision, train.py's flags."""
    entry = registry.get(chosen["strategy"])
    cmd = ["accelerate", "launch", "--config_file", f"{CONFIG_DIR}/{entry.config_file}"]
    if entry.multi_process:
        cmd += ["--num_processes", str(args.num_gpus)]
    return [*cmd, *_precision(args), *train_flags(args, chosen)]


def _precision(args: PlanRequest) -> list[str]:
    return ["--mixed_precision", mixed_precision(args)]


def mixed_precision(args: PlanRequest) -> str:
    return "no" if args.cpu or args.precision == "fp32" else args.precision


# The SLURM recipe (docs/multinode.md): the batch script, and the launch line it runs on every machine.
SLURM_BATCH = "scripts/slurm/train_multinode.sbatch"
MAIN_PROCESS_PORT = 29500  # launch_node.sh's default rendezvous port


def machine_command(args: PlanRequest, chosen: dict[str, Any], machine: int) -> list[str]:
    """What scripts/slurm/launch_node.sh runs on machine `machine` of --num_nodes, argument for argument: the
    same `accelerate launch` by hand (or from any scheduler) on a cluster without SLURM. The mesh follows the
    launch (a strategy on a device mesh: replicate = machines, shard = GPUs per machine); the rendezvous is
    c10d at the main machine, which accelerate passes to torchrun as --rdzv_endpoint."""
    entry = registry.get(chosen["strategy"])
    nodes, per_node = args.num_nodes, args.num_gpus
    mesh = ["--parallelism_config_dp_replicate_size", str(nodes), "--parallelism_config_dp_shard_size", str(per_node)]
    return [
        "accelerate",
        "launch",
        "--config_file",
        f"{CONFIG_DIR}/{entry.config_file}",
        *["--num_machines", str(nodes), "--num_processes", str(nodes * per_node), "--machine_rank", str(machine)],
        *(mesh if entry.fsdp is not None and entry.fsdp.hybrid else []),
        *["--main_process_ip", args.main_process_ip, "--main_process_port", str(MAIN_PROCESS_PORT)],
        *["--rdzv_backend", "c10d", "--rdzv_conf", f"is_host={int(machine == 0)}"],
        *_precision(args),
        *train_flags(args, chosen),
    ]


def slurm_command(args: PlanRequest, chosen: dict[str, Any]) -> list[str]:
    """The one `sbatch` of the choice: the batch script runs launch_node.sh on every node, which gives each the
    line of machine_command."""
    entry = registry.get(chosen["strategy"])
    return [
        f"MIXED_PRECISION={mixed_precision(args)}",
        "sbatch",
        f"--nodes={args.num_nodes}",
        f"--gpus-per-node={args.num_gpus}",
        SLURM_BATCH,
        f"{CONFIG_DIR}/{entry.config_file}",
        *train_flags(args, chosen)[1:],
    ]


def train_flags(args: PlanRequest, chosen: dict[str, Any]) -> list[str]:
    """train.py and its flags for the choice."""
    entry = registry.get(chosen["strategy"])
    way: Any = chosen["way"]
    cmd = [
        "train.py",
        "--preset",
        args.preset,
        "--strategy",
        entry.name,
        "--micro_batch_size",
        str(way.micro_batch_size),
    ]
    if args.block_size:
        cmd += ["--block_size", str(args.block_size)]
    if args.global_batch_tokens:
        cmd += ["--global_batch_tokens", str(args.global_batch_tokens)]
    preset_ac = bool(preset_overrides(args.preset).get("activation_checkpointing", False))
    if way.activation_checkpointing != preset_ac:
        cmd.append("--activation_checkpointing" if way.activation_checkpointing else "--no-activation_checkpointing")
    return cmd


def launch_text(args: PlanRequest, chosen: dict[str, Any]) -> str:
    if args.num_nodes == 1:
        return f"{shlex.join(command(args, chosen))}\n# why: {chosen['why']}"
    lines = [
        f"# {args.num_nodes} machines x {args.num_gpus} GPUs, {_mesh_text(args, chosen)}; --output_dir on a file "
        "system every machine shares. Under SLURM, from the repository root:",
        shlex.join(slurm_command(args, chosen)),
        f"# Without SLURM: on each machine, the line the batch script runs there (machine 0 at {args.main_process_ip}):",
        *(_shell_line(machine_command(args, chosen, m)) for m in range(args.num_nodes)),
        f"# why: {chosen['why']}",
    ]
    return "\n".join(lines)


def _shell_line(cmd: list[str]) -> str:
    """The command as one shell line; a $VARIABLE address is left for the shell to expand."""
    return " ".join(part if part.startswith("$") else shlex.quote(part) for part in cmd)


def _mesh_text(args: PlanRequest, chosen: dict[str, Any]) -> str:
    entry = registry.get(chosen["strategy"])
    if entry.fsdp is not None and entry.fsdp.hybrid:
        return f"mesh replicate {args.num_nodes} x shard {args.num_gpus} (one shard group per machine)"
    return f"{chosen['strategy']} over all {args.num_nodes * args.num_gpus} processes"


def launch_json(args: PlanRequest, chosen: dict[str, Any]) -> dict[str, Any]:
    way: Any = chosen["way"]
    return {
        "strategy": chosen["strategy"],
        "micro_batch_size": way.micro_batch_size,
        "activation_checkpointing": way.activation_checkpointing,
        "offload": registry.get(chosen["strategy"]).offloads,
        "command": command(args, chosen) if args.num_nodes == 1 else None,
        "machines": [machine_command(args, chosen, m) for m in range(args.num_nodes)] if args.num_nodes > 1 else None,
        "slurm": slurm_command(args, chosen) if args.num_nodes > 1 else None,
        "why": chosen["why"],
        "candidates": [
            {
                "strategy": c["strategy"],
                "fits": c["fits"],
                "micro_batch_size": c["way"].micro_batch_size,
                "activation_checkpointing": c["way"].activation_checkpointing,
                "per_device_bytes": c["per_device_bytes"]["total"],
                "predicted_tokens_per_s": c["predicted_tokens_per_s"],
            }
            for c in chosen["candidates"]
        ],
    }


def launch_main(args: PlanRequest) -> int:
    """`--launch`: print the command and why (or JSON); with `--execute`, run it and return its exit status."""
    chosen = choose_launch(args)
    print(json.dumps(launch_json(args, chosen), indent=2) if args.json else launch_text(args, chosen), flush=True)
    if not args.execute:
        return 0
    return subprocess.run(command(args, chosen), check=False).returncode


# ---------------------------------------------------------------------------------------------------
# train.py --strategy auto: the same choice, on the device the run has


@dataclass(frozen=True)
class Device:
    """What the launch check needs of the device a run starts on."""

    name: str  # torch.cuda.get_device_name()
    memory_gib: float  # torch.cuda.get_device_properties().total_memory, in GiB
    count: int  # processes of the launch (its world size)


def cuda_device(world_size: int) -> Device | None:
    """This process's GPU, or None on a machine without one (a CPU run has no memory wall to check)."""
    import torch  # here: the planner side stays torch-free

    if not torch.cuda.is_available():
        return None
    return Device(torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).total_memory / GIB, world_size)


def startup_note(cfg: TrainConfig, launched: str, precision: str, device: Device, mfu: float) -> str | None:
    """One line when the plan, on `device`, would launch another strategy than `launched`; None when it agrees
    or the run's model is not its preset's (another --model_preset or --n_layer: the plan knows presets)."""

    if cfg.model.n_layer is not None or cfg.model.model_preset != preset_overrides(cfg.preset).get(
        "model_preset", cfg.model.model_preset
    ):
        return None
    gpu = next((g.key for g in PLANNER_GPUS.values() if g.device_name.casefold() == device.name.casefold()), None)
    args = PlanRequest(
        preset=cfg.preset,
        gpu=gpu,
        gpu_memory_gib=device.memory_gib,
        num_gpus=device.count,
        precision=precision,
        micro_batch_size=cfg.optim.micro_batch_size,
        block_size=cfg.data.block_size,
        global_batch_tokens=cfg.optim.global_batch_tokens,
        attn_impl=cfg.model.attn_impl,
        mfu=mfu,
    )
    try:
        chosen = choose_launch(args)
    except PlanError as exc:
        return f"plan: {exc}"
    if chosen["strategy"] == launched:
        return None
    return (
        f"plan: launched {launched}, but on {device.count} x {device.name} the plan picks {chosen['strategy']}: "
        f"{shlex.join(command(args, chosen))}  ({chosen['why']})"
    )
