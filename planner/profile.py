"""The machine profile: what `python -m planner measure` (planner/measure.py) found this machine does, which the
planner predicts from instead of an assumed MFU.

It holds, per model preset, micro-batch, precision and number of processes computing at once (each with its
torch threads), the MFU of one micro-batch's forward and backward against one process's peak and the rate of
AdamW's element-wise passes on the host; and, per number of processes, the link between them (the
all-reduce, and what a sharding run's all-gathers, reduce-scatters and FSDP2's per-unit calls cost), in the
fields a run's config.json used to record (training/records/record.py LinkRecord). One file per machine (CPU
model, logical CPUs, torch version, GPU), under the cache folder's hardware/, next to the CPU peak that runs
divide their MFU by. A later measurement adds to the file: what it measured again replaces the earlier figure.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from planner.errors import PlanError
from training.durable import write_atomic

PROFILE_VERSION = 1
MEASURE_COMMAND = "python -m planner measure"


@dataclass(frozen=True)
class ComputeRate:
    """What `processes` processes computing at once each reach on one micro-batch of `preset`: the slowest
    process's (a run's ranks wait for the slowest at every collective)."""

    preset: str
    processes: int
    threads: int  # torch threads of each process
    precision: str  # of the forward and backward: fp32, or fp16/bf16 under autocast on a GPU
    device: str  # cpu, or the GPU's name (one GPU per process)
    micro_batch_size: int
    block_size: int
    mfu: float  # of `peak_flops`, one process's peak at `threads` threads (a GPU's datasheet figure)
    peak_flops: float
    adamw_gb_s: float  # AdamW's element-wise passes on the host, with `threads` threads

    @property
    def layout(self) -> tuple[str, int, int, str]:
        return (self.preset, self.processes, self.threads, self.precision)


@dataclass(frozen=True)
class MachineProfile:
    machine: dict[str, Any]  # what the figures depend on (machine_key)
    measured_at: str  # UTC, ISO 8601: the latest measurement added
    compute: tuple[ComputeRate, ...]
    links: dict[str, dict[str, Any]] = field(default_factory=dict)  # str(processes) -> a LinkRecord's fields
    version: int = PROFILE_VERSION

    def compute_for(
        self, preset: str | None, processes: int, threads: int, precision: str = "fp32"
    ) -> ComputeRate | None:
        """The rate measured for this preset, process count, thread count and precision; None when it was not."""
        return next((c for c in self.compute if c.layout == (preset, processes, threads, precision)), None)

    def link_for(self, processes: int) -> dict[str, Any] | None:
        """The link measured between `processes` processes; None when it was not."""
        return self.links.get(str(processes))

    def merged(self, newer: MachineProfile) -> MachineProfile:
        """This profile with `newer`'s figures added, each of them replacing the one measured for its layout."""
        kept = tuple(c for c in self.compute if c.layout not in {n.layout for n in newer.compute})
        return replace(newer, compute=kept + newer.compute, links={**self.links, **newer.links})

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "compute": [asdict(c) for c in self.compute]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MachineProfile:
        rates = tuple(ComputeRate(**c) for c in data["compute"])
        if not all(_finite(c.mfu) and _finite(c.peak_flops) and _finite(c.adamw_gb_s) for c in rates):
            raise ValueError("a compute rate that is not a positive number")
        return cls(
            machine=dict(data["machine"]),
            measured_at=str(data["measured_at"]),
            compute=rates,
            links={str(k): dict(v) for k, v in data["links"].items()},
            version=int(data["version"]),
        )


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def machine_key(device_name: str = "cpu") -> dict[str, Any]:
    """What a profile's figures depend on: another CPU, core count, torch or GPU is another machine. The host
    name is not in it: a container or notebook session gets a new one on the same hardware."""
    import torch

    from training.records.peaks import cpu_model_name

    return {
        "cpu_model": cpu_model_name(),
        "logical_cpus": os.cpu_count(),
        "torch_version": torch.__version__,
        "device": device_name,
    }


def profile_path(cache_dir: Path, key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return Path(cache_dir) / "hardware" / f"machine_profile_{digest}.json"


def default_profile_path(device_name: str = "cpu") -> Path:
    from training.records.peaks import default_cache_dir

    return profile_path(default_cache_dir(), machine_key(device_name))


def write_profile(path: Path, profile: MachineProfile) -> MachineProfile:
    """Add `profile` to the one at `path` (a missing or unreadable one is replaced); the profile written."""
    try:
        profile = read_profile(path).merged(profile)
    except PlanError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(profile.to_dict(), indent=2) + "\n")
    return profile


def read_profile(path: Path) -> MachineProfile:
    """The profile at `path`; PlanError (one line) when it is missing, unreadable or of another version."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlanError(f"no machine profile at {path}: {MEASURE_COMMAND} writes one") from None
    except (OSError, ValueError) as exc:
        raise PlanError(f"{path}: cannot be read as a machine profile ({exc})") from None
    if not isinstance(data, dict) or data.get("version") != PROFILE_VERSION:
        found = data.get("version") if isinstance(data, dict) else None
        raise PlanError(
            f"{path}: machine profile version {found!r}, expected {PROFILE_VERSION}: {MEASURE_COMMAND} again"
        )
    try:
        return MachineProfile.from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise PlanError(f"{path}: not a machine profile ({type(exc).__name__}: {exc})") from None


def age_note(profile: MachineProfile, run_started: str | None) -> str:
    """When the profile was measured against when the run started: a machine changes (a driver, a neighbour's
    load), so a profile measured long before or after a run is told as such."""
    when = f"measured {profile.measured_at}"
    try:
        measured = datetime.fromisoformat(profile.measured_at.replace("Z", "+00:00"))
        started = datetime.fromisoformat(str(run_started).replace("Z", "+00:00"))
    except ValueError:
        return when
    hours = (started - measured).total_seconds() / 3600
    span = f"{abs(hours):.1f} hour(s)" if abs(hours) < 48 else f"{abs(hours) / 24:.0f} day(s)"
    if hours >= 0:
        return f"{when}, older than the run: {span} before it started"
    return f"{when}, {span} after the run started"
