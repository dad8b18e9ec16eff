"""Train every strategy back to back on the same data and global batch, then compare them.

    python -m analysis.experiment --preset tiny --max_steps 30 --out runs/exp1 [--repeats N] [--seeds S1 S2 ...]

What the command is asked is one frozen dataclass, `ExperimentSpec`, and its flags are generated from it
(training/cli.py); `run(spec)` is the same experiment without a command line. Unless told (--strategies), the
reference's strategies are trained; each runs as `accelerate launch --config_file accelerate_configs/<file>
train.py ...` (its registry entry's config file, whose num_processes is read, not assumed) into
OUT/runs/<strategy>, its output saved at OUT/runs/<strategy>.log; all runs share the seed (--seed), the batch and
one W&B group (the experiment name). With --repeats N (the same seed again: timing noise) or --seeds (other seeds:
training noise) each strategy runs several times, into OUT/runs/<strategy>/r<k>, s<seed> or s<seed>-r<k> (logs
beside them, as <folder>.log), interleaved in rounds (every strategy's k-th run before any (k+1)-th), the order
within each round shuffled from --seed, so that a shared machine's slow drift touches every strategy alike and
no strategy always runs right after another; OUT/runs/order.json records the order they ran in. A strategy named
twice is an A/A experiment: two arms, `--strategies ddp ddp` training ddp into OUT/runs/ddp and ddp#2 into
OUT/runs/ddp#2 (the k-th mention is <strategy>#<k>, recorded by train.py --arm), compared as two strategies.

Before launching, the driver prints the global batch and the plan's predicted wall time (written to
OUT/prediction.json for the report); with --gpu or --gpu_memory_gib it skips, and says so, the strategies the
planner says will not fit. A run that fails is reported and the others still run; the comparison is written into
OUT from whatever finished. At the end, --check_exports scores each run's export against its recorded loss and
--wandb_report builds the W&B report. A strategy that spans machines (HSDP) needs --main_process_ip; run the
same command on every machine with its --machine_rank: machine rank 0 trains every strategy and writes the report
(its runs hold every rank's memory), the others join the spanning ones only.

Exit status: 0 when every strategy finished and the report was written; 1 when a strategy failed or an export
differs from its run's record; 2 when the experiment could not be set up (or no run left a folder to compare).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import random
import shlex
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from analysis import scaling
from analysis.scaling import price_text
from training.cli import DefaultsHelpFormatter, OneLineParser, add_flags, config_from, flag, run_main
from training.distributed import registry
from training.geometry import BatchError, batch_defaults, divide, micro_step_tokens, smallest_fitting
from training.versions import version_problem

if TYPE_CHECKING:
    from analysis.prediction import Prediction

PROG = "python -m analysis.experiment"
REPO = Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO / "accelerate_configs"
TRAIN_SCRIPT = REPO / "train.py"
LOG_TAIL_LINES = 20  # of a failed run's log, shown on the console

EXIT_OK, EXIT_FAILED, EXIT_SETUP = 0, 1, 2


class SetupError(ValueError):
    """The experiment cannot start (bad batch, missing config); the message is one line."""


BUDGET, SEEDING, FIT = "budget", "seeding", "fit"  # groups of flags: give one of; give one of; the fit check
FIT_MEANING = "skip the strategies the planner says will not fit (python -m planner)"
_ON_REQUEST = ", ".join(s.name for s in registry.STRATEGIES if not s.reference)
_MULTI_PROCESS = ", ".join(s.name for s in registry.STRATEGIES if s.multi_process)
_ONE_PROCESS = ", ".join(s.name for s in registry.STRATEGIES if not s.multi_process)
_SPANNING = ", ".join(s.name for s in registry.STRATEGIES if s.multi_machine)


@dataclass(frozen=True)
class ExperimentSpec:
    """What every strategy of one experiment shares, and what the driver does around the runs.

    `python -m analysis.experiment`'s flags are generated from these fields (training/cli.py), one per field;
    code that runs an experiment without a command line builds one and calls `run`. A spec no experiment can be
    made of is refused on construction (`SetupError`, one line), so the command line and the API check alike.
    """

    preset: str = flag("train.py preset shared by every strategy", MISSING)
    out: Path = flag("experiment folder: runs/<strategy>/ and the report", MISSING)
    max_steps: int | None = flag("optimizer steps per strategy", group=BUDGET)
    epochs: int | None = flag("epochs per strategy", group=BUDGET)
    strategies: tuple[str, ...] = flag(
        f"strategies to train, from {', '.join(registry.names())} ({_ON_REQUEST} on request); a strategy named "
        f"twice runs as two arms, <strategy> and <strategy>#2 (an A/A experiment: its false verdicts)",
        registry.reference_names(),
        metavar="STRATEGY",
    )
    data: tuple[str, ...] = flag("train.py --data, the same for all", (), metavar="PATH")
    seed: int = flag("the seed of every run (model init, data order, dropout)", 1337, group=SEEDING)
    seeds: tuple[int, ...] = flag(
        "train each strategy once per seed (training noise), instead of --seed; with several, folders "
        "OUT/runs/<strategy>/s<seed>",
        (),
        metavar="SEED",
        group=SEEDING,
    )
    repeats: int = flag(
        "train each strategy N times on the same seed (timing noise), interleaved with the other strategies; "
        "folders OUT/runs/<strategy>/r<k> (s<seed>-r<k> with --seeds)",
        1,
        metavar="N",
    )
    global_batch_tokens: int | None = flag(
        "tokens per optimizer step (default: the preset's, raised to a multiple every strategy's world size divides)"
    )
    micro_batch_size: int | None = flag("sequences per process per micro-step (default: the preset's)")
    block_size: int | None = flag("tokens per sequence (default: the preset's)")
    experiment: str = flag("experiment name = W&B group (default: <preset>-<timestamp>)", "")
    num_processes: int | None = flag(
        f"processes of {_MULTI_PROCESS}, overriding their config files (e.g. 1 for FSDP on a one-GPU machine); "
        f"{_ONE_PROCESS} is always one process"
    )
    machine_rank: int = flag(
        f"this machine's rank for the strategies that span machines ({_SPANNING}); 0 trains every strategy and "
        "writes the report, the others join the spanning ones",
        0,
    )
    main_process_ip: str | None = flag(f"machine rank 0's address, for {_SPANNING}")
    gpu_hour_price: float | None = flag(
        "price of one device for one hour, any currency: the report adds cost per million tokens",
        metavar="PRICE",
        parse=scaling.gpu_hour_price,
    )
    gpu: str | None = flag("the GPUs the runs will have (python -m planner --gpu)", group=FIT)
    gpu_memory_gib: float | None = flag("memory per GPU, instead of (or overriding) --gpu's", group=FIT)
    precision: str = flag(
        "the precision planned (the accelerate configs' mixed_precision)",
        "fp16",
        choices=["fp16", "bf16", "fp32"],
        group=FIT,
    )
    target_loss: float | None = flag(
        "passed to the comparison (python -m analysis.compare --target_loss)", metavar="LOSS"
    )
    dry_run: bool = flag("print the commands and exit", False)
    wandb_report: bool = flag(
        "at the end, build the W&B report of the experiment when logged in (python -m analysis.wandb_report); "
        "otherwise print how to build it later",
        False,
    )
    check_exports: bool = flag(
        "at the end, score each run's hf/ export on its validation blocks against its recorded final validation "
        "loss (python -m analysis.export_check); a difference fails the experiment",
        False,
    )
    extra: tuple[str, ...] = flag(
        "everything after --extra goes to train.py, e.g. --extra --overwrite --lr 3e-4", (), metavar="ARG", rest=True
    )

    def __post_init__(self) -> None:
        if (self.max_steps is None) == (self.epochs is None):
            raise SetupError("give exactly one of --max_steps and --epochs")
        arms_of(self.strategies)  # an unknown strategy or an ambiguous label: SetupError
        spanning = [s for s in self.strategy_names if registry.get(s).multi_machine]
        if spanning and self.main_process_ip is None:
            raise SetupError(
                f"{spanning[0]} spans machines: give --main_process_ip (machine rank 0's address) and "
                "run the same command on every machine with its --machine_rank"
            )
        if self.machine_rank < 0 or (self.machine_rank > 0 and not spanning):
            raise SetupError(
                f"--machine_rank {self.machine_rank}: only machine rank 0 trains strategies that do not "
                "span machines; other machines join those that do (choose one with --strategies)"
            )
        if len(set(self.seeds)) != len(self.seeds):
            raise SetupError("each seed once: a repeat of a seed is what --repeats is for")
        for name in (
            "max_steps",
            "epochs",
            "global_batch_tokens",
            "micro_batch_size",
            "block_size",
            "num_processes",
            "repeats",
            "gpu_hour_price",
            "gpu_memory_gib",
        ):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise SetupError(f"--{name} must be > 0, got {value}")

    @property
    def arms(self) -> tuple[Arm, ...]:
        """Each strategy under its label, in --strategies' order (ddp, ddp#2 for `ddp ddp`)."""
        return arms_of(self.strategies)

    @property
    def strategy_names(self) -> tuple[str, ...]:
        """The strategies trained, each once, in order of first mention."""
        return tuple(dict.fromkeys(arm.strategy for arm in self.arms))

    @property
    def arms_here(self) -> tuple[Arm, ...]:
        """What this machine trains: everything on machine rank 0; only the strategies that span machines on
        the others (rank 0's report is the experiment's)."""
        return tuple(a for a in self.arms if self.machine_rank == 0 or registry.get(a.strategy).multi_machine)

    @property
    def run_seeds(self) -> tuple[int, ...]:
        return self.seeds or (self.seed,)

    @property
    def one_run_each(self) -> bool:
        """One run per strategy: today's layout (OUT/runs/<strategy>), no run name or repeat passed."""
        return self.repeats == 1 and len(self.run_seeds) == 1


