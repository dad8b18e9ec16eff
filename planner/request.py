"""What the planner is asked: one frozen dataclass, `PlanRequest`, and `python -m planner`'s flags generated from it.

Code that plans without a command line (the experiment driver, train.py's start-up note, the launch, the
notebook) builds a `PlanRequest` directly; its defaults are the flags' defaults, and a value no plan can be made
of is refused on construction (`PlanRequestError`, one line), so the command line and the API check alike.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from planner.gpus import PLANNER_GPUS
from training.cli import OneLineParser, add_flags, config_from, flag
from training.config import PRESETS

DESCRIPTION = "Plan a run before it starts, and put finished runs beside their plan."
LINK = "link"  # the flags of one mutually exclusive group: the link given, or read from a run
ADAPTIVE = "adaptive launch and sweep (planner/launch.py, planner/sweep.py)"
DEFAULT_MFU = 0.30  # an assumption: eager PyTorch GPT-2 124M reaches 25-40% of the tensor-core peak
# --overlap is FSDP's prefetching, a setting; DDP's overlap is not one (its bucket hooks always run in backward).
OVERLAP_MEANING = {
    "full": "DDP's all-reduce during backward, FSDP prefetching",
    "none": "DDP's all-reduce during backward, FSDP not prefetching",
}


class PlanRequestError(ValueError):
    """A request no plan can be made of; the message is one line naming the flags."""


@dataclass(frozen=True)
class PlanRequest:
    run: tuple[Path, ...] | None = flag("finished runs to put beside their plan", metavar="RUN_DIR")
    preset: str = flag("training preset (default gpt2)", "gpt2", choices=sorted(PRESETS))
    gpu: str | None = flag(f"one of {', '.join(PLANNER_GPUS)}")
    gpu_memory_gib: float | None = flag("memory per GPU, instead of (or overriding) --gpu's")
    num_gpus: int = flag("GPUs per machine", 1)
    num_nodes: int = flag("machines (default 1); several add the strategies made for them (hybrid sharding)", 1)
    inter_node_gb_s: float | None = flag(
        "network bandwidth of each machine to the others, GB/s, all its ports together (with --num_nodes 2 or "
        "more): about 10 for one 100 Gb/s Ethernet port, 45 for one 400 Gb/s InfiniBand port, 180 for eight "
        "200 Gb/s InfiniBand rails"
    )
    micro_batch_size: int | None = flag("default: the preset's")
    block_size: int | None = flag("default: the preset's")
    global_batch_tokens: int | None = flag("default: the preset's")
    precision: str = flag("the precision planned", "fp16", choices=["fp16", "bf16", "fp32"])
    attn_impl: str = flag("attention kernel", "sdpa", choices=["sdpa", "math"])
    activation_checkpointing: bool | None = flag("default: the preset's (off but for gpt2-xl)")
    mfu: float | None = flag(
        f"model FLOPs utilisation (0-1]: with --run, in place of the machine profile's; else assumed (default "
        f"{DEFAULT_MFU})"
    )
    profile: Path | None = flag(
        "the machine profile --run predicts from (default: this machine's, written by python -m planner measure)",
        metavar="PATH",
    )
    host_update_gb_s: float | None = flag(
        "one host core's rate over AdamW's element-wise passes, GB/s (default 10, assumed): the offloaded update, "
        "and on the CPU every update (python -m planner measure measures it)"
    )
    link_gb_s: float | None = flag("all-reduce bus bandwidth between GPUs, GB/s", group=LINK)
    link_from: Path | None = flag(
        "the link a machine profile holds (python -m planner measure), or a run from before the profile recorded at "
        "start (its config.json)",
        group=LINK,
        metavar="PROFILE_OR_RUN_DIR",
    )
    overlap: str = flag(
        "FSDP's prefetching: full (default; FSDP2's own, each unit's all-gather behind the previous unit's "
        "compute) or none (FSDP waits for its collectives). DDP's all-reduce runs during backward either way: its "
        "bucket hooks do that, no setting turns it off",
        "full",
        choices=list(OVERLAP_MEANING),
    )
    json: bool = flag("print one JSON object", False)
    launch: bool = flag(
        "print the accelerate launch of the fastest strategy that fits, with the micro-batch and levers it needs, "
        "and why",
        False,
        group=ADAPTIVE,
    )
    execute: bool = flag(
        "with --launch: run that command (--run already names finished runs to compare)", False, group=ADAPTIVE
    )
    main_process_ip: str = flag(
        "with --launch and --num_nodes: machine 0's address in the printed lines (default: the shell variable, as "
        "scripts/slurm/train_multinode.sbatch sets it)",
        "$MAIN_PROCESS_IP",
        group=ADAPTIVE,
    )
    cpu: bool = flag(
        "with --launch: plan CPU processes (fp32, gloo, no offload) with --gpu_memory_gib as each process's memory",
        False,
        group=ADAPTIVE,
    )
    sweep: bool = flag(
        "every training preset x strategy on --gpu/--num_gpus: per-device peak, fit, the largest model each "
        "strategy trains",
        False,
        group=ADAPTIVE,
    )
    figure: Path | None = flag("with --sweep: write the memory-wall figure here (.png)", group=ADAPTIVE)

    @property
    def assumed_mfu(self) -> float:
        """The MFU a plan assumes: --mfu, or DEFAULT_MFU."""
        return DEFAULT_MFU if self.mfu is None else self.mfu

    def __post_init__(self) -> None:
        for problem in (*_range_problems(self), *_combination_problems(self)):
            raise PlanRequestError(problem)


def _range_problems(r: PlanRequest) -> list[str]:
    problems = []
    for name in ("num_gpus", "num_nodes", "micro_batch_size", "block_size", "global_batch_tokens"):
        value = getattr(r, name)
        if value is not None and value < 1:
            problems.append(f"--{name} must be at least 1, got {value}")
    if r.mfu is not None and not 0 < r.mfu <= 1:
        problems.append(f"--mfu must lie in (0, 1], got {r.mfu}")
    for name in ("gpu_memory_gib", "link_gb_s", "inter_node_gb_s", "host_update_gb_s"):
        value = getattr(r, name)
        if value is not None and not value > 0:
            problems.append(f"--{name} must be positive, got {value}")
    return problems


def _combination_problems(r: PlanRequest) -> list[str]:
    checks = (
        (r.link_gb_s is not None and r.link_from is not None, "--link_gb_s and --link_from: give one of them"),
        (r.execute and not r.launch, "--execute runs the command of --launch: give both"),
        (r.cpu and not r.launch, "--cpu plans a launch: give --launch"),
        (r.launch and r.sweep, "--launch plans one preset, --sweep every preset: give one of them"),
        (r.figure is not None and not r.sweep, "--figure draws the sweep: give --sweep"),
        (
            r.execute and r.num_nodes > 1,
            "--execute runs one machine's command; with --num_nodes run each machine's printed line there",
        ),
        (
            (r.num_nodes > 1) != (r.inter_node_gb_s is not None) and not r.run,
            "--num_nodes 2 or more and --inter_node_gb_s go together: the link between machines decides which "
            "strategy is fastest",
        ),
    )
    return [message for failed, message in checks if failed]


# ---------------------------------------------------------------------------------------------------
# The command line, generated from the fields


def parser() -> argparse.ArgumentParser:
    """`python -m planner`'s flags, one per PlanRequest field, in its order."""
    result = OneLineParser(prog="python -m planner", description=DESCRIPTION)
    groups = {LINK: result.add_mutually_exclusive_group(), ADAPTIVE: result.add_argument_group(ADAPTIVE)}
    add_flags(result, PlanRequest, groups)
    return result


def parse_args(argv: list[str]) -> PlanRequest:
    flags = parser()
    try:
        return config_from(PlanRequest, flags.parse_args(argv))
    except PlanRequestError as exc:
        flags.error(str(exc))
