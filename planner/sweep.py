"""The memory wall: every training preset x strategy on one hardware, its per-device peak and whether it fits.

  python -m planner --sweep --gpu T4 --num_gpus 2 [--num_nodes M --inter_node_gb_s Y] [--precision fp16]
                          [--activation_checkpointing]
                          [--figure docs/figures/memory_wall_2xT4.png] [--json]

Each preset is planned as `python -m planner --preset P` plans it (its own micro-batch and global
batch, the planner's figures unchanged); the table lists the peak and fit of each strategy, the figure
draws per-device memory against parameter count (one line per strategy, the GPU's usable memory as a
horizontal line), and the last lines name the largest preset each strategy can train there.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from model.shapes import total_parameters
from planner.errors import PlanError
from planner.launch import GIB, candidate, hardware_for, strategies_for
from planner.plan import plan_strategy, workload_for
from planner.request import PlanRequest
from training.config import PRESETS
from training.distributed import registry


def sweep(args: PlanRequest) -> dict[str, Any]:
    """Per preset (smallest first): its parameters and, per strategy, the predicted peak and fit."""
    hw, strategies = hardware_for(args), strategies_for(args)
    rows = []
    for preset in PRESETS:
        # One workload for every preset, so the lines compare sizes alone: activation checkpointing as the
        # flag says (not each preset's own), the micro-batch the flag's or each preset's.
        shaped = replace(args, preset=preset, activation_checkpointing=bool(args.activation_checkpointing))
        plans = [plan_strategy(workload_for(shaped, s), s, hw, args.assumed_mfu, args.overlap) for s in strategies]
        model = workload_for(shaped, strategies[0]).model
        rows.append(
            {
                "preset": preset,
                "parameters": total_parameters(model),
                "strategies": {
                    p["strategy"]: {
                        "peak_bytes": p["per_device_bytes"]["total"],
                        "fits": p["fits"],
                        "max_micro_batch_size": p["max_micro_batch_size"],
                        "fits_with_levers": _fits_with_levers(shaped, p, hw),
                    }
                    for p in plans
                },
            }
        )
    rows.sort(key=lambda r: r["parameters"])
    largest = {s: next((r["preset"] for r in reversed(rows) if r["strategies"][s]["fits"]), None) for s in strategies}
    with_levers = {
        s: next((r["preset"] for r in reversed(rows) if r["strategies"][s]["fits_with_levers"]), None)
        for s in strategies
    }
    return {
        "largest_with_levers": with_levers,
        "gpu": hw.name,
        "num_gpus": args.num_gpus,
        "num_nodes": args.num_nodes,
        "memory_gib": hw.memory_gib,
        "budget_bytes": hw.budget_bytes,
        "micro_batch_size": args.micro_batch_size,
        "precision": args.precision,
        "activation_checkpointing": bool(args.activation_checkpointing),
        "strategies": strategies,
        "presets": rows,
        "largest_that_fits": largest,
    }


def _fits_with_levers(args: PlanRequest, plan: dict[str, Any], hw: Any) -> bool:
    """Whether some smaller micro-batch or activation checkpointing makes it fit (the launch's ways)."""
    shaped = replace(args, cpu=False, activation_checkpointing=None)
    return plan["fits"] or candidate(shaped, plan["strategy"], hw)["fits"]


def _hardware_name(result: dict[str, Any]) -> str:
    machines = f"{result['num_nodes']} machines x " if result["num_nodes"] > 1 else ""
    return f"{machines}{result['num_gpus']} x {result['gpu']}"


def sweep_text(result: dict[str, Any]) -> str:
    strategies = result["strategies"]
    head = (
        f"per-device peak (GiB) on {_hardware_name(result)} ({result['memory_gib']:.4g} GiB; a peak "
        f"fits up to {result['budget_bytes'] / GIB:.2f} GiB), {result['precision']}, "
        + (f"micro-batch {result['micro_batch_size']}" if result["micro_batch_size"] else "each preset's micro-batch")
        + (", activation checkpointing" if result["activation_checkpointing"] else "")
    )
    lines = [head, "", f"{'preset':<12} {'parameters':>13}  " + "  ".join(f"{s:>14}" for s in strategies)]
    for r in result["presets"]:
        cells = [
            f"{r['strategies'][s]['peak_bytes'] / GIB:>9.2f} {'fits' if r['strategies'][s]['fits'] else 'NO':>4}"
            for s in strategies
        ]
        lines.append(f"{r['preset']:<12} {r['parameters']:>13,}  " + "  ".join(cells))
    lines += ["", "largest preset each strategy trains here, as planned above:"]
    lines += [
        f"  {s:<14} {result['largest_that_fits'][s] or 'none':<12} (with a smaller micro-batch or activation "
        f"checkpointing: {result['largest_with_levers'][s] or 'none'})"
        for s in strategies
    ]
    return "\n".join(lines)


def sweep_figure(result: dict[str, Any], path: Path) -> None:
    """Per-device peak against parameter count, one line per strategy, the usable memory as a horizontal line."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on the machines this runs on
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    params = [r["parameters"] for r in result["presets"]]
    for s in result["strategies"]:
        entry = registry.get(s)
        ax.plot(
            params,
            [r["strategies"][s]["peak_bytes"] / GIB for r in result["presets"]],
            marker=entry.marker,
            color=entry.colour,
            label=entry.title,
        )
    ax.axhline(
        result["budget_bytes"] / GIB,
        color="black",
        linestyle="--",
        label=f"usable: {result['budget_bytes'] / GIB:.1f} of {result['memory_gib']:.4g} GiB",
    )
    ax.set_xscale("log")
    ax.set_xlabel("parameters")
    ax.set_ylabel("predicted per-device peak (GiB)")
    ax.set_title(
        f"{_hardware_name(result)}, {result['precision']}"
        + (f", micro-batch {result['micro_batch_size']}" if result["micro_batch_size"] else "")
        + (", activation checkpointing" if result["activation_checkpointing"] else "")
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def sweep_main(args: PlanRequest) -> int:
    if args.gpu is None and args.gpu_memory_gib is None:
        raise PlanError("--sweep needs --gpu or --gpu_memory_gib")
    result = sweep(args)
    print(json.dumps(result, indent=2) if args.json else sweep_text(result))
    if args.figure is not None:
        sweep_figure(result, args.figure)
    return 0
