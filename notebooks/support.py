"""What notebooks/compare_strategies.ipynb needs from the machine it runs on.

Platform (Kaggle, Colab, elsewhere), the requirements to install, the devices, an all-reduce check
before training, where the data and the outputs are, W&B credentials from the platform's secret
store, a time estimate, and running the experiment driver with its output streamed. Training and the
report are the project's own (`analysis.experiment`); nothing here trains.

Only the standard library and the project's strategy registry (plain Python) are imported at module
level: the notebook loads this file before the project's requirements are installed.
"""

from __future__ import annotations

import datetime
import glob
import importlib.metadata
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from training import versions
from training.distributed import registry

if TYPE_CHECKING:
    from analysis.experiment import ExperimentSpec
    from planner.request import PlanRequest

ROOT = Path(__file__).resolve().parents[1]
KAGGLE_INPUT = Path("/kaggle/input")
SECRET_NAME = "WANDB_API_KEY"
# Optimizer steps of each strategy when the notebook is not told: the gpt2 figure keeps the three
# runs on 2x T4 well within half an hour (see estimate_minutes); tiny and mini are CPU checks.
DEFAULT_STEPS = {"gpt2": 500, "mini": 200, "tiny": 30}
ALLREDUCE_TIMEOUT_S = 180
# Lines of requirements.txt that only the tests need: a notebook platform is not made to install them.
TEST_ONLY = ("pytest", "papermill", "ipykernel")


def platform_name() -> str:
    """kaggle, colab or local."""
    if os.environ.get("KAGGLE_KERNEL_RUN_TYPE") or Path("/kaggle/working").is_dir():
        return "kaggle"
    if os.environ.get("COLAB_RELEASE_TAG") or "google.colab" in sys.modules:
        return "colab"
    return "local"


# ---------------------------------------------------------------------------------------------
# Requirements


def missing_requirements(requirements: Path = ROOT / "requirements.txt") -> list[str]:
    """The lines of requirements.txt that the installed packages do not satisfy (test-only ones left out)."""
    missing = []
    for requirement in versions.requirements(requirements):
        installed = _version(requirement.name)
        if requirement.name not in TEST_ONLY and (installed is None or not versions.in_range(installed, requirement)):
            missing.append(str(requirement))
    return missing


class OutsideRange(RuntimeError):
    """Stops the notebook with one `error:` line: IPython shows _render_traceback_'s lines instead of a traceback."""

    def _render_traceback_(self) -> list[str]:
        return [f"error: {self}"]


def install(requirements: list[str]) -> None:
    """pip-install `requirements`, never torch: the platform's CUDA build stays (pinned as a constraint). A torch
    below the project's range stops here, with the command that installs a tested one of the same build (CUDA
    version, or CPU), then restart the kernel."""
    if any(re.match(r"torch\b(?![-_])", r) for r in requirements):
        wanted = versions.parse(next(r for r in requirements if re.match(r"torch\b(?![-_])", r)))
        raise OutsideRange(f"{versions.refusal(wanted, _version('torch'))}, then restart the kernel")
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as constraints:
        constraints.write(f"torch=={_version('torch')}\n" if _version("torch") else "")
    command = [sys.executable, "-m", "pip", "install", "-q", *requirements, "-c", constraints.name]
    print(shlex.join(command), flush=True)
    try:
        subprocess.run(command, check=True)
    finally:
        os.unlink(constraints.name)
    importlib.invalidate_caches()


def release_note() -> str | None:
    """The `warning:` line for a torch or accelerate newer than the newest tested (kept: the notebook goes on)."""
    note = versions.untested_releases()
    return f"warning: {note}" if note else None


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


# ---------------------------------------------------------------------------------------------
# Devices

# Run in a child process so that the notebook's kernel creates no CUDA context (one holds a few hundred
# MiB of the first GPU's memory, and training runs in processes of its own anyway).
_DEVICE_PROBE = """
import json, torch
gpus = [{"name": torch.cuda.get_device_name(i), "capability": list(torch.cuda.get_device_capability(i)),
         "memory_gib": torch.cuda.get_device_properties(i).total_memory / 2**30}
        for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
print(json.dumps({"gpus": gpus, "torch": torch.__version__, "cuda": torch.version.cuda}))
"""