# The k-th arm of a strategy named k times (an A/A experiment) is <strategy>#<k>, its folder OUT/runs/<strategy>#<k>:
# no registry name holds "#" (they hold "_"), and shlex quotes it wherever a command is printed.
ARM_MARK = "#"


@dataclass(frozen=True)
class Arm:
    """One side of the comparison: a strategy under its label, the strategy's own name for its first arm and
    <strategy>#<k> for its k-th; the label names the run folder and the report's column."""

    label: str
    strategy: str


def arms_of(entries: Sequence[str]) -> tuple[Arm, ...]:
    """--strategies' entries as arms: the k-th mention of a strategy is its arm <strategy>#<k>. An entry may be
    written as its label (`ddp ddp#2`, as a report names them), and must then be the arm its place makes it.
    SetupError (one line) for an unknown strategy and for a label that names another arm than its place's."""
    seen: Counter[str] = Counter()
    arms = []
    for entry in entries:
        name, mark, _ = entry.partition(ARM_MARK)
        if registry.find(name) is None:
            raise SetupError(f"unknown strategy {entry!r}; choose from {', '.join(registry.names())}")
        seen[name] += 1
        label = name if seen[name] == 1 else f"{name}{ARM_MARK}{seen[name]}"
        if mark and entry != label:
            raise SetupError(
                f"ambiguous label {entry!r}: mention {seen[name]} of {name} in --strategies is the arm {label!r}; "
                f"name the strategy once per arm (--strategies {name} {name} trains {name} and {name}{ARM_MARK}2)"
            )
        arms.append(Arm(label, name))
    return tuple(arms)


