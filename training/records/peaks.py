"""The peak FLOP/s a run's MFU divides by: a GPU's datasheet figure, or this CPU's measured matmul rate read from
the cache that `python -m planner measure` writes (planner/cpu_peak.py). A run measures nothing itself: on a CPU
with no cached figure its MFU is not computed, and its start line says how to measure one.

MFU divides the achieved FLOP/s by a peak, so the peak must be the same number whenever the hardware is the
same, or MFU figures of two runs cannot be compared. GPUs take their peak from a table keyed on the exact
product name. CPUs have no datasheet figure that a framework reaches, so their peak is a measured fp32 matmul
rate, per machine, thread count and torch version, kept in a cache file that every later run reads.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class PeakFlops:
    """Peak FLOP/s of one device, and how the figure was obtained."""

    flops_per_s: float  # per device; nan when unknown, and then MFU is not computed
    source: str  # one readable line: the table entry, or the measurement and where it is cached
    spread: tuple[float, float] | None = None  # (slowest, fastest) trial rate of a measurement, FLOP/s
    cached: bool = False  # True when a measurement was read from the cache rather than taken now
    measured_at: str | None = None  # UTC time of the kept measurement (ISO 8601); None for a table figure
    measurements: int = 0  # measurements this call took (0 when read from the cache or the table)

    @property
    def relative_spread(self) -> float | None:
        """(fastest - slowest trial) / the figure, for a measurement; None for a table figure."""
        if self.spread is None or not self.flops_per_s > 0:
            return None
        return (self.spread[1] - self.spread[0]) / self.flops_per_s

    def launch_fields(self) -> dict[str, Any]:
        """The run record's peak fields (training.records.record.LaunchRecord): the figure, its source, when it was
        measured and its trials' relative spread, so a report can tell runs divided by different peaks."""
        return {
            "peak_flops_per_device": self.flops_per_s,
            "peak_flops_source": self.source,
            "peak_flops_measured_at": self.measured_at,
            "peak_flops_relative_spread": self.relative_spread,
        }

    @property
    def spread_wide(self) -> bool:
        """True for a measurement whose trials spread more than CPU_SPREAD_LIMIT: it was likely disturbed."""
        relative = self.relative_spread
        return relative is not None and spread_is_wide(relative)


def peak_flops(device: torch.device, precision: str, cache_dir: Path | None = None) -> PeakFlops:
    """Peak FLOP/s of one device at the training precision (fp32 | fp16 | bf16).

    CUDA devices: the datasheet figure of the exact product (gpu_peak_flops). Any other device: the
    cached fp32 matmul rate of this process's threads on this CPU (cached_cpu_peak), whatever the
    precision, since CPU training here runs in fp32. cache_dir defaults to the data cache's folder.
    """
    if device.type == "cuda":
        return gpu_peak_flops(torch.cuda.get_device_name(device), precision)
    return cached_cpu_peak(default_cache_dir() if cache_dir is None else Path(cache_dir))


def default_cache_dir() -> Path:
    """The project's cache folder, the one the packed data uses ($GPT2S_CACHE or ~/.cache/gpt2-strategies)."""
    from data.config import default_cache_dir as data_default  # deferred: the data package imports datasets

    return data_default()


# ---------------------------------------------------------------------------------------------------
# GPUs: datasheet figures by exact product name (the table is in training/records/gpu_peaks.py, which needs no torch)


def gpu_peak_flops(device_name: str, precision: str) -> PeakFlops:
    """Datasheet peak FLOP/s of the GPU named exactly device_name (up to case and surrounding spaces)."""
    from training.records.gpu_peaks import datasheet_entry  # only a GPU needs the table

    entry = datasheet_entry(device_name)
    if entry is None or precision not in entry[2]:
        return PeakFlops(
            float("nan"),
            f"no peak-FLOP/s entry for {device_name!r} at {precision}: MFU not computed (add it to training/records/gpu_peaks.py)",
        )
    name, datasheet, figures = entry
    tflops = figures[precision]
    return PeakFlops(tflops * 1e12, f"table: {name} {precision} {tflops:g} TFLOP/s dense ({datasheet})")


# 1024x1024 fp32 products: one is 2 * 1024^3 = 2.1 GFLOP over 12 MiB of operands, about 170 FLOP per
# byte, far above any CPU's FLOP-per-byte balance, so the BLAS kernel is compute-bound, not waiting on
# memory. Per-call costs (waking the thread pool, packing panels) are small next to that much work, which
# they are not at 512 (a few ms per product); and one product takes tens of ms on one core (35-50 ms on
# this project's 2-core machines), so a 0.2 s trial holds several, which it would not at 2048 (about
# 0.3 s per product there).
CPU_MATMUL_SIZE = 1024
CPU_TRIALS = 9
CPU_TRIAL_S = 0.2
CPU_WARMUP_S = 0.3