@dataclass(frozen=True)
class Devices:
    gpus: list[dict]
    torch: str
    cuda: str | None
    accelerate: str | None

    @property
    def count(self) -> int:
        return len(self.gpus)

    @property
    def all_t4(self) -> bool:
        return bool(self.gpus) and all("T4" in gpu["name"] for gpu in self.gpus)

    def describe(self) -> str:
        lines = [f"torch {self.torch} (CUDA {self.cuda or 'none'}), accelerate {self.accelerate}"]
        if not self.gpus:
            lines.append("no GPU visible")
        for index, gpu in enumerate(self.gpus):
            major, minor = gpu["capability"]
            lines.append(
                f"GPU {index}: {gpu['name']}, compute capability {major}.{minor} (sm{major}{minor}), "
                f"{gpu['memory_gib']:.1f} GiB"
            )
        if self.gpus:
            lines.append(
                "precision: fp16, as the launch configs say (a T4 has fp16 tensor cores and emulates "
                f"bf16, more slowly than fp32); {self.compile_note()}"
            )
        return "\n".join(lines)

    def compile_note(self) -> str:
        """What train.py's --compile auto does on these GPUs (training/distributed/speed_levers.py decides it at start-up)."""
        from training.distributed.speed_levers import (
            COMPILE_MIN_CAPABILITY,  # imports torch: the requirements are installed by now
        )

        on = all(tuple(gpu["capability"]) >= COMPILE_MIN_CAPABILITY for gpu in self.gpus)
        least = ".".join(map(str, COMPILE_MIN_CAPABILITY))
        return (
            f"torch.compile: {'on' if on else 'off'} here (train.py's --compile auto compiles each block on "
            f"compute capability {least} and newer; below it, T4/sm75 included, inductor's kernels are slower "
            "or fail to build; --compile on or off in train_args overrides it)"
        )


def devices() -> Devices:
    probe = subprocess.run([sys.executable, "-c", _DEVICE_PROBE], capture_output=True, text=True, check=True)
    facts = json.loads(probe.stdout.strip().splitlines()[-1])
    return Devices(facts["gpus"], facts["torch"], facts["cuda"], _version("accelerate"))


# ---------------------------------------------------------------------------------------------
# What to run


@dataclass
class Plan:
    preset: str
    max_steps: int
    strategies: list[str]
    num_processes: int | None  # None: the launch configs' (2 for ddp and fsdp)
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        processes = self.num_processes or 2
        layout = ", ".join(
            f"{s} ({processes if registry.get(s).multi_process else 1} process(es))" for s in self.strategies
        )
        return "\n".join([f"preset {self.preset}, {self.max_steps} steps per strategy: {layout}", *self.notes])


def plan_run(preset: str, max_steps: int | None, gpus: int) -> Plan:
    """Preset, steps and strategies for the devices there are; `preset` "auto" is gpt2 on GPUs, tiny on CPU."""
    notes = []
    if preset == "auto":
        preset = "gpt2" if gpus else "tiny"
    elif preset == "gpt2" and not gpus:
        notes.append("note: GPT-2 124M on CPU takes many seconds per step; preset tiny is the CPU check")
    steps = max_steps or DEFAULT_STEPS.get(preset, 30)
    if gpus == 1:
        # Colab's usual session. With one process DDP would be the single run plus a wrapper and FSDP would
        # shard nothing: neither would show what the comparison is about, so they are skipped, and said so.
        skipped = ", ".join(s.name for s in registry.STRATEGIES if s.reference and s.multi_process)
        notes.append(
            f"one GPU: only {', '.join(strategies_for(gpus))} runs; {skipped} need two GPUs (one process "
            "each, and the point is how they split the work between them), so they are skipped. "
            "On Kaggle choose the accelerator 'GPU T4 x2' to run all three."
        )
        return Plan(preset, steps, strategies_for(gpus), 1, notes)
    if gpus > 2:
        notes.append(f"{gpus} GPUs: DDP and FSDP use 2 of them, the reference experiment's layout")
    if not gpus:
        notes.append("no GPU: every strategy runs on the CPU (DDP and FSDP as 2 processes over gloo, fp32)")
    return Plan(preset, steps, strategies_for(gpus), None, notes)


def strategies_for(gpus: int) -> list[str]:
    """The reference's strategies; on one GPU only the one-process ones (the others need two GPUs)."""
    return [s.name for s in registry.STRATEGIES if s.reference and (gpus != 1 or not s.multi_process)]


def output_root(out_dir: str) -> Path:
    """Where experiments are written: out_dir, else /kaggle/working, /content or runs/ of the project."""
    if out_dir:
        return Path(out_dir).expanduser().resolve()
    return {"kaggle": Path("/kaggle/working/compare_strategies"), "colab": Path("/content/compare_strategies")}.get(
        platform_name(), ROOT / "runs" / "notebook"
    )