@dataclass(frozen=True)
class Slot:
    """Which run of a strategy: its seed and repeat (1-based), and the folder name that says so."""

    seed: int
    repeat: int
    name: str  # r<k>, s<seed> or s<seed>-r<k>; empty for the one run of a strategy


def slots(spec: ExperimentSpec) -> list[Slot]:
    """Seeds apart from repeats: a folder names the seed only when there are several, the repeat likewise."""
    several_seeds = len(spec.run_seeds) > 1
    out = []
    for seed in spec.run_seeds:
        for repeat in range(1, spec.repeats + 1):
            parts = ([f"s{seed}"] if several_seeds else []) + ([f"r{repeat}"] if spec.repeats > 1 else [])
            out.append(Slot(seed, repeat, "-".join(parts)))
    return out


@dataclass(frozen=True)
class Batch:
    micro_batch_size: int
    block_size: int
    global_batch_tokens: int

    def grad_accum(self, world_size: int) -> int:
        """Micro-steps per optimizer step with `world_size` processes, as train.py derives them."""
        return divide(self.global_batch_tokens, self.micro_batch_size, self.block_size, world_size).grad_accum_steps


@dataclass(frozen=True)
class Launch:
    """One strategy's training command and where it writes."""

    strategy: str
    world_size: int
    argv: tuple[str, ...]
    run_dir: Path
    log: Path
    seed: int = 1337
    repeat: int = 1
    run_name: str = ""  # empty: train.py's default name
    arm: str = ""  # the strategy's label (ddp#2); empty: the strategy itself

    @property
    def label(self) -> str:
        return self.run_name or self.arm or self.strategy


@dataclass
class Outcome:
    launch: Launch
    returncode: int
    seconds: float
    tail: list[str] = field(default_factory=list)
    started: float = 0.0  # wall clock (Unix seconds) at launch

    @property
    def ok(self) -> bool:
        return self.returncode == 0


# ---------------------------------------------------------------------------------------------
# Planning (pure: nothing is launched or written)


def read_num_processes(config_file: Path) -> int:
    """`num_processes` of an accelerate YAML config."""
    import yaml  # PyYAML comes with accelerate; only the driver needs it

    if not config_file.is_file():
        raise SetupError(f"accelerate config not found: {config_file}")
    layout = yaml.safe_load(config_file.read_text(encoding="utf-8")) or {}
    processes = layout.get("num_processes")
    if not isinstance(processes, int) or processes < 1:
        raise SetupError(f"{config_file} has no positive integer num_processes")
    return processes


