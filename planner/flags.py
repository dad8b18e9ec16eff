"""The planner's flags: one parser for `python -m planner`, and `plan_args`, the same flags at their defaults for
callers without a command line of their own (the experiment driver, train.py's start-up note, the launch)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from planner.gpus import PLANNER_GPUS
from planner.plan import DEFAULT_MFU, OVERLAP_MEANING
from training.cli import OneLineParser
from training.presets import PRESETS

DESCRIPTION = "Plan a run before it starts, and put finished runs beside their plan."


def _add_adaptive_flags(parser: argparse.ArgumentParser) -> None:
    adaptive = parser.add_argument_group("adaptive launch and sweep (planner/launch.py, planner/sweep.py)")
    adaptive.add_argument(
        "--launch",
        action="store_true",
        help="print the accelerate launch of the fastest "
        "strategy that fits, with the micro-batch and levers it needs, and why",
    )
    adaptive.add_argument(
        "--execute",
        action="store_true",
        help="with --launch: run that command (--run already names finished runs to compare)",
    )
    adaptive.add_argument(
        "--main_process_ip",
        default="$MAIN_PROCESS_IP",
        help="with --launch and --num_nodes: machine 0's address in the printed lines (default: the shell "
        "variable, as scripts/slurm/train_multinode.sbatch sets it)",
    )
    adaptive.add_argument(
        "--cpu",
        action="store_true",
        help="with --launch: plan CPU processes (fp32, gloo, no "
        "offload) with --gpu_memory_gib as each process's memory",
    )
    adaptive.add_argument(
        "--sweep",
        action="store_true",
        help="every training preset x strategy on --gpu/--num_gpus: "
        "per-device peak, fit, the largest model each strategy trains",
    )
    adaptive.add_argument("--figure", type=Path, help="with --sweep: write the memory-wall figure here (.png)")


def _check_adaptive_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.execute and not args.launch:
        parser.error("--execute runs the command of --launch: give both")
    if args.cpu and not args.launch:
        parser.error("--cpu plans a launch: give --launch")
    if args.launch and args.sweep:
        parser.error("--launch plans one preset, --sweep every preset: give one of them")
    if args.figure is not None and not args.sweep:
        parser.error("--figure draws the sweep: give --sweep")
    if args.execute and args.num_nodes > 1:
        parser.error("--execute runs one machine's command; with --num_nodes run each machine's printed line there")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser(prog="python -m planner", description=DESCRIPTION)
    parser.add_argument("--run", nargs="+", type=Path, metavar="RUN_DIR", help="finished runs to put beside their plan")
    parser.add_argument("--preset", default="gpt2", choices=sorted(PRESETS), help="training preset (default gpt2)")
    parser.add_argument("--gpu", help=f"one of {', '.join(PLANNER_GPUS)}")
    parser.add_argument("--gpu_memory_gib", type=float, help="memory per GPU, instead of (or overriding) --gpu's")
    parser.add_argument("--num_gpus", type=int, default=1, help="GPUs per machine")
    parser.add_argument(
        "--num_nodes",
        type=int,
        default=1,
        help="machines (default 1); several add the strategies made for them (hybrid sharding)",
    )
    parser.add_argument(
        "--inter_node_gb_s",
        type=float,
        help="network bandwidth of each machine to the others, GB/s, all its ports together (with "
        "--num_nodes 2 or more): about 10 for one 100 Gb/s Ethernet port, 45 for one 400 Gb/s "
        "InfiniBand port, 180 for eight 200 Gb/s InfiniBand rails",
    )
    parser.add_argument("--micro_batch_size", type=int, help="default: the preset's")
    parser.add_argument("--block_size", type=int, help="default: the preset's")
    parser.add_argument("--global_batch_tokens", type=int, help="default: the preset's")
    parser.add_argument("--precision", default="fp16", choices=["fp16", "bf16", "fp32"])
    parser.add_argument("--attn_impl", default="sdpa", choices=["sdpa", "math"])
    parser.add_argument(
        "--activation_checkpointing",
        action=argparse.BooleanOptionalAction,
        help="default: the preset's (off but for gpt2-xl)",
    )
    parser.add_argument("--mfu", type=float, default=DEFAULT_MFU, help="assumed model FLOPs utilisation (0-1]")
    link = parser.add_mutually_exclusive_group()
    link.add_argument("--link_gb_s", type=float, help="all-reduce bus bandwidth between GPUs, GB/s")
    link.add_argument(
        "--link_from",
        type=Path,
        metavar="RUN_DIR",
        help="the bus bandwidth a multi-process run measured at start (its config.json)",
    )
    parser.add_argument(
        "--overlap",
        default="full",
        choices=list(OVERLAP_MEANING),
        help="FSDP's prefetching: full (default; FSDP2's own, each unit's all-gather behind the "
        "previous unit's compute) or none (FSDP waits for its collectives). DDP's all-reduce "
        "runs during backward either way: its bucket hooks do that, no setting turns it off",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    _add_adaptive_flags(parser)
    args = parser.parse_args(argv)
    _check_adaptive_flags(parser, args)
    _check_values(parser, args)
    return args


def _check_values(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """One-line errors for values no plan can be made of."""
    for name in ("num_gpus", "num_nodes", "micro_batch_size", "block_size", "global_batch_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} must be at least 1, got {value}")
    if not 0 < args.mfu <= 1:
        parser.error(f"--mfu must lie in (0, 1], got {args.mfu}")
    for name in ("gpu_memory_gib", "link_gb_s", "inter_node_gb_s"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            parser.error(f"--{name} must be positive, got {value}")
    if (args.num_nodes > 1) != (args.inter_node_gb_s is not None) and not args.run:
        parser.error(
            "--num_nodes 2 or more and --inter_node_gb_s go together: the link between machines decides "
            "which strategy is fastest"
        )


def plan_args(**values: Any) -> argparse.Namespace:
    """The planner's command line at its flags' defaults with `values` set: how callers without a command line
    of their own (the experiment driver, train.py's start-up note) plan, on the same defaults as a user."""
    args = vars(parse_args([]))
    unknown = sorted(set(values) - set(args))
    if unknown:
        raise TypeError(f"not flags of the planner: {', '.join(unknown)}")
    return argparse.Namespace(**{**args, **values})