def experiment_name(preset: str, root: Path | None = None) -> str:
    """A new experiment's name, or, when `root` holds an experiment of this preset that never wrote its report
    (a Colab disconnect, Kaggle's time limit), that one's: running the notebook again continues it."""
    prefix = f"notebook-{preset}-"
    unfinished = sorted(
        p.name for p in (root.glob(f"{prefix}*") if root else []) if p.is_dir() and not (p / "table.md").exists()
    )
    return unfinished[-1] if unfinished else f"{prefix}{datetime.datetime.now():%Y%m%d-%H%M%S}"


# ---------------------------------------------------------------------------------------------
# Data


@dataclass
class DataChoice:
    paths: list[str]  # the driver's --data (empty: train.py's default, the bundled sample)
    train_args: list[str]  # more train.py flags (--hf_dataset)
    note: str


def find_all_the_news(root: Path | None = None) -> list[str]:
    """The All the News CSVs (articles1.csv ...) of an attached Kaggle dataset, wherever it is mounted."""
    return sorted(glob.glob(str((root or KAGGLE_INPUT) / "**" / "articles*.csv"), recursive=True))


def choose_data(data: str, preset: str, out: Path) -> DataChoice:
    """`data`: "auto", a file, folder or glob (several separated by spaces), or "hf:NAME"."""
    if data.startswith("hf:"):
        name = data[3:]
        return DataChoice(
            [],
            ["--hf_dataset", name],
            f"data: the Hugging Face dataset {name} (text column 'text' unless train_args says --text_column)",
        )
    if data and data != "auto":
        paths = shlex.split(data)
        return DataChoice(paths, [], f"data: {' '.join(paths)}")
    found = find_all_the_news()
    if found:
        return DataChoice(found, [], f"data: All the News, {len(found)} file(s) attached: {', '.join(found)}")
    note = (
        "data: no All the News CSVs found (on Kaggle: Add Input > the 'All the News' dataset, or set data "
        "to a path); using the bundled sample of 40 short fictional articles, which checks the machinery, "
        "not learning"
    )
    if preset in ("tiny", "mini"):
        return DataChoice([], [], note)
    # 1024-token blocks: the sample packs into only 8, fewer than one optimizer step of gpt2 takes.
    corpus = out / "sample_repeated.jsonl"
    repeat_sample(corpus, copies=64)
    return DataChoice([str(corpus)], [], note + f", repeated 64 times ({corpus}) to fill 1024-token blocks")


def repeat_sample(target: Path, copies: int) -> None:
    """The bundled sample `copies` times as JSON lines, each copy's articles made distinct by a prefix."""
    import csv

    from data.config import SAMPLE_CSV

    with SAMPLE_CSV.open(newline="", encoding="utf-8") as f:
        articles = [row["content"] for row in csv.DictReader(f)]
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("w", encoding="utf-8") as f:
        for copy in range(copies):
            for text in articles:
                f.write(json.dumps({"text": f"({copy}) {text}"}) + "\n")


# ---------------------------------------------------------------------------------------------
# The all-reduce check


def allreduce_check(processes: int, timeout_s: float = ALLREDUCE_TIMEOUT_S) -> str:
    """Run scripts/allreduce_check.py on `processes` processes; on failure or a hang, again with NCCL's
    peer-to-peer off. Sets NCCL_P2P_DISABLE=1 for the rest of the notebook when that is what worked.
    Returns what happened in one line; raises RuntimeError when both attempts fail."""
    command = [
        *_accelerate_launch(),
        "--config_file",
        str(ROOT / "accelerate_configs" / "ddp.yaml"),
        "--num_processes",
        str(processes),
        str(ROOT / "scripts" / "allreduce_check.py"),
    ]
    first = _run_with_timeout(command, dict(os.environ), timeout_s)
    if first.ok:
        return f"all-reduce over {processes} processes: ok"
    print(
        f"all-reduce over {processes} processes {first.problem}; trying again with NCCL_P2P_DISABLE=1 "
        "(peer-to-peer between two T4s hangs on some Kaggle machines)",
        flush=True,
    )
    second = _run_with_timeout(command, {**os.environ, "NCCL_P2P_DISABLE": "1"}, timeout_s)
    if second.ok:
        os.environ["NCCL_P2P_DISABLE"] = "1"  # inherited by every launch below
        return (
            f"all-reduce over {processes} processes: ok with NCCL_P2P_DISABLE=1, which stays set for the "
            "training runs (GPU-to-GPU traffic then goes through host memory: a little slower)"
        )
    raise RuntimeError(
        f"all-reduce over {processes} processes {second.problem} even with NCCL_P2P_DISABLE=1; "
        f"its output:\n{second.output[-3000:]}"
    )


@dataclass
class _Result:
    ok: bool
    problem: str
    output: str