def world_sizes(
    strategies: Sequence[str], config_dir: Path = CONFIG_DIR, num_processes: int | None = None
) -> dict[str, int]:
    """Processes per strategy: the config file's, or `num_processes` for the multi-process strategies when
    given (a one-process strategy is one process by definition)."""
    sizes = {s: read_num_processes(config_dir / registry.get(s).config_file) for s in strategies}
    if num_processes is not None:
        sizes.update(
            {
                s: num_processes
                for s in strategies
                if registry.get(s).multi_process and not registry.get(s).multi_machine
            }
        )
    return sizes


def preset_defaults(preset: str) -> dict[str, object]:
    """The preset's values, from the training side's own table."""
    from training.config import preset_overrides  # a plain dict table: cheap to import

    try:
        return preset_overrides(preset)
    except ValueError as err:
        raise SetupError(str(err)) from None


def choose_batch(spec: ExperimentSpec, sizes: Sequence[int], defaults: dict[str, object]) -> Batch:
    """A global batch every world size divides: train.py derives accumulation from it and refuses a rest.

    Tokens per optimizer step must be a multiple of micro_batch x block_size x world_size for every
    strategy, i.e. of micro_batch x block_size x lcm(world sizes). A batch given on the command line
    is checked, never changed; the preset's is raised to the next such multiple if needed.
    """
    preset = batch_defaults(defaults)  # the preset's values, else train.py's config defaults
    micro = spec.micro_batch_size or preset.micro_batch_size
    block = spec.block_size or preset.block_size
    lcm = math.lcm(*sizes)
    if spec.global_batch_tokens is not None:
        try:
            divide(
                spec.global_batch_tokens, micro, block, lcm, processes=f"lcm(world sizes {', '.join(map(str, sizes))})"
            )
        except BatchError as err:
            raise SetupError(str(err)) from None
        return Batch(micro, block, spec.global_batch_tokens)
    wanted = preset.global_batch_tokens or micro_step_tokens(micro, block, lcm)
    return Batch(micro, block, smallest_fitting(wanted, micro, block, list(sizes)))


def planned_misfits(
    spec: ExperimentSpec, sizes: dict[str, int], batch: Batch, gpu: str | None, memory_gib: float | None, precision: str
) -> dict[str, str]:
    """The strategies the planner says will not fit `gpu` (or `memory_gib` per device) at the experiment's
    batch, each with the line the report shows: "does not fit (planned X GiB of Y)"."""

    from planner.errors import PlanError
    from planner.plan import GIB, hardware, plan_strategy, workload_for  # when asked
    from planner.request import DEFAULT_MFU, PlanRequest

    extra = set(spec.extra)  # a lever passed on to train.py is planned too; else the preset's
    checkpointing = (
        True if "--activation_checkpointing" in extra else (False if "--no-activation_checkpointing" in extra else None)
    )
    try:
        hw = hardware(gpu, precision, memory_gib, None)
        misfits = {}
        for strategy in spec.strategy_names:
            args = PlanRequest(
                preset=spec.preset,
                block_size=batch.block_size,
                micro_batch_size=batch.micro_batch_size,
                num_gpus=sizes[strategy],
                global_batch_tokens=batch.global_batch_tokens,
                precision=precision,
                activation_checkpointing=checkpointing,
            )
            plan = plan_strategy(workload_for(args, strategy), strategy, hw, DEFAULT_MFU, "full")  # speed unused
            if not plan["fits"]:
                misfits[strategy] = (
                    f"{strategy}: does not fit (planned {plan['per_device_bytes']['total'] / GIB:.2f} "
                    f"GiB of {hw.memory_gib:.4g} GiB per device on {hw.name}, {precision}); not launched"
                )
    except PlanError as err:
        raise SetupError(str(err)) from None
    return misfits


def default_launcher() -> tuple[str, ...]:
    """`accelerate launch` from this interpreter's environment when it is there, else from PATH."""
    beside = Path(sys.executable).parent / "accelerate"
    return (str(beside) if beside.exists() else shutil.which("accelerate") or "accelerate", "launch")


def _shown(path: Path, cwd: Path) -> str:
    """A path relative to the working directory when it lies below it: shorter commands to read."""
    try:
        return str(path.resolve().relative_to(cwd.resolve()))
    except ValueError:
        return str(path)


def _shared_args(spec: ExperimentSpec, batch: Batch) -> list[str]:
    """What every run of the experiment gets alike (the seed is per run)."""
    budget = ["--max_steps", str(spec.max_steps)] if spec.max_steps is not None else ["--epochs", str(spec.epochs)]
    shared = [
        "--preset",
        spec.preset,
        *budget,
        "--experiment",
        spec.experiment,
        "--global_batch_tokens",
        str(batch.global_batch_tokens),
        "--micro_batch_size",
        str(batch.micro_batch_size),
    ]
    if spec.block_size is not None:
        shared += ["--block_size", str(spec.block_size)]
    if spec.data:
        shared += ["--data", *spec.data]
    return shared


