"""The plan itself: the hardware, the workload of a strategy, its memory, fit and speed, the recommendation, and
finished runs put beside their plan. The command line over it is planner/cli.py (`python -m planner`)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from model.config import GPT2Config
from model.shapes import total_parameters
from planner.cost_model import (
    Link,
    StepTime,
    Workload,
    activations,
    max_micro_batch_size,
    model_state,
    sharded_span,
    step_memory,
    step_time,
)
from planner.errors import PlanError, error_pct
from planner.gpus import PLANNER_GPUS, planner_gpu
from planner.request import DEFAULT_MFU, OVERLAP_MEANING, PlanRequest
from training.config import ModelChoice, preset_overrides
from training.distributed import registry
from training.geometry import BatchError, batch_defaults, divide, micro_step_tokens
from training.records.gpu_peaks import datasheet_entry
from training.records.steady_mean import steady_mean

GIB = 2**30
# A step "fits" when its predicted peak of allocated bytes, grown by the caching allocator's slack (it
# reserves more than is allocated, and fragments: 5-15% in PyTorch's own measurements), plus what CUDA itself
# takes outside any tensor (the context, cuBLAS/cuDNN workspaces, NCCL's buffers: about half a GiB), is
# within the memory CUDA reports (torch.cuda.get_device_properties().total_memory; planner/gpus.py).
ALLOCATOR_SLACK = 1.10
CUDA_RESERVE_GIB = 0.5

# The planner's uncertainty, from the assumptions it makes (docs/design/planning_model.md, "How sure the speed is"):
MFU_SPREAD = 0.25  # the MFU, relative: 0.30 stands for 0.225-0.375, the 25-40% eager PyTorch reaches
LINK_SPREAD_ASSUMED = 0.30  # a link from the GPU table: T4 pairs measure 5-8 GB/s against the 6 assumed
LINK_SPREAD_MEASURED = 0.15  # a link given or measured: run-to-run and message-size differences remain
# What the time model leaves out (kernel launches, the wrappers' hooks, the optimizer step on a GPU, gradient
# clipping), different for every strategy, so not shared between two predictions.
MODEL_SPREAD = 0.05


@dataclass(frozen=True)
class Hardware:
    name: str
    memory_gib: float
    peak_flops: float  # per device, at the plan's precision
    link: Link
    link_name: str
    link_spread: float = LINK_SPREAD_ASSUMED
    memory_source: str = "given (--gpu_memory_gib)"
    reserve_gib: float = CUDA_RESERVE_GIB  # 0 for CPU processes (planner/launch.py): no CUDA context

    @property
    def budget_bytes(self) -> float:
        """The predicted peak that still fits: memory less CUDA's own, divided by the allocator's slack."""
        return (self.memory_gib - self.reserve_gib) * GIB / ALLOCATOR_SLACK


def hardware(
    gpu: str | None,
    precision: str,
    memory_gib: float | None,
    link_gb_s: float | None,
    link_source: str = "given",
    inter_node_gb_s: float | None = None,
) -> Hardware:
    """`link_source` names where a `link_gb_s` came from ("given", or "measured by RUN_DIR")."""
    found = _hardware(gpu, precision, memory_gib, link_gb_s, link_source)
    if inter_node_gb_s is None:
        return found
    return replace(found, link=replace(found.link, inter_node_gb_s=inter_node_gb_s))


def _hardware(
    gpu: str | None, precision: str, memory_gib: float | None, link_gb_s: float | None, link_source: str
) -> Hardware:
    if gpu is None and memory_gib is None:
        raise PlanError("give --gpu (one of " + ", ".join(PLANNER_GPUS) + ") or --gpu_memory_gib")
    spread = LINK_SPREAD_ASSUMED if link_gb_s is None else LINK_SPREAD_MEASURED
    if gpu is None:
        return Hardware(
            "custom GPU",
            float(memory_gib),
            float("nan"),
            Link(link_gb_s or 6.0),
            "assumed" if link_gb_s is None else link_source,
            spread,
        )
    try:
        spec = planner_gpu(gpu)
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    entry = datasheet_entry(spec.device_name)
    peak = entry[2][precision] * 1e12 if entry and precision in entry[2] else float("nan")
    return Hardware(
        spec.key,
        memory_gib or spec.memory_gib,
        peak,
        Link(link_gb_s or spec.link_gb_s),
        spec.link if link_gb_s is None else f"{link_gb_s:.3g} GB/s {link_source}",
        spread,
        "given (--gpu_memory_gib)" if memory_gib else spec.memory_source,
    )


def measured_link(config: dict[str, Any], run_dir: Path) -> Link:
    """The link a multi-process run measured at start (config.json's launch "link", recorded by runs from before
    the machine profile held it), as the alpha-beta model takes it (`link_from_record`)."""
    launch = config.get("launch") or {}
    link = launch.get("link") if isinstance(launch, dict) else None
    link = link if isinstance(link, dict) else {}
    if not _positive(link.get("bus_gb_s")):
        raise PlanError(
            f"{run_dir} recorded no measured link (runs measure none now): use --link_gb_s, or the link "
            "python -m planner measure keeps in this machine's profile"
        )
    effective = launch.get("effective") if isinstance(launch, dict) else None
    machines = (effective if isinstance(effective, dict) else {}).get("num_machines")
    return link_from_record(link, machines if _positive(machines) else 1)


def link_from_record(link: dict[str, Any], num_machines: int = 1) -> Link:
    """A measured link record (planner/link.py's fields) as the alpha-beta model takes it: the latency of a
    one-element all-reduce, and the bus bandwidth of the bucket-sized all-reduce net of that latency (its time
    less one call's), with a sharding measurement's own collectives (`sharded_link`). A record without the
    latency: bandwidth only."""
    figure, latency, seconds = (link.get(k) for k in ("bus_gb_s", "latency_s", "seconds_per_all_reduce"))
    if not (_positive(latency) and _positive(seconds) and latency < seconds):
        return Link(float(figure))
    return Link(
        float(figure) * seconds / (seconds - latency),
        latency_s=float(latency),
        **sharded_link(link, num_machines),
    )


def sharded_link(link: dict[str, Any], num_machines: int = 1) -> dict[str, Any]:
    """The FSDP collectives' own alpha-beta from a sharding run's link record (planner/link.py
    `sharded_calls`), as Link's fields: each kind's bus bandwidth, (N-1)/N x the message over its time net of
    its one-element call, FSDP2's per-unit calls as their latencies, and the processes and machines the
    collectives spanned (`num_machines`, the run's: all of them, or one under hybrid sharding). A figure
    absent, not positive or not finite (a DDP run, a run from before, a measurement that noise spoiled) leaves
    that field to the all-reduce's; so does a bandwidth whose one-element call took half the message's time or
    more, where the difference of the two is mostly noise and its quotient could be any figure."""
    world, nbytes = link.get("shard_group_size") or link.get("world_size"), link.get("message_bytes")
    fields: dict[str, Any] = {}
    for kind, prefix in (("all_gather", "gather"), ("reduce_scatter", "scatter")):
        seconds, one = link.get(f"seconds_per_{kind}"), link.get(f"{kind}_latency_s")
        if all(_positive(v) for v in (world, nbytes, seconds, one)) and one < seconds / 2 and world > 1:
            fields[f"{prefix}_gb_s"] = (world - 1) / world * nbytes / (seconds - one) / 1e9
    for key, field in (
        ("fsdp_all_gather_call_s", "gather_latency_s"),
        ("fsdp_kept_all_gather_call_s", "kept_gather_latency_s"),
        ("fsdp_reduce_scatter_call_s", "scatter_latency_s"),
    ):
        if _positive(link.get(key)):
            fields[field] = float(link[key])
    if "gather_gb_s" in fields or "scatter_gb_s" in fields:
        whole = world == link.get("world_size")  # else hybrid sharding's group: one machine's processes
        fields["sharded_span"] = (int(world), int(num_machines) if whole else 1)
    return fields


def _positive(value: Any) -> bool:
    """A measured figure: a finite number above zero (JSON's null, a bool, a negative or an infinity is not)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def workload_for(args: PlanRequest, strategy: str) -> Workload:
    """The preset's workload for `strategy`: the same global batch on every strategy, accumulation making up the rest."""
    values = preset_overrides(args.preset)
    defaults = batch_defaults(values)  # the preset's, else what train.py's config dataclasses default to
    model_preset = values.get("model_preset", ModelChoice.model_preset)
    cfg = GPT2Config.from_preset(model_preset, attn_impl=args.attn_impl)
    block = args.block_size or defaults.block_size
    micro = args.micro_batch_size or defaults.micro_batch_size
    multi_process = registry.get(strategy).multi_process
    # --num_gpus counts the GPUs of one machine; the multi-process strategies run on those of every machine.
    world = args.num_gpus * args.num_nodes if multi_process else 1
    # Unless told, the global batch is one micro-batch on each GPU: the one-process strategies accumulate.
    global_tokens = (
        args.global_batch_tokens
        or defaults.global_batch_tokens
        or micro_step_tokens(micro, block, args.num_gpus * args.num_nodes)
    )
    try:
        geometry = divide(global_tokens, micro, block, world, processes=f"devices of {strategy}")
    except BatchError as exc:
        raise PlanError(str(exc)) from None
    try:
        # The preset's activation checkpointing (gpt2-xl needs it on 2x T4) unless the flag says otherwise.
        checkpointing = (
            bool(values.get("activation_checkpointing", False))
            if args.activation_checkpointing is None
            else args.activation_checkpointing
        )
        return Workload(
            cfg,
            micro,
            block,
            args.precision,
            world,
            geometry.grad_accum_steps,
            checkpointing,
            fused_adamw=True,
            device="cuda",
            num_nodes=args.num_nodes if multi_process else 1,
        )
    except ValueError as exc:
        raise PlanError(str(exc)) from None


def plan_strategy(w: Workload, strategy: str, hw: Hardware, mfu: float, overlap: str) -> dict[str, Any]:
    memory = step_memory(w, strategy)
    largest = max_micro_batch_size(w, strategy, hw.budget_bytes)
    time = step_time(w, strategy, hw.peak_flops, mfu, hw.link)
    tokens = w.micro_batch_size * w.block_size * w.grad_accum_steps * w.world_size
    step_s = _step_s(time, overlap)
    corners = speed_corners(w, strategy, hw, mfu, overlap)
    return {
        "strategy": strategy,
        "activations_per_block": activations_per_block(w, strategy),
        "world_size": w.world_size,
        "grad_accum_steps": w.grad_accum_steps,
        "per_device_bytes": memory.to_dict(),
        "fits": memory.total <= hw.budget_bytes,
        "max_micro_batch_size": largest,
        "predicted_step_s": step_s,
        "predicted_tokens_per_s": tokens / step_s if step_s > 0 else None,
        "predicted_tokens_per_s_no_overlap": tokens / time.step_s_no_overlap if time.step_s_no_overlap > 0 else None,
        "predicted_tokens_per_s_full_overlap": tokens / time.step_s if time.step_s > 0 else None,
        "predicted_tokens_per_s_range": speed_range(corners),
        "predicted_tokens_per_s_corners": corners,
        "compute_s": time.compute_s,
        "communication_s": time.communication_s,
        "communication_bytes_per_device": time.communication_bytes,
    }


def _step_s(time: StepTime, overlap: str) -> float:
    return time.step_s if overlap == "full" else time.step_s_without_prefetch


def speed_corners(w: Workload, strategy: str, hw: Hardware, mfu: float, overlap: str) -> list[float]:
    """Tokens/s at the four corners of the shared assumptions: MFU and link each at their low and high end.

    The corners are shared: every strategy runs on the same GPUs over the same link, so a low MFU slows
    them all at once; what decides a winner is whether it stays ahead at every corner."""
    tokens = w.micro_batch_size * w.block_size * w.grad_accum_steps * w.world_size
    corners = []
    for mfu_factor in (1 - MFU_SPREAD, 1 + MFU_SPREAD):
        for link_factor in (1 - hw.link_spread, 1 + hw.link_spread):
            link = hw.link.scaled(link_factor)
            step_s = _step_s(step_time(w, strategy, hw.peak_flops, min(1.0, mfu * mfu_factor), link), overlap)
            corners.append(tokens / step_s if step_s > 0 else None)
    return corners


def speed_range(corners: list[float | None]) -> list[float] | None:
    """[low, high] tokens/s: the slowest and fastest corner, widened by the model's own spread."""
    if any(c is None for c in corners):
        return None
    return [min(corners) * (1 - MODEL_SPREAD), max(corners) * (1 + MODEL_SPREAD)]


def activations_per_block(w: Workload, strategy: str) -> dict[str, int]:
    """What one block keeps for its backward: with either attention, and with activation checkpointing
    (its input only; the rest is recomputed, one block at a time, during backward)."""
    by_attention = {
        impl: activations(
            Workload(**{**w.__dict__, "model": replace(w.model, attn_impl=impl), "activation_checkpointing": False}),
            strategy,
        ).per_block
        for impl in ("sdpa", "math")
    }
    kept = activations(Workload(**{**w.__dict__, "activation_checkpointing": True}), strategy).blocks
    return {**by_attention, "checkpointed": kept // w.model.n_layer}


def recommend(plans: list[dict[str, Any]], hw: Hardware, micro: int) -> dict[str, Any]:
    fitting = [p for p in plans if p["fits"]]
    if fitting:
        speed = [p for p in fitting if p["predicted_tokens_per_s"] is not None]
        if not speed:  # no peak FLOP/s for this GPU: the least memory wins
            best = min(fitting, key=lambda p: p["per_device_bytes"]["total"])
            return {
                "strategy": best["strategy"],
                "clear": True,
                "contenders": [best["strategy"]],
                "reason": f"fits with the least memory ({_gib(best['per_device_bytes']['total'])} GiB); "
                "no speed prediction without the GPU's peak",
            }
        return _fastest(speed, hw)
    roomiest = max(plans, key=lambda p: p["max_micro_batch_size"])
    if roomiest["max_micro_batch_size"] > 0:
        return {
            "strategy": roomiest["strategy"],
            "clear": True,
            "contenders": [roomiest["strategy"]],
            "reason": (
                f"nothing fits micro-batch {micro}; {roomiest['strategy']} fits up to "
                f"{roomiest['max_micro_batch_size']}: pass --micro_batch_size {roomiest['max_micro_batch_size']} "
                "(accumulation keeps the global batch)"
            ),
        }
    return {
        "strategy": "none",
        "clear": True,
        "contenders": [],
        "reason": "nothing fits even micro-batch 1: add "
        "--activation_checkpointing, a shorter --block_size, or GPUs with more memory",
    }


def _ahead_everywhere(best: dict[str, Any], other: dict[str, Any]) -> bool:
    """`best` is faster than `other` at every corner of the shared assumptions by more than the model's
    own spread, which is not shared (each prediction may be off by it, in either direction)."""
    return all(
        b * (1 - MODEL_SPREAD) > o * (1 + MODEL_SPREAD)
        for b, o in zip(best["predicted_tokens_per_s_corners"], other["predicted_tokens_per_s_corners"])
    )


@dataclass(frozen=True)
class Timed:
    """One strategy of a comparison: tokens it trains per step, its predicted and its measured step, seconds."""

    name: str
    tokens: int
    predicted_s: float
    measured_s: float


def misordered(group: list[Timed], spread: float = MODEL_SPREAD) -> list[tuple[str, str]]:
    """Pairs (measured faster, measured slower) of strategies run on the same hardware and workload whose
    measured tokens/s differ by more than the planner's uncertainty between two strategies (each may be off
    by `spread`, not shared: the rule `_ahead_everywhere` holds a winner to), yet whose predicted tokens/s
    put them the other way round (or level). Empty when the prediction orders every clear pair rightly, so
    the recommendation, the fastest predicted, is never beaten beyond the uncertainty."""
    wrong = []
    for a in group:
        for b in group:
            measured_a, measured_b = a.tokens / a.measured_s, b.tokens / b.measured_s
            if measured_a * (1 - spread) > measured_b * (1 + spread) and a.tokens / a.predicted_s <= (
                b.tokens / b.predicted_s
            ):
                wrong.append((a.name, b.name))
    return wrong


def _fastest(speed: list[dict[str, Any]], hw: Hardware) -> dict[str, Any]:
    """The fastest when it is ahead beyond the uncertainty; otherwise "no clear winner", and of the
    strategies it cannot tell apart, the one that leaves the most memory free."""
    best = max(speed, key=lambda p: (round(p["predicted_tokens_per_s"]), -p["per_device_bytes"]["total"]))
    contenders = [best] + sorted(
        (p for p in speed if p is not best and not _ahead_everywhere(best, p)),
        key=lambda p: -p["predicted_tokens_per_s"],
    )
    others = sorted((p for p in speed if p is not best), key=lambda p: -p["predicted_tokens_per_s"])
    if len(contenders) == 1:
        runner_up = (
            f", ahead of {others[0]['strategy']} ({others[0]['predicted_tokens_per_s']:,.0f}) beyond the uncertainty"
            if others
            else ""
        )
        return {
            "strategy": best["strategy"],
            "clear": True,
            "contenders": [best["strategy"]],
            "reason": (
                f"fits ({_gib(best['per_device_bytes']['total'])} of {hw.memory_gib:.4g} GiB) and is predicted fastest: "
                f"{best['predicted_tokens_per_s']:,.0f} tokens/s{runner_up}"
            ),
        }
    roomiest = min(contenders, key=lambda p: p["per_device_bytes"]["total"])
    named = ", ".join(f"{p['strategy']} ({p['predicted_tokens_per_s']:,.0f})" for p in contenders)
    return {
        "strategy": roomiest["strategy"],
        "clear": False,
        "contenders": [p["strategy"] for p in contenders],
        "reason": (
            f"no clear winner: {named} tokens/s are closer than the planner's uncertainty; of them "
            f"{roomiest['strategy']} needs the least memory ({_gib(roomiest['per_device_bytes']['total'])} "
            f"of {hw.memory_gib:.4g} GiB). Measure: python -m analysis.experiment --repeats 3"
        ),
    }


PER_CALL_FIELDS = ("gather_latency_s", "kept_gather_latency_s", "scatter_latency_s")  # Link's FSDP2 unit calls


def _sharded_span_facts(args: PlanRequest, link: Link, strategies: list[str], left_out: list[str]) -> dict[str, Any]:
    """Where a run's measured FSDP figures priced the plan: the processes and machines its all-gathers and
    reduce-scatters spanned, the planned strategies whose shard group spans otherwise (priced at the
    all-reduce's bandwidth instead), and the per-call figures not carried (a CPU run's)."""
    facts: dict[str, Any] = {"fsdp_calls_left_out": left_out} if left_out else {}
    if link.sharded_span is None:
        return facts
    other = []
    for name in strategies:
        s = registry.get(name)
        if s.fsdp is not None and sharded_span(workload_for(args, name), s) != link.sharded_span:
            other.append(name)
    return {**facts, "sharded_span": list(link.sharded_span), "sharded_bandwidth_not_used_by": other}


def planned_strategies(num_gpus: int, num_nodes: int = 1) -> list[str]:
    """Every strategy on several GPUs; on one, those that run one process (the others would only add a
    wrapper around the same work). Those made for several machines (hybrid sharding) only on several."""
    return [
        s.name
        for s in registry.STRATEGIES
        if (num_gpus * num_nodes > 1 or not s.multi_process) and (num_nodes > 1 or not s.multi_machine)
    ]


def _hardware_for(args: PlanRequest) -> tuple[Hardware, list[str]]:
    """The plan's GPU and link: measured by a run (--link_from), else the datasheet's or --link_gb_s; and the
    run's measured figures not carried into the plan (Link field names)."""
    left_out: list[str] = []
    if args.link_from is not None:
        record = _link_record_from(args.link_from)
        measured = link_from_record(record, _record_machines(record))
        hw = hardware(
            args.gpu,
            args.precision,
            args.gpu_memory_gib,
            measured.gb_s,
            f"measured by {args.link_from}",
            args.inter_node_gb_s,
        )
        sharded = {k: getattr(measured, k) for k in ("gather_gb_s", "scatter_gb_s", "sharded_span")}
        # FSDP2's per-unit calls are mostly host time in its hooks: a gloo (CPU) run's milliseconds would say
        # nothing of a GPU's, so only a GPU run's are carried into this (GPU) plan.
        cpu_run = record.get("backend") == "gloo"
        for key in PER_CALL_FIELDS:
            if not cpu_run:
                sharded[key] = getattr(measured, key)
            elif getattr(measured, key) is not None:
                left_out.append(key)
        hw = replace(hw, link=replace(hw.link, latency_s=measured.latency_s, **sharded))
    else:
        hw = hardware(
            args.gpu, args.precision, args.gpu_memory_gib, args.link_gb_s, inter_node_gb_s=args.inter_node_gb_s
        )
    return hw, left_out


def _link_record_from(source: Path) -> dict[str, Any]:
    """--link_from: a machine profile's link (a file, `python -m planner measure`) or the one a run recorded at
    start (a run folder from before the profile held it)."""
    if source.name == "config.json":  # the run's file named rather than its folder
        source = source.parent
    if source.is_file():
        from planner.profile import read_profile

        profile = read_profile(source)
        if not profile.links:
            raise PlanError(
                f"{source}: the profile measured one process, no link: python -m planner measure --processes 2"
            )
        return profile.links[max(profile.links, key=int)]  # between the most processes it measured
    config = read_json(source / "config.json")
    measured_link(config, source)  # refuses a run that recorded none, in one line
    link = dict(config["launch"]["link"])
    effective = config["launch"].get("effective") or {}
    return {**link, "_machines": effective.get("num_machines")}


def _record_machines(record: dict[str, Any]) -> int:
    machines = record.get("_machines")
    return int(machines) if _positive(machines) else 1


def plan(args: PlanRequest) -> dict[str, Any]:
    hw, left_out = _hardware_for(args)
    if args.host_update_gb_s is not None:
        hw = replace(hw, link=replace(hw.link, host_update_gb_s=args.host_update_gb_s))
    strategies = planned_strategies(args.num_gpus, args.num_nodes)
    plans = [plan_strategy(workload_for(args, s), s, hw, args.assumed_mfu, args.overlap) for s in strategies]
    first = workload_for(args, strategies[0])
    return {
        "workload": {
            "preset": args.preset,
            "model": first.model.to_dict(),
            "micro_batch_size": first.micro_batch_size,
            "block_size": first.block_size,
            "precision": args.precision,
            "num_gpus": args.num_gpus,
            "global_batch_tokens": first.micro_batch_size * first.block_size * first.grad_accum_steps,
            "activation_checkpointing": first.activation_checkpointing,
            "mfu_assumed": args.assumed_mfu,
            "overlap": args.overlap,
            "parameters": total_parameters(first.model),
            **({"num_nodes": args.num_nodes} if args.num_nodes > 1 else {}),
        },
        "gpu": {
            "name": hw.name,
            "memory_gib": hw.memory_gib,
            "memory_source": hw.memory_source,
            "peak_flops": hw.peak_flops,
            "link": hw.link_name,
            "link_gb_s": hw.link.gb_s,
            "link_latency_s": hw.link.latency_s,
            "host_update_gb_s": hw.link.host_update_gb_s,
            "budget_bytes": hw.budget_bytes,
            **({"inter_node_gb_s": hw.link.inter_node_gb_s} if hw.link.inter_node_gb_s is not None else {}),
            **{
                key: getattr(hw.link, key)
                for key in ("gather_gb_s", "scatter_gb_s", *PER_CALL_FIELDS)
                if getattr(hw.link, key) is not None
            },
            **_sharded_span_facts(args, hw.link, strategies, left_out),
            "fit_margin": {"allocator_slack": ALLOCATOR_SLACK, "cuda_reserve_gib": CUDA_RESERVE_GIB},
        },
        "uncertainty": {"mfu_relative": MFU_SPREAD, "link_relative": hw.link_spread, "model_relative": MODEL_SPREAD},
        "strategies": plans,
        "recommendation": recommend(plans, hw, first.micro_batch_size),
    }


# ---------------------------------------------------------------------------------------------------
# Finished runs beside their plan


def run_workload(config: dict[str, Any], summary: dict[str, Any]) -> tuple[Workload, str, bool]:
    """(the run's workload, its strategy, whether its device is the CPU) from config.json and summary.json."""
    launch = config["launch"]
    levers = launch.get("levers", {})
    memory = summary.get("memory") or {}
    model = GPT2Config.from_dict(launch["model_config"])
    on_cpu = summary.get("device_type") == "cpu"
    w = Workload(
        model,
        summary["micro_batch_size"],
        summary["block_size"],
        summary["precision"],
        summary["world_size"],
        summary["grad_accum_steps"],
        levers.get("activation_checkpointing", "off") != "off",
        bool(levers.get("fused_adamw")),
        first_step=memory.get("probe_step") == 1,
        device="cpu" if on_cpu else "cuda",
        # Hybrid sharding's replicas are its machines; the live mesh recorded says how many.
        num_nodes=summary.get("dp_replicate_size") or 1,
    )
    return w, summary["strategy"], on_cpu


def compare_run(
    run_dir: Path, mfu: float | None = None, host_update_gb_s: float | None = None, profile: Path | None = None
) -> dict[str, Any]:
    """A finished run beside its plan: memory per rank, and the step time at the MFU and AdamW rate this
    machine's profile measured for the run's preset and process layout (planner/profile.py; `profile` names
    one, else this machine's), over the link the run or the profile measured. `mfu` and `host_update_gb_s`
    replace the profile's figures; with no profile, the planner's assumptions stand in, and the entry says so."""
    config = read_json(run_dir / "config.json")
    summary = read_json(run_dir / "summary.json")
    try:
        w, strategy, on_cpu = run_workload(config, summary)
    except (KeyError, TypeError, ValueError) as exc:
        raise PlanError(f"{run_dir}: not a run this planner can read ({type(exc).__name__}: {exc})") from None
    if registry.find(strategy) is None:
        raise PlanError(f"{run_dir}: strategy {strategy!r} has no plan")
    memory = summary.get("memory") or {}
    entry: dict[str, Any] = {
        "run": str(run_dir),
        "strategy": strategy,
        "world_size": w.world_size,
        "device": summary.get("device_name"),
        "probe_step": memory.get("probe_step"),
        "ranks": [_rank_entry(w, strategy, rank, memory, on_cpu) for rank in range(w.world_size)],
    }
    entry["predicted"], entry["measured"], entry["error_pct"] = (
        entry["ranks"][0][k] for k in ("predicted", "measured", "error_pct")
    )
    basis = _speed_basis(run_dir, config, summary, w.world_size, (mfu, host_update_gb_s), profile)
    entry["step_time"] = _compare_step_time(w, strategy, config, summary, run_dir, basis)
    entry["notes"] = _run_notes(config, summary, on_cpu)
    return entry


def _rank_entry(w: Workload, strategy: str, rank: int, memory: dict[str, Any], on_cpu: bool) -> dict[str, Any]:
    states = memory.get("model_state_bytes") or []
    peaks = memory.get("step_peak_bytes") or []
    predicted_state = model_state(w, strategy, rank)
    predicted_peak = step_memory(w, strategy, rank, host_is_device=on_cpu)
    measured = {
        **(states[rank] if rank < len(states) and states[rank] else {}),
        **({"step_peak": peaks[rank]} if rank < len(peaks) and peaks[rank] is not None else {}),
    }
    predicted = {
        "parameters": predicted_state.parameters,
        "gradients": predicted_state.gradients,
        "optimizer": predicted_state.optimizer,
        "step_peak": predicted_peak.total,
    }
    return {
        "rank": rank,
        "predicted": predicted,
        "measured": measured,
        "peak_phase": predicted_peak.peak_phase,
        "predicted_peak": predicted_peak.to_dict(),  # the step peak by kind, at its phase
        "error_pct": {k: error_pct(predicted[k], measured[k]) for k in predicted if measured.get(k)},
    }


# The link record's all-reduce fields: all a strategy that does not shard is priced with.
LINK_RECORD_ALL_REDUCE = frozenset(
    {"backend", "world_size", "message_bytes", "dtype", "iterations", "seconds_per_all_reduce", "algorithm_gb_s"}
    | {"bus_gb_s", "latency_s"}
)


@dataclass(frozen=True)
class SpeedBasis:
    """What a run's predicted step rests on: the MFU, the AdamW rate, the peak and link, and where each came from."""

    mfu: float
    host_update_gb_s: float | None  # None: the planner's assumed rate
    peak_flops: float | None  # None: the run's own recorded peak
    profile_link: dict[str, Any] | None
    source: str  # one line: the profile and its age, or why the planner's assumptions stand in


def _speed_basis(
    run_dir: Path,
    config: dict[str, Any],
    summary: dict[str, Any],
    world_size: int,
    given: tuple[float | None, float | None],
    profile_path: Path | None,
) -> SpeedBasis:
    """What the run's step is predicted from: the profile's rate for its layout (its MFU with the peak it was
    measured against), the figures given in its place (`given`: --mfu, --host_update_gb_s), or the planner's
    assumptions without a profile, and one line that says which."""
    from planner.profile import age_note, default_profile_path, read_profile

    mfu, host_update_gb_s = given
    path = profile_path or default_profile_path(_profile_device(summary))
    try:
        profile = read_profile(path)
    except PlanError as exc:
        if profile_path is not None:  # asked for by name: a missing or broken one is an error, not a fallback
            raise
        why = f"{exc}; MFU {DEFAULT_MFU:g} assumed" if mfu is None else str(exc)
        return SpeedBasis(mfu or DEFAULT_MFU, host_update_gb_s, None, None, why)
    preset, threads, precision = summary.get("preset"), summary.get("threads_per_process"), summary.get("precision")
    rate = profile.compute_for(preset, world_size, threads, precision)
    started = datetime.fromtimestamp((run_dir / "config.json").stat().st_mtime, UTC).isoformat()
    notes = [f"machine profile {path}, {age_note(profile, started)}", *_profile_mismatches(profile, config, summary)]
    if rate is None:
        notes.append(
            f"it has no {precision} compute rate for {preset} on {world_size} process(es) of {threads} thread(s) "
            f"(python -m planner measure --presets {preset} --processes {world_size}): MFU {mfu or DEFAULT_MFU:g} "
            f"{'given' if mfu else 'assumed'}"
        )
    elif (rate.micro_batch_size, rate.block_size) != (summary.get("micro_batch_size"), summary.get("block_size")):
        notes.append(
            f"its rate was measured at micro-batches of {rate.micro_batch_size} x {rate.block_size} tokens, the run's "
            f"are {summary.get('micro_batch_size')} x {summary.get('block_size')}"
        )
    return SpeedBasis(
        mfu or (rate.mfu if rate else DEFAULT_MFU),
        host_update_gb_s or (rate.adamw_gb_s if rate else None),
        rate.peak_flops if rate and not mfu else None,  # a measured MFU is of the peak it was measured against
        profile.link_for(world_size),
        "; ".join(notes),
    )


def _profile_mismatches(profile: Any, config: dict[str, Any], summary: dict[str, Any]) -> list[str]:
    """A profile measured on another CPU than the run's (runs record theirs since the profile exists)."""
    ran_on = (config.get("launch") or {}).get("cpu_model")
    measured_on = profile.machine.get("cpu_model")
    if summary.get("device_type") == "cpu" and ran_on and measured_on and ran_on != measured_on:
        return [f"measured on {measured_on}, the run ran on {ran_on}"]
    return []


def _profile_device(summary: dict[str, Any]) -> str:
    name = summary.get("device_name")
    return "cpu" if summary.get("device_type") == "cpu" or not name else str(name)


def _run_link(w: Workload, strategy: str, config: dict[str, Any], run_dir: Path, basis: SpeedBasis) -> Link:
    """The run's link: none for one process; the one the run recorded (runs from before the profile); else the
    profile's, measured between as many processes."""
    if w.world_size == 1:
        return Link(1.0)  # one process: no link used
    launch = config.get("launch") or {}
    if isinstance(launch.get("link"), dict):
        return measured_link(config, run_dir)
    link = basis.profile_link
    if link is None or not _positive(link.get("bus_gb_s")):
        raise PlanError(
            f"{run_dir} recorded no link and no machine profile holds one between {w.world_size} processes: "
            f"python -m planner measure --processes {w.world_size}, or --link_gb_s"
        )
    if not registry.get(strategy).shards:  # a profile measured FSDP's collectives too, which DDP does not run
        link = {k: v for k, v in link.items() if k in LINK_RECORD_ALL_REDUCE}
    return link_from_record(link)  # measured between as many processes: the profile keeps one link per count


def _link_record(config: dict[str, Any], basis: SpeedBasis) -> dict[str, Any]:
    """The link record a prediction used: the run's own (runs from before the profile), else the profile's."""
    recorded = (config.get("launch") or {}).get("link")
    return recorded if isinstance(recorded, dict) else (basis.profile_link or {})


def _compare_step_time(
    w: Workload, strategy: str, config: dict[str, Any], summary: dict[str, Any], run_dir: Path, basis: SpeedBasis
) -> dict[str, Any]:
    """The predicted step (and its range over the shared assumptions) beside the run's steady-state mean step."""
    warmup = (config.get("run") or {}).get("perf_warmup_steps") or 0
    times = summary.get("step_times_s") or []
    measured = steady_mean(enumerate(times, start=1), warmup)
    recorded = summary.get("peak_flops_per_device")
    peak = basis.peak_flops or (recorded if _positive(recorded) else None)
    result: dict[str, Any] = {
        "measured_s": measured.value if measured.steps else None,
        "measured_steps": measured.steps,
        "warmup_steps_left_out": warmup,
        "mfu_given": basis.mfu,
        "peak_flops": peak,
        "basis": basis.source,
    }
    try:
        link = _run_link(w, strategy, config, run_dir, basis)
    except PlanError as exc:
        return {**result, "predicted_s": None, "range_s": None, "error_pct": None, "why_not": str(exc)}
    if not _positive(peak):
        why = "no peak FLOP/s recorded (python -m planner measure measures this CPU's)"
        return {**result, "predicted_s": None, "range_s": None, "error_pct": None, "why_not": why}
    if basis.host_update_gb_s is not None:
        link = replace(link, host_update_gb_s=basis.host_update_gb_s)
    mfu = basis.mfu
    hw = Hardware("run", float("nan"), float(peak), link, "measured by the run", LINK_SPREAD_MEASURED)
    predicted = step_time(w, strategy, float(peak), mfu, link).step_s
    tokens = w.micro_batch_size * w.block_size * w.grad_accum_steps * w.world_size
    span = speed_range(speed_corners(w, strategy, hw, mfu, "full"))
    return {
        **result,
        "predicted_s": predicted,
        "range_s": None if span is None else [tokens / span[1], tokens / span[0]],
        "error_pct": error_pct(predicted, measured.value) if measured.steps else None,
        "link_gb_s": link.gb_s if w.world_size > 1 else None,
        "latency_s": link.latency_s if w.world_size > 1 else None,
        "latency_measured": _positive(_link_record(config, basis).get("latency_s")) if w.world_size > 1 else None,
        "host_update_gb_s": link.host_update_gb_s,
        # FSDP's own collectives where the run measured them (None: priced as the all-reduce)
        "all_gather_gb_s": link.gather_gb_s,
        "all_gather_call_s": link.gather_latency_s,
        "kept_all_gather_call_s": link.kept_gather_latency_s,
        "reduce_scatter_gb_s": link.scatter_gb_s,
        "reduce_scatter_call_s": link.scatter_latency_s,
    }


def _run_notes(config: dict[str, Any], summary: dict[str, Any], on_cpu: bool) -> list[str]:
    notes = []
    memory = summary.get("memory") or {}
    if not memory.get("step_peak_bytes"):
        notes.append("no step peak measured (no warm-up step to measure it in, or a run from before it was recorded)")
    dropout = config.get("model", {}).get("dropout") or 0
    if dropout:
        notes.append(f"dropout {dropout}: its masks (1 byte per element per dropout) are not in the plan")
    if not on_cpu:
        notes.append("GPU peak: torch.cuda.max_memory_allocated over the first steps")
    return notes


def read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlanError(f"{path} is missing: not a finished run directory") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise PlanError(f"{path}: cannot be read ({exc})") from None
    if not isinstance(value, dict):
        raise PlanError(f"{path}: not a JSON object")
    return value


# ---------------------------------------------------------------------------------------------------
# Text output


def _gib(n: float) -> str:
    return f"{n / GIB:.2f}"


def plan_text(result: dict[str, Any]) -> str:
    w, gpu = result["workload"], result["gpu"]
    lines = [
        f"GPT-2 {w['preset']} ({w['model']['n_layer']} layers, {w['model']['n_embd']} wide), {w['precision']}, "
        f"micro-batch {w['micro_batch_size']} x {w['block_size']} tokens, global batch {w['global_batch_tokens']} "
        f"tokens, on {_machines(w)}{w['num_gpus']} x {gpu['name']} ({gpu['memory_gib']:.4g} GiB, link: {gpu['link']}, "
        f"{gpu['link_gb_s']:.3g} GB/s{_inter_node(gpu)}); speed at MFU {w['mfu_assumed']:g} (assumed), "
        "communication overlap: "
        f"{w['overlap']} ({OVERLAP_MEANING[w['overlap']]})",
        "",
        "GiB per device      params  grads  optim  activ  logits  comm   temp  | peak (at)          fits  "
        "max micro  step s   tokens/s  (range)",
    ]
    for p in result["strategies"]:
        b = p["per_device_bytes"]
        tokens = "n/a" if p["predicted_tokens_per_s"] is None else f"{p['predicted_tokens_per_s']:,.0f}"
        step = "n/a" if p["predicted_tokens_per_s"] is None else f"{p['predicted_step_s']:.3f}"
        host = f"  + {_gib(b['host'])} GiB in host memory" if b["host"] else ""
        span = p["predicted_tokens_per_s_range"]
        tokens += "" if span is None else f"  ({span[0] / 1e3:,.0f}k-{span[1] / 1e3:,.0f}k)"
        lines.append(
            f"{p['strategy']:<18} {_gib(b['parameters']):>7} {_gib(b['gradients']):>6} {_gib(b['optimizer']):>6} "
            f"{_gib(b['activations']):>6} {_gib(b['logits']):>7} {_gib(b['communication']):>5} "
            f"{_gib(b['temporaries']):>6}  | {_gib(b['total']):>6} ({b['peak_phase']:<9}) "
            f"{'yes' if p['fits'] else 'NO':>4}  {p['max_micro_batch_size']:>9}  {step:>6}  {tokens:>9}{host}"
        )
    per_block = result["strategies"][0]["activations_per_block"]
    lines += [
        "",
        f"activations per block ({result['strategies'][0]['strategy']}): "
        f"{per_block['sdpa'] / 2**20:,.0f} MiB with SDPA, {per_block['math'] / 2**20:,.0f} MiB with the explicit "
        f"attention (--attn_impl math), {per_block['checkpointed'] / 2**20:,.0f} MiB with activation "
        "checkpointing (plus one block recomputed at a time in backward)",
    ]
    rec, u = result["recommendation"], result["uncertainty"]
    lines += [
        "",
        f"uncertainty: MFU ±{u['mfu_relative']:.0%} and link ±{u['link_relative']:.0%} (shared by all "
        f"strategies), the time model's omissions ±{u['model_relative']:.0%} per strategy; a winner must be "
        "ahead at every corner (docs/planning.md)",
    ]
    lines += ["", f"recommendation: {rec['strategy']}: {rec['reason']}"]
    return "\n".join(lines + assumptions_text(result))


def _fsdp_calls(gpu: dict[str, Any]) -> str:
    """FSDP's all-gather and reduce-scatter where a sharding run measured them (--link_from), else nothing:
    which figures, over what span they priced which strategies, and which were left out."""
    parts = []
    for kind, key in (("all-gather", "gather"), ("reduce-scatter", "scatter")):
        gb_s, call = gpu.get(f"{key}_gb_s"), gpu.get(f"{key}_latency_s")
        if gb_s is not None or call is not None:
            bandwidth = f"{gb_s:.3g} GB/s" if gb_s is not None else "the all-reduce's bandwidth"
            per_call = f"{call * 1e6:,.0f} us per FSDP2 unit call" if call is not None else "the all-reduce's latency"
            parts.append(f"{kind} {bandwidth} + {per_call}")
    if gpu.get("kept_gather_latency_s") is not None:
        parts.append(f"kept unit's all-gather {gpu['kept_gather_latency_s'] * 1e6:,.0f} us per call")
    notes = []
    if gpu.get("sharded_span") is not None:
        processes, machines = gpu["sharded_span"]
        notes.append(f"bandwidths over {processes} processes on {machines} machine(s)")
        if gpu.get("sharded_bandwidth_not_used_by"):
            others = ", ".join(gpu["sharded_bandwidth_not_used_by"])
            notes.append(f"{others} shard(s) over another span: at the all-reduce's bandwidth instead")
    if gpu.get("fsdp_calls_left_out"):
        notes.append("FSDP2's per-unit call times not carried: measured over gloo on a CPU, not a GPU")
    text = "; ".join(parts + notes)
    return f" (FSDP's {text}, measured)" if text else ""


def _machines(workload: dict[str, Any]) -> str:
    return f"{workload['num_nodes']} machines x " if workload.get("num_nodes", 1) > 1 else ""


def _inter_node(gpu: dict[str, Any]) -> str:
    return f"; between machines {gpu['inter_node_gb_s']:.3g} GB/s" if "inter_node_gb_s" in gpu else ""


def assumptions_text(result: dict[str, Any]) -> list[str]:
    """What the figures above rest on, so that a reader can tell which of them to replace with a measurement."""
    w, gpu = result["workload"], result["gpu"]
    margin = gpu["fit_margin"]
    return [
        "",
        f"assumed: {w['parameters']:,} parameters; MFU {w['mfu_assumed']:g}; link {gpu['link_gb_s']:.3g} GB/s "
        f"({gpu['link']}) + {gpu['link_latency_s'] * 1e6:,.0f} us per collective call{_inter_node(gpu)}"
        f"{_fsdp_calls(gpu)}; "
        f"overlap {w['overlap']}; "
        f"usable memory {gpu['memory_gib']:.2f} GiB per GPU "
        f"({gpu['memory_source']}); offloaded AdamW on one host core at {gpu['host_update_gb_s']:g} GB/s",
        f"fits: peak x {margin['allocator_slack']:.2f} (allocator fragmentation) + {margin['cuda_reserve_gib']:g} "
        "GiB (CUDA context, cuBLAS workspaces, NCCL buffers) within the usable memory; formulas: docs/design/planning_model.md",
    ]


def runs_text(entries: list[dict[str, Any]]) -> str:
    lines = ["run                                   strategy      rank  what          predicted    measured   error"]
    for e in entries:
        name = f"{Path(e['run']).name[:36]:<37} {e['strategy']:<13}"
        for r in e["ranks"]:
            for key in ("parameters", "gradients", "optimizer", "step_peak"):
                measured = r["measured"].get(key)
                error = r["error_pct"].get(key)
                lines.append(
                    f"{name} {r['rank']:>4}  {key:<12} "
                    f"{r['predicted'][key] / 2**20:>9.1f} MiB "
                    f"{'n/a' if measured is None else f'{measured / 2**20:9.1f} MiB':>13} "
                    f"{'' if error is None else f'{error:+.2f}%':>8}"
                )
        row, *notes = _step_time_lines(e["step_time"])
        lines += [f"{name}  all  {row}", *notes]
        lines += [f"  note: {note}" for note in e["notes"]]
    return "\n".join(lines)


def _step_time_lines(t: dict[str, Any]) -> list[str]:
    """The step time row and what its prediction rests on."""
    predicted = "n/a" if t["predicted_s"] is None else f"{t['predicted_s']:.4f} s"
    measured = "n/a" if t["measured_s"] is None else f"{t['measured_s']:.4f} s"
    error = "" if t["error_pct"] is None else f"{t['error_pct']:+.1f}%"
    span = "" if not t.get("range_s") else f"  (range {t['range_s'][0]:.4f}-{t['range_s'][1]:.4f} s)"
    row = f"step_time   {predicted:>13} {measured:>13} {error:>8}{span}"
    if t["predicted_s"] is None:
        return [row, f"  note: no step time predicted: {t['why_not']}"]
    link = (
        ""
        if t.get("link_gb_s") is None
        else f", link {t['link_gb_s']:.3g} GB/s + {t['latency_s'] * 1e6:,.0f} us per call "
        f"({'measured' if t.get('latency_measured') else 'bandwidth measured, latency assumed'})"
    )
    return [
        row,
        f"  note: step time at MFU {t['mfu_given']:.3g} of the peak {t['peak_flops'] / 1e9:,.1f} GFLOP/s{link}, "
        f"AdamW on a host core at {t['host_update_gb_s']:.3g} GB/s; measured: mean of {t['measured_steps']} steps "
        f"after {t['warmup_steps_left_out']} warm-up",
        *([f"  note: {_basis_line(t['basis'])}"] if t.get("basis") else []),
        *_sharded_note(t),
    ]


def _basis_line(basis: str) -> str:
    return f"from the {basis}" if basis.startswith("machine profile") else basis


def _sharded_note(t: dict[str, Any]) -> list[str]:
    """FSDP's own collectives, where the run measured them: each kind's bandwidth and FSDP2's per-unit call."""
    parts = []
    for kind in ("all_gather", "reduce_scatter"):
        gb_s, call = t.get(f"{kind}_gb_s"), t.get(f"{kind}_call_s")
        if gb_s is None and call is None:
            continue
        bandwidth = "the all-reduce's bandwidth" if gb_s is None else f"{gb_s:.3g} GB/s"
        per_call = "the all-reduce's latency" if call is None else f"{call * 1e6:,.0f} us per FSDP2 unit call"
        parts.append(f"{kind.replace('_', '-')} {bandwidth} + {per_call}")
    if t.get("kept_all_gather_call_s") is not None:
        parts.append(f"kept unit's all-gather {t['kept_all_gather_call_s'] * 1e6:,.0f} us per call")
    return [f"  note: FSDP collectives as measured: {'; '.join(parts)}"] if parts else []
