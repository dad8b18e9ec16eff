"""The plan's wall time for a whole experiment, said before it launches and set against the runs after.

The planner (planner/plan.py) predicts each strategy's optimizer step time at the experiment's batch on the
GPU given (`--gpu`, its datasheet peak, at the planner's default MFU) or, without one, on this machine's CPU
at the MFU, peak, AdamW rate and link its profile measured per process count (`python -m planner measure`). The experiment's prediction is the sum over
strategies of step time x steps x runs (seeds x repeats): training steps only, so start-up, evaluation and
checkpoints come on top. It is written to OUT/prediction.json, which the report reads back beside the runs'
training times (summary.json total.train_time_s) and the wall time they took (runs/order.json).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from training.durable import write_atomic

PREDICTION_FILE = "prediction.json"
ORDER_FILE = Path("runs") / "order.json"
CPU_PROCESS = "CPU process"  # the planner's name for one CPU process standing in for a device


@dataclass(frozen=True)
class Planned:
    """What the experiment runs of one strategy: its processes, steps and runs."""

    strategy: str
    world_size: int
    steps: int
    runs: int


@dataclass(frozen=True)
class Prediction:
    """The plan's step time of each strategy and the experiment's predicted training time, with its basis."""

    basis: str  # the hardware and assumptions, in words
    step_s: dict[str, float]  # strategy -> predicted optimizer step time
    seconds: dict[str, float]  # strategy -> step time x steps x runs
    runs: dict[str, int] = field(default_factory=dict)  # strategy -> runs

    @property
    def total_s(self) -> float:
        return sum(self.seconds.values())

    def line(self) -> str:
        """'predicted wall time: 12.3 s of training steps (single 4.1 s, ...) on ...; start-up ... on top'."""
        parts = ", ".join(f"{name} {_duration(seconds)}" for name, seconds in self.seconds.items())
        return (
            f"predicted wall time: {_duration(self.total_s)} of training steps ({parts}) on {self.basis}; "
            "start-up, evaluation and checkpoints come on top"
        )


def _duration(seconds: float) -> str:
    """Three significant figures under two minutes (a tiny model's step is milliseconds), then minutes, hours."""
    if seconds < 120:
        return f"{seconds:.3g} s"
    return f"{seconds / 60:,.1f} min" if seconds < 7200 else f"{seconds / 3600:,.1f} h"


def cpu_threads() -> int:
    """Torch threads of each launched process: `accelerate launch` gives one unless OMP_NUM_THREADS says."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else 1


def hardware_for(gpu: str | None, memory_gib: float | None, precision: str) -> tuple[Any, str]:
    """The planner's hardware and its description: the GPU named, else this CPU's processes as this machine's
    profile measured them (`python -m planner measure`; PlanError, one line, when there is none)."""
    from planner.plan import hardware

    if gpu is not None:
        hw = hardware(gpu, precision, memory_gib, None)
        return hw, f"{hw.name} ({precision}, {hw.peak_flops / 1e12:,.1f} TFLOP/s peak, link {hw.link_name})"
    from planner.profile import default_profile_path, read_profile

    path = default_profile_path()
    profile = read_profile(path)
    cpu = hardware(None, "fp32", memory_gib or 1.0, None)  # the memory only sizes fits, unused here
    # The peak and link are per process count: predict() takes them from the profile for each strategy.
    return (
        replace(cpu, name=CPU_PROCESS, peak_flops=0.0, reserve_gib=0.0, link_name=str(path)),
        f"this CPU (fp32, {cpu_threads()} thread(s) per process, as the machine profile {path} measured it on "
        f"{profile.measured_at})",
    )


def predict(plans: list[Planned], workload_args: dict[str, Any], hw: Any, basis: str) -> Prediction | None:
    """Each strategy's planned step time (planner.plan.plan_strategy) x its steps and runs; None when the
    hardware has no peak FLOP/s (a GPU given only by its memory). On this CPU each strategy is priced at the
    MFU, peak, AdamW rate and link the machine profile measured for its process count."""
    from planner.plan import plan_strategy, workload_for
    from planner.request import DEFAULT_MFU, PlanRequest

    if not math.isfinite(hw.peak_flops):
        return None
    profile = _profile_of(hw)
    step_s, seconds, runs = {}, {}, {}
    for item in plans:
        args = PlanRequest(num_gpus=item.world_size, **workload_args)
        w = workload_for(args, item.strategy)
        priced, mfu = hw, DEFAULT_MFU
        if hw.name == CPU_PROCESS:  # what a CPU process runs: fp32 and torch's per-tensor (unfused) AdamW
            w = replace(w, precision="fp32", fused_adamw=False, device="cpu")
            priced, mfu = _profiled_cpu(hw, profile, workload_args["preset"], item.world_size)
        step_s[item.strategy] = plan_strategy(w, item.strategy, priced, mfu, "full")["predicted_step_s"]
        seconds[item.strategy] = step_s[item.strategy] * item.steps * item.runs
        runs[item.strategy] = item.runs
    assumed = "" if hw.name == CPU_PROCESS else f", MFU {DEFAULT_MFU:g} assumed"
    return Prediction(f"{basis}{assumed}", step_s, seconds, runs)


def _profile_of(hw: Any) -> Any:
    """The machine profile a CPU hardware names (hardware_for), read once for every strategy; None for a GPU."""
    from planner.profile import read_profile

    return read_profile(Path(hw.link_name)) if hw.name == CPU_PROCESS else None


def _profiled_cpu(hw: Any, profile: Any, preset: str, processes: int) -> tuple[Any, float]:
    """The CPU hardware for `processes` processes of `preset` from the machine profile hw names, and its MFU."""
    from planner.errors import PlanError
    from planner.plan import link_from_record
    from planner.profile import MEASURE_COMMAND

    rate = profile.compute_for(preset, processes, cpu_threads())
    if rate is None:
        raise PlanError(
            f"the machine profile has no compute rate for {preset} on {processes} process(es) of {cpu_threads()} "
            f"thread(s): {MEASURE_COMMAND} --presets {preset} --processes {processes}"
        )
    link = hw.link
    if processes > 1:
        record = profile.link_for(processes)
        if record is None:
            raise PlanError(
                f"the machine profile has no link between {processes} processes: {MEASURE_COMMAND} --processes {processes}"
            )
        link = link_from_record(record)
    return replace(hw, peak_flops=rate.peak_flops, link=replace(link, host_update_gb_s=rate.adamw_gb_s)), rate.mfu


def write_prediction(out: Path, prediction: Prediction) -> Path:
    path = out / PREDICTION_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, (json.dumps({**asdict(prediction), "total_s": prediction.total_s}, indent=2) + "\n").encode())
    return path


def read_prediction(out: Path) -> dict[str, Any] | None:
    """OUT/prediction.json as written before the experiment launched; None when absent or unreadable."""
    try:
        value = json.loads((out / PREDICTION_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) and isinstance(value.get("seconds"), dict) else None


def measured_lines(prediction: dict[str, Any], train_s: dict[str, float], wall_s: float | None) -> list[str]:
    """The report's line: predicted training time against the runs' (per strategy and in all), and the wall
    time the runs took with start-up, evaluation and checkpoints."""
    predicted = {name: float(s) for name, s in prediction["seconds"].items()}
    shared = [name for name in predicted if name in train_s]
    if not shared:
        return []
    parts = ", ".join(
        f"{name} {_duration(predicted[name])} predicted, {_duration(train_s[name])} measured "
        f"({train_s[name] / predicted[name]:.2f}x)"
        for name in shared
        if predicted[name] > 0
    )
    total_p, total_m = sum(predicted[n] for n in shared), sum(train_s[n] for n in shared)
    wall = f"; the runs took {_duration(wall_s)} of wall time in all (runs/order.json)" if wall_s else ""
    return [
        f"Plan against measurement (training steps; {prediction.get('basis', 'basis not recorded')}): {parts}; "
        f"in all {_duration(total_p)} predicted, {_duration(total_m)} measured{wall}."
    ]


def experiment_wall_s(out: Path) -> float | None:
    """The summed wall time of the experiment's runs, as runs/order.json records each."""
    try:
        rows = json.loads((out / ORDER_FILE).read_text(encoding="utf-8"))["runs"]
        return float(sum(row["seconds"] for row in rows))
    except (OSError, ValueError, KeyError, TypeError):
        return None