def build_launches(
    spec: ExperimentSpec,
    sizes: dict[str, int],
    batch: Batch,
    launcher: Sequence[str],
    cwd: Path,
    config_dir: Path = CONFIG_DIR,
    train_script: Path = TRAIN_SCRIPT,
) -> list[Launch]:
    """The command of each run, in the order they run: same preset, data, batch and W&B group for all.

    Interleaved, every strategy's k-th run before any strategy's (k+1)-th, so that a shared machine's
    slow drift (other jobs, heat, clocks) lands on every strategy alike instead of on whichever ran last;
    within each round in `round_order`.
    """
    shared = _shared_args(spec, batch)
    launches = []
    here = set(spec.arms_here)
    for k, slot in enumerate(slots(spec)):
        for arm in round_order(spec, k):
            if arm in here:
                launches.append(
                    _launch(spec, arm, slot, sizes[arm.strategy], shared, launcher, cwd, config_dir, train_script)
                )
    return launches


def round_order(spec: ExperimentSpec, round_index: int) -> list[Arm]:
    """The arms in the order round `round_index` runs them. With one round, --strategies' order. With several,
    shuffled per round from the experiment's seed: in a fixed order the k-th strategy would always run k slots
    after the first, and a machine slowing down steadily would make it slower by k slots' drift in every round.
    The same seed gives the same order, so an interrupted experiment run again continues in it, and every
    machine of a spanning experiment shuffles all arms alike before keeping its own."""
    arms = list(spec.arms)
    if len(slots(spec)) > 1:
        random.Random(f"{ORDER_SEED_TAG}:{spec.seed}:{round_index}").shuffle(arms)
    return arms


ORDER_SEED_TAG = "round order"  # the string the rounds' shuffles are seeded with, beside the seed and round
WITHIN_ROUND = "shuffled within each round from the experiment's seed (analysis.experiment.round_order)"


def _identity(arm: Arm, slot: Slot) -> tuple[str, list[str]]:
    """The run name and train.py's flags that tell this run apart: its seed, and its name and repeat when the
    strategy runs several times; its arm when it is not the strategy's first (recorded: the report compares arms).
    One run per strategy keeps train.py's default run name; several are told apart in W&B by name
    (<label>-r<k>), grouped by the experiment, job type the strategy; a second arm always by its label."""
    relabelled = arm.label != arm.strategy
    run_name = f"{arm.label}-{slot.name}" if slot.name else (arm.label if relabelled else "")
    identity = ["--seed", str(slot.seed)]
    if slot.name:
        identity += ["--run_name", run_name, "--repeat", str(slot.repeat)]
    elif relabelled:
        identity += ["--run_name", run_name]
    return run_name, [*identity, *(["--arm", arm.label] if relabelled else [])]


def _launch(
    spec: ExperimentSpec,
    arm: Arm,
    slot: Slot,
    world_size: int,
    shared: list[str],
    launcher: Sequence[str],
    cwd: Path,
    config_dir: Path,
    train_script: Path,
) -> Launch:
    strategy, relabelled = arm.strategy, arm.label != arm.strategy
    folder = spec.out / "runs" / arm.label
    run_dir = folder / slot.name if slot.name else folder
    run_name, identity = _identity(arm, slot)
    # accelerate's own flag overrides the file's num_processes, so the printed command says it. A config that
    # spans machines counts the processes of all of them: it keeps its own, and is told where it runs.
    entry = registry.get(strategy)
    processes = (
        ("--num_processes", str(spec.num_processes))
        if spec.num_processes is not None and entry.multi_process and not entry.multi_machine
        else ()
    )
    machines = (
        ("--machine_rank", str(spec.machine_rank), "--main_process_ip", str(spec.main_process_ip))
        if entry.multi_machine
        else ()
    )
    argv = (
        *launcher,
        "--config_file",
        _shown(config_dir / entry.config_file, cwd),
        *processes,
        *machines,
        _shown(train_script, cwd),
        *shared,
        *identity,
        "--output_dir",
        str(run_dir),
        # train.py stops at start-up if the launch gives another strategy (FSDP quietly
        # becoming DDP, say), so a mislabelled run never reaches the report.
        "--strategy",
        strategy,
        *spec.extra,
    )
    return Launch(
        strategy,
        world_size,
        argv,
        run_dir,
        run_dir.parent / f"{run_dir.name}.log",
        slot.seed,
        slot.repeat,
        run_name,
        arm.label if relabelled else "",
    )


# ---------------------------------------------------------------------------------------------
# Running