def _run_with_timeout(command: list[str], env: dict[str, str], timeout_s: float) -> _Result:
    # A session of its own, so that on a hang the launcher and all its workers are killed together.
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        return _Result(False, f"hung (no result after {timeout_s:.0f} s)", output)
    print(output, end="", flush=True)
    if process.returncode != 0:
        return _Result(False, f"failed (exit code {process.returncode})", output)
    return _Result(True, "", output)


def _accelerate_launch() -> list[str]:
    beside = Path(sys.executable).parent / "accelerate"
    return [str(beside), "launch"] if beside.exists() else [sys.executable, "-m", "accelerate.commands.launch"]


# ---------------------------------------------------------------------------------------------
# Weights & Biases


def wandb_setup() -> tuple[bool, str]:
    """Put the W&B key of the platform's secret store (named WANDB_API_KEY) into this process's
    environment, from where the training runs inherit it; the key is never shown.
    Returns (online, one line saying where the key came from or why the runs log offline)."""
    source = _key_from_secrets()
    mode = os.environ.get("WANDB_MODE", "")
    if mode in ("offline", "disabled"):
        return False, f"W&B: {mode} (WANDB_MODE is set)"
    if source:
        return True, f"W&B: online, key from {source}"
    return False, (
        "W&B: offline (no key in the environment, the platform's secrets or a wandb login); "
        "the runs can be uploaded afterwards with wandb sync"
    )


def _key_from_secrets() -> str:
    if os.environ.get(SECRET_NAME):
        return "the environment"
    key, source = None, ""
    if platform_name() == "kaggle":
        try:
            from kaggle_secrets import UserSecretsClient

            key, source = UserSecretsClient().get_secret(SECRET_NAME), "Kaggle secrets"
        except Exception:  # noqa: BLE001 - no secret attached, or no access: offline
            key = None
    elif platform_name() == "colab":
        try:
            from google.colab import userdata

            key, source = userdata.get(SECRET_NAME), "Colab secrets"
        except Exception:  # noqa: BLE001
            key = None
    if key:
        os.environ[SECRET_NAME] = key.strip()
        return source
    from training.records.sinks import wandb_logged_in  # a `wandb login` on this machine (netrc)

    return "wandb login (netrc)" if wandb_logged_in() else ""


def wandb_place(out: Path) -> tuple[str | None, str]:
    """(entity, project) the experiment's runs were logged to, as their config.json records them (train.py's
    --wandb_entity and --wandb_project, which train_args may have set); the entity, when the runs did not
    name one, is WANDB_ENTITY's, else None (the login's default, which only W&B can tell)."""
    from analysis.wandb_report import report_entity, wandb_target

    run_dirs = sorted(path.parent for path in out.glob("runs/*/config.json"))
    return report_entity(None, run_dirs), wandb_target(run_dirs).project


def wandb_group_url(experiment: str, out: Path) -> str | None:
    """The W&B page of the experiment's group in the runs' own entity and project, or None when the
    entity is not recorded and W&B cannot be asked for the login's default."""
    entity, project = wandb_place(out)
    if not entity:
        try:
            import wandb

            entity = wandb.Api(timeout=20).default_entity
        except Exception:  # noqa: BLE001 - offline, no login: the notebook names the group instead
            return None
    return f"https://wandb.ai/{entity}/{project}/groups/{experiment}" if entity else None


# ---------------------------------------------------------------------------------------------
# Expected time, from arithmetic

ESTIMATE_GPU = "T4"  # the reference experiment's GPU, as the planner knows it (planner/gpus.py)
STARTUP_S = 60  # per strategy: start-up, evaluation, checkpoint and export


def _plan_request(preset: str, processes: int, global_batch_tokens: int | None = None) -> PlanRequest:
    """The plan for `processes` T4s: every other setting (precision, MFU, link, overlap) is the planner's
    default, so the notebook's estimate and `python -m planner` agree."""
    from planner.request import PlanRequest

    return PlanRequest(preset=preset, gpu=ESTIMATE_GPU, num_gpus=processes, global_batch_tokens=global_batch_tokens)