# On a quiet machine of this project's kind the trials of one measurement (2 threads) lie within 138-165
# GFLOP/s, a relative spread of 18%; measured while other work ran they lay within 31-74 (87%), and 34-72%
# on a shared 2-core machine. 25% lets a quiet machine's own jitter through without measuring every run
# twice and catches those. A steady load can slow every trial alike (a narrow spread at half the rate was
# seen too), which no spread limit catches: keeping the best measurement seen is what protects against it.
CPU_SPREAD_LIMIT = 0.25
# A call measures at most this many times while the spread stays wide (about 2 s each), so a run on a busy
# machine waits at most about 6 s; a figure still wide is measured again by the next call.
CPU_MAX_MEASUREMENTS = 3


def spread_is_wide(relative_spread: float) -> bool:
    """(fastest - slowest trial) / median above CPU_SPREAD_LIMIT: something else likely ran during the trials."""
    return relative_spread > CPU_SPREAD_LIMIT


def cpu_model_name() -> str:
    """The CPU model as /proc/cpuinfo names it, else platform.processor(), else the architecture."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
        for line in f:
            field, _, value = line.partition(":")
            if field.strip() == "model name" and value.strip():
                return value.strip()
    return platform.processor() or platform.machine() or "unknown"


def cpu_cache_key(threads: int) -> dict[str, Any]:
    """What a CPU figure depends on; a cached figure is used only when all of it matches."""
    return {
        "cpu_model": cpu_model_name(),
        "logical_cpus": os.cpu_count(),
        "torch_threads": threads,
        "torch_version": torch.__version__,
        "dtype": "fp32",
        "method": {
            "matmul_size": CPU_MATMUL_SIZE,
            "trials": CPU_TRIALS,
            "trial_s": CPU_TRIAL_S,
            "warmup_s": CPU_WARMUP_S,
            "figure": "median",
        },
    }


def cpu_cache_path(cache_dir: Path, key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return Path(cache_dir) / "hardware" / f"cpu_peak_{key['torch_threads']}t_{digest}.json"


def cached_cpu_peak(cache_dir: Path, threads: int | None = None) -> PeakFlops:
    """The cached fp32 matmul rate of one process on this CPU with `threads` torch threads (default: this
    process's), as `python -m planner measure` (planner/cpu_peak.py) keeps it; nan, with the command that
    measures it, when there is none. Nothing is measured here: a run starts without a benchmark."""
    threads = torch.get_num_threads() if threads is None else threads
    key = cpu_cache_key(threads)
    path = cpu_cache_path(cache_dir, key)
    entry = read_cpu_entry(path, key)
    if entry is None:
        return PeakFlops(
            float("nan"),
            f"no measured peak for this CPU at {threads} thread(s) in {path.parent}: MFU not computed "
            "(python -m planner measure measures it)",
        )
    return cpu_peak_from_entry(entry, f"cached {path}", cached=True)


def relative_spread(measurement: dict[str, Any]) -> float:
    """Computed from the figures rather than read, so a file written under another limit is judged anew."""
    return (measurement["max_flops_per_s"] - measurement["min_flops_per_s"]) / measurement["flops_per_s"]


def read_cpu_entry(path: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """The cached entry for key, or None when the file is missing, unreadable, for another key or invalid.

    Files written before the best was kept (no "measurements") hold one measurement and read as such.
    """
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
        rates = entry["trial_flops_per_s"]
        figures = [entry["flops_per_s"], entry["min_flops_per_s"], entry["max_flops_per_s"], *rates]
        seen = entry.get("measurements", 1)
        valid = (
            entry["key"] == key
            and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0 for x in figures
            )
            and len(rates) >= 1
            and entry["min_flops_per_s"] == min(rates)
            and entry["max_flops_per_s"] == max(rates)
            and entry["flops_per_s"] == statistics.median(rates)
            and isinstance(seen, int)
            and not isinstance(seen, bool)
            and seen >= 1
        )
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    return entry if valid else None


def cpu_peak_from_entry(entry: dict[str, Any], where: str, cached: bool, taken: int = 0) -> PeakFlops:
    key, rate = entry["key"], entry["flops_per_s"]
    low, high = entry["min_flops_per_s"], entry["max_flops_per_s"]
    n, threads = key["method"]["matmul_size"], key["torch_threads"]
    seen = entry.get("measurements", 1)
    best_of = f", best of {seen} measurements" if seen > 1 else ""
    wide = (
        f", trials spread over {CPU_SPREAD_LIMIT:.0%} (likely disturbed: python -m planner measure takes it again)"
        if spread_is_wide(relative_spread(entry))
        else ""
    )
    source = (
        f"measured: fp32 {n}x{n} matmul, {threads} thread{'s' if threads != 1 else ''}, median of "
        f"{len(entry['trial_flops_per_s'])} trials {rate / 1e9:.1f} GFLOP/s "
        f"(spread {low / 1e9:.1f}-{high / 1e9:.1f}){best_of}{wide}, {where}"
    )
    return PeakFlops(
        float(rate),
        source,
        spread=(float(low), float(high)),
        cached=cached,
        measured_at=entry.get("measured_at"),
        measurements=taken,
    )