def run_launch(launch: Launch, cwd: Path, echo: bool = True) -> Outcome:
    """Run one strategy, its output teed into its log file; a launch that cannot start is exit 127."""
    launch.log.parent.mkdir(parents=True, exist_ok=True)
    started = time.time()
    start = time.perf_counter()
    with launch.log.open("wb") as log:
        try:
            process = subprocess.Popen(launch.argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except OSError as err:
            log.write(f"cannot start {launch.argv[0]}: {err}\n".encode())
            returncode = 127
        else:
            assert process.stdout is not None
            for chunk in iter(lambda: process.stdout.read1(65536), b""):
                log.write(chunk)
                if echo:
                    sys.stdout.buffer.write(chunk)
                    sys.stdout.buffer.flush()
            returncode = process.wait()
    return Outcome(launch, returncode, time.perf_counter() - start, _tail(launch.log), started)


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    text = path.read_text(encoding="utf-8", errors="replace").replace("\r", "\n")  # progress bars use \r
    return [line for line in text.splitlines() if line.strip()][-lines:]


def failure_cause(log: Path) -> str:
    """The line of a failed launch that says why: its own last `error:` line (train.py prints one line
    for every failure it can name) when there is one, else its last line that is not the launcher's
    decoration (torchrun's ===== and ----- rules, which follow every failure)."""
    lines = [
        line.strip() for line in log.read_text(encoding="utf-8", errors="replace").replace("\r", "\n").splitlines()
    ]
    errors = [line for line in lines if line.startswith("error:")]
    if errors:
        return errors[-1]
    meaningful = [line for line in lines if line and set(line) - set("=-")]
    return meaningful[-1] if meaningful else "(no output)"


def failure_note(outcome: Outcome) -> str:
    return (
        f"{outcome.launch.label}: training failed with exit code {outcome.returncode} after "
        f"{outcome.seconds:.0f} s (log: {outcome.launch.log}); cause: {failure_cause(outcome.launch.log)}"
    )


def run_all(launches: list[Launch], cwd: Path, echo: bool = True) -> list[Outcome]:
    """Every run in the given order; one that fails is reported and the next still runs."""
    outcomes = []
    for number, launch in enumerate(launches, start=1):
        tag = f"[{number}/{len(launches)}] {launch.label}"
        print(f"{tag} ({launch.world_size} process(es)): {shlex.join(launch.argv)}", flush=True)
        outcome = run_launch(launch, cwd, echo)
        outcomes.append(outcome)
        if outcome.ok:
            print(f"{tag}: finished in {outcome.seconds:.0f} s", flush=True)
        else:
            print(f"{tag}: FAILED, exit code {outcome.returncode}; last lines of {launch.log}:", file=sys.stderr)
            print("\n".join(f"    {line}" for line in outcome.tail), file=sys.stderr, flush=True)
    return outcomes


def run_experiment(
    spec: ExperimentSpec,
    launches: list[Launch],
    cwd: Path,
    echo: bool = True,
    skipped: Sequence[str] = (),
    to_run: list[Launch] | None = None,
) -> int:
    """`skipped`: one line per strategy the plan left out, for the report. `to_run`: the launches still to
    run when an interrupted experiment continues (default: all); the report covers every launch's run."""
    from analysis.compare import compare  # the report stack (matplotlib) is needed only at the end
    from analysis.continuation import earlier_runs

    earlier = earlier_runs(spec.out) if to_run is not None else []
    outcomes = run_all(launches if to_run is None else to_run, cwd, echo)
    write_run_order(spec, outcomes, earlier)
    failed = [o for o in outcomes if not o.ok]
    if spec.machine_rank > 0:
        print(f"machine rank {spec.machine_rank}: done; the report is written on machine rank 0", flush=True)
        for note in (failure_note(o) for o in failed):
            print(f"error: {note}", file=sys.stderr)
        return EXIT_FAILED if failed else EXIT_OK
    notes = [*skipped, *(failure_note(o) for o in failed)]
    run_dirs = [launch.run_dir for launch in launches if launch.run_dir.is_dir()]
    if run_dirs:
        # Passed only when given, so a comparison without a target reads as it always did.
        target = {"target_loss": spec.target_loss} if spec.target_loss is not None else {}
        report_rc = compare(
            run_dirs, spec.out, comparison_command(spec, launches), notes, spec.gpu_hour_price, **target
        )
    else:
        print("error: no strategy left a run directory; nothing to compare", file=sys.stderr)
        report_rc = EXIT_SETUP
    for note in notes:
        print(f"error: {note}", file=sys.stderr)
    return EXIT_FAILED if failed else report_rc


def write_run_order(spec: ExperimentSpec, outcomes: list[Outcome], earlier: Sequence[dict] = ()) -> None:
    """OUT/runs/order.json: every run in the order it ran, with its seed, repeat, start time and exit status,
    so the interleaving and any failed repeat can be checked after the fact; `earlier`: the rows of the
    launches before an interruption, kept first."""
    rows = [
        {
            "strategy": o.launch.strategy,
            "arm": o.launch.arm or o.launch.strategy,
            "seed": o.launch.seed,
            "repeat": o.launch.repeat,
            "run_name": o.launch.run_name or None,
            "run_dir": str(o.launch.run_dir),
            "started_unix_s": o.started,
            "seconds": o.seconds,
            "returncode": o.returncode,
        }
        for o in outcomes
    ]
    rows = [*earlier, *rows]
    path = spec.out / "runs" / "order.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "experiment": spec.experiment,
                "repeats": spec.repeats,
                "seeds": list(spec.run_seeds),
                "order_seed": spec.seed,
                "order": WITHIN_ROUND if len(slots(spec)) > 1 else "--strategies' order",
                "runs": rows,
            },
            indent=2,
        ),
        encoding="utf-8",
    )