def estimate_minutes(preset: str, max_steps: int, strategies: list[str], processes: int) -> dict[str, float]:
    """Minutes per strategy on T4s: the planner's predicted step time (planner/cost_model.step_time at the
    planner's default MFU, the T4's datasheet peak and assumed link, communication overlap as the planner
    assumes by default) for the global batch the driver chooses, times the steps, plus STARTUP_S."""
    from analysis.experiment import ExperimentSpec, choose_batch, preset_defaults
    from planner.plan import hardware, plan_strategy, workload_for

    sizes = [processes if registry.get(s).multi_process else 1 for s in strategies]
    batch = choose_batch(ExperimentSpec(preset, Path("."), max_steps=max_steps), sizes, preset_defaults(preset))
    args = _plan_request(preset, processes, batch.global_batch_tokens)
    hw = hardware(args.gpu, args.precision, args.gpu_memory_gib, args.link_gb_s)
    minutes = {}
    for strategy in strategies:
        plan = plan_strategy(workload_for(args, strategy), strategy, hw, args.assumed_mfu, args.overlap)
        minutes[strategy] = (max_steps * plan["predicted_step_s"] + STARTUP_S) / 60
    return minutes


def estimate_assumptions() -> str:
    """The estimate's assumptions in one line, read from the planner that makes them."""
    from planner.plan import hardware

    args = _plan_request("gpt2", 2)
    hw = hardware(args.gpu, args.precision, args.gpu_memory_gib, args.link_gb_s)
    return (
        f"assumed (the planner's defaults, python -m planner): {args.assumed_mfu:.0%} MFU of the {hw.name}'s "
        f"{hw.peak_flops / 1e12:.0f} TFLOP/s {args.precision}, {hw.link.gb_s:g} GB/s between the GPUs, "
        f"{hw.link_name}; communication overlap: {args.overlap}; {STARTUP_S} s per strategy to start, "
        "evaluate and save"
    )


def expected_time(plan: Plan, devices: Devices) -> str:
    """The estimate for this plan on T4s, or for the reference run (gpt2, 2x T4) when this is not one."""
    lines = [estimate_assumptions()]
    if plan.preset == "gpt2":
        processes = plan.num_processes or 2
        minutes = estimate_minutes(plan.preset, plan.max_steps, plan.strategies, processes)
        where = "1x T4" if plan.num_processes == 1 else "2x T4"
        if devices.count and not devices.all_t4:
            where += f" (these GPUs are {devices.gpus[0]['name']}: expect other times)"
    else:
        minutes = estimate_minutes("gpt2", DEFAULT_STEPS["gpt2"], list(registry.reference_names()), 2)
        where = f"2x T4 for the gpt2 preset at {DEFAULT_STEPS['gpt2']} steps (this {plan.preset} run is far shorter)"
    per_strategy = ", ".join(f"{s} {m:.0f} min" for s, m in minutes.items())
    lines.insert(
        0,
        f"expected on {where}: {per_strategy}; {sum(minutes.values()):.0f} min in all, "
        "plus tokenizing the corpus once (a few minutes for All the News)",
    )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Running the driver and reading its report


def experiment_spec(
    plan: Plan, out: Path, name: str, data: DataChoice, train_args: str = "", wandb_report: bool = False
) -> ExperimentSpec:
    """The experiment of the plan, as the driver takes it. `wandb_report`: also build the W&B report at the end
    (the notebook asks for it when W&B is online)."""
    from analysis.experiment import ExperimentSpec  # the project's requirements are installed by now

    multi_process = any(registry.get(s).multi_process for s in plan.strategies)
    return ExperimentSpec(
        preset=plan.preset,
        out=out,
        max_steps=plan.max_steps,
        experiment=name,
        strategies=tuple(plan.strategies),
        num_processes=plan.num_processes if multi_process else None,
        data=tuple(data.paths),
        wandb_report=wandb_report,
        extra=(*data.train_args, *shlex.split(train_args)),
    )


def experiment_command(spec: ExperimentSpec) -> list[str]:
    """`python -m analysis.experiment` with the flags that give `spec` back (the defaults left out).

    The driver runs in a process of its own rather than in the kernel: it passes the launches' output through as
    bytes, which a kernel's stdout does not take, and a driver that fails or is interrupted leaves the kernel as
    it was."""
    from training.cli import command_line

    return [sys.executable, "-m", "analysis.experiment", *command_line(spec)]


def run_driver(spec: ExperimentSpec) -> int:
    """Run the experiment of `spec`, its command printed first (to repeat it in a shell) and its output streamed;
    the driver's exit code."""
    command = experiment_command(spec)
    print(shlex.join(command), flush=True)
    return stream(command)


def stream(command: list[str]) -> int:
    """Run `command` in the project folder, printing its output as it comes; returns the exit code."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            print(line, end="", flush=True)
        return process.wait()


def report_section(report_md: Path, title: str) -> str:
    """One `## title` section of report.md, without its heading."""
    match = re.search(
        rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", report_md.read_text(encoding="utf-8"), re.MULTILINE | re.DOTALL
    )
    return match.group(1).strip() if match else ""