def comparison_command(spec: ExperimentSpec, launches: list[Launch]) -> str:
    price = ["--gpu_hour_price", price_text(spec.gpu_hour_price)] if spec.gpu_hour_price is not None else []
    target = ["--target_loss", f"{spec.target_loss:g}"] if spec.target_loss is not None else []
    return shlex.join(
        [
            "python",
            "-m",
            "analysis.compare",
            *(str(launch.run_dir) for launch in launches),
            "--out",
            str(spec.out),
            *price,
            *target,
        ]
    )


# ---------------------------------------------------------------------------------------------
# Command line


def parser() -> argparse.ArgumentParser:
    """`python -m analysis.experiment`'s flags, one per ExperimentSpec field, in its order."""
    result = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0], formatter_class=DefaultsHelpFormatter)
    groups = {
        BUDGET: result.add_mutually_exclusive_group(required=True),
        SEEDING: result.add_mutually_exclusive_group(),
        FIT: result.add_argument_group(FIT, FIT_MEANING),
    }
    add_flags(result, ExperimentSpec, groups)
    return result


def parse_spec(argv: Sequence[str]) -> ExperimentSpec:
    """The spec a command line gives; a malformed flag exits 2 with one line, a bad spec raises SetupError."""
    return config_from(ExperimentSpec, parser().parse_args(argv))


def main(
    argv: Sequence[str] | None = None,
    launcher: Sequence[str] | None = None,
    config_dir: Path = CONFIG_DIR,
    echo: bool = True,
) -> int:
    problem = version_problem()  # before the first launch: every run would stop on it
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_SETUP
    try:
        spec = parse_spec(sys.argv[1:] if argv is None else argv)
    except SetupError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_SETUP
    return run(spec, launcher, config_dir, echo)


def named(spec: ExperimentSpec) -> ExperimentSpec:
    """The spec with its experiment name: the one given, else the one OUT's runs recorded (an interrupted experiment
    run again continues under its name), else <preset>-<timestamp>."""
    from analysis.continuation import recorded_experiment

    if spec.experiment:
        return spec
    name = recorded_experiment(spec.out) or f"{spec.preset}-{datetime.datetime.now():%Y%m%d-%H%M%S}"
    return replace(spec, experiment=name)


def run(
    spec: ExperimentSpec,
    launcher: Sequence[str] | None = None,
    config_dir: Path = CONFIG_DIR,
    echo: bool = True,
) -> int:
    """The experiment, from its batch and plan to the report (with `spec.dry_run`, only the commands); the exit
    status of `python -m analysis.experiment`. `launcher` replaces `accelerate launch` (tests use a stand-in
    script)."""
    spec = named(spec)
    cwd = Path(os.getcwd())
    try:
        sizes = world_sizes(spec.strategy_names, config_dir, spec.num_processes)
        batch = choose_batch(spec, list(sizes.values()), preset_defaults(spec.preset))
        spec, skipped = _skip_misfits(spec, sizes, batch)
    except SetupError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_SETUP
    launches = build_launches(spec, sizes, batch, launcher or default_launcher(), cwd, config_dir)
    accumulation = ", ".join(f"{s} {batch.grad_accum(n)}" for s, n in sizes.items() if s in spec.strategy_names)
    print(
        f"experiment {spec.experiment}: global batch {batch.global_batch_tokens:,} tokens "
        f"(micro batch {batch.micro_batch_size} x block {batch.block_size}; accumulation steps: {accumulation})"
    )
    if not spec.one_run_each:
        print(
            f"{len(launches)} runs: {len(spec.arms)} strategies x {len(spec.run_seeds)} seed(s) x "
            f"{spec.repeats} repeat(s), interleaved"
        )
    prediction, predicted = predicted_wall_time(spec, sizes, batch)
    print(predicted, flush=True)
    to_run = continued_launches(launches)  # an interrupted experiment run again: only what is left
    if spec.dry_run:
        for launch in to_run:
            print(shlex.join(launch.argv))
        print(comparison_command(spec, launches))
        if spec.wandb_report:
            print(wandb_report_command(spec, launches))
        return EXIT_OK
    if prediction is not None:
        from analysis.prediction import write_prediction

        write_prediction(spec.out, prediction)  # the report sets it against the runs
    status = run_experiment(spec, launches, cwd, echo, skipped, to_run)
    if spec.check_exports:
        status = max(status, check_exports([launch.run_dir for launch in launches]))
    if spec.wandb_report:
        # The report never changes the exit status: it is a view of runs that are already recorded.
        from analysis.wandb_report import report_after_experiment

        report_after_experiment(spec.experiment, [launch.run_dir for launch in launches], spec.target_loss)
    return status


def continued_launches(launches: list[Launch]) -> list[Launch]:
    """The launches left when the experiment's folder already holds some of its runs, said in one line
    each (kept, resumed, launched); all of them, silently, when it holds none."""
    from analysis.continuation import RunProgress, continue_experiment

    continuation = continue_experiment(launches)
    if any(p is not RunProgress.ABSENT for p in continuation.progress.values()):
        for line in continuation.lines({launch.run_dir: launch.label for launch in launches}):
            print(line, flush=True)
    return continuation.launches


def predicted_wall_time(spec: ExperimentSpec, sizes: dict[str, int], batch: Batch) -> tuple[Prediction | None, str]:
    """The plan's training time for the whole experiment (analysis/prediction.py) on the --gpu given, else on
    this CPU, and the line that says it; no prediction with --epochs (the steps depend on the data)."""
    from analysis.prediction import Planned, hardware_for, predict
    from planner.errors import PlanError

    if spec.max_steps is None:
        return None, "predicted wall time: none with --epochs (the steps depend on the data; --max_steps has one)"
    runs = len(spec.run_seeds) * spec.repeats
    arms = Counter(arm.strategy for arm in spec.arms_here)  # an A/A experiment runs its strategy twice as often
    plans = [Planned(s, sizes[s], spec.max_steps, runs * k) for s, k in arms.items()]
    workload = {
        "preset": spec.preset,
        "block_size": batch.block_size,
        "micro_batch_size": batch.micro_batch_size,
        "global_batch_tokens": batch.global_batch_tokens,
        "precision": spec.precision,
    }
    try:
        hw, basis = hardware_for(spec.gpu, spec.gpu_memory_gib, spec.precision)
        prediction = predict(plans, workload, hw, basis)
    except PlanError as err:
        return None, f"predicted wall time: none ({err})"
    if prediction is None:
        return None, "predicted wall time: none (a GPU given only by its memory has no peak FLOP/s; --gpu names one)"
    return prediction, prediction.line()


def _skip_misfits(spec: ExperimentSpec, sizes: dict[str, int], batch: Batch) -> tuple[ExperimentSpec, list[str]]:
    """The experiment without the strategies that will not fit (said once here, and in the report)."""
    if spec.gpu is None and spec.gpu_memory_gib is None:
        return spec, []
    misfits = planned_misfits(spec, sizes, batch, spec.gpu, spec.gpu_memory_gib, spec.precision)
    for line in misfits.values():
        print(f"skipping {line}", flush=True)
    kept = tuple(a.label for a in spec.arms if a.strategy not in misfits)
    if not kept:
        raise SetupError(
            f"no strategy fits {spec.preset} at this batch; python -m planner --preset "
            f"{spec.preset} --launch shows the micro-batch and levers that would"
        )
    return replace(spec, strategies=kept), list(misfits.values())


def check_exports(run_dirs: list[Path]) -> int:
    """EXIT_FAILED when an export's loss differs from its run's record; a run that left no export failed
    already and was reported, so it is skipped here."""
    from analysis.export_check import ExportError, check_export, differ_line  # torch: only when asked

    status = EXIT_OK
    for run_dir in [d for d in run_dirs if (d / "hf").is_dir()]:
        try:
            check = check_export(run_dir)
        except ExportError as err:
            print(f"error: {err}", file=sys.stderr)
            status = EXIT_FAILED
            continue
        print(
            f"export check: {run_dir}: loss {check.loss:.6f} (scored in {check.scored_in}), recorded "
            f"{check.recorded_final_val_loss:.6f} (relative difference {check.relative_difference:.2e}, "
            f"tolerance {check.tolerance:.2e})",
            flush=True,
        )
        if not check.agree:
            print(f"error: {differ_line(check)}", file=sys.stderr)
            status = EXIT_FAILED
    return status


def wandb_report_command(spec: ExperimentSpec, launches: list[Launch]) -> str:
    return shlex.join(
        [
            "python",
            "-m",
            "analysis.wandb_report",
            "--experiment",
            spec.experiment,
            *(["--target_loss", f"{spec.target_loss:g}"] if spec.target_loss is not None else []),
            "--runs",
            *(str(launch.run_dir) for launch in launches),
        ]
    )


if __name__ == "__main__":
    run_main(main)
