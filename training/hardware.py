"""Facts about the device: peak FLOP/s for MFU, and peak memory readings.

MFU divides the achieved FLOP/s by a peak, so the peak must be the same number whenever the hardware is
the same, or MFU figures of two runs cannot be compared. GPUs take their peak from a table keyed on the
exact product name. CPUs have no datasheet figure that a framework reaches, so their peak is a measured
fp32 matmul rate, taken per machine, thread count and torch version with a repeatable method and kept
in a cache file that every later run reads. Other work on the machine can only slow a measurement down,
so the cache keeps the best measurement seen, and a measurement whose trials spread widely (a sign that
something else ran during it) is taken again.

`python -m training.hardware [--cache_dir DIR] [--remeasure]` prints this machine's CPU figure.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from training.cli import run_main
from training.durable import write_atomic
from training.gpu_peaks import datasheet_entry


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
        """The run record's peak fields (training.record.LaunchRecord): the figure, its source, when it was
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
    cached fp32 matmul rate of this process's threads on this CPU (cpu_peak_flops), whatever the
    precision, since CPU training here runs in fp32. cache_dir defaults to the data cache's folder.
    """
    if device.type == "cuda":
        return gpu_peak_flops(torch.cuda.get_device_name(device), precision)
    return cpu_peak_flops(default_cache_dir() if cache_dir is None else Path(cache_dir))


def default_cache_dir() -> Path:
    """The project's cache folder, the one the packed data uses ($GPT2S_CACHE or ~/.cache/gpt2-strategies)."""
    from data.config import default_cache_dir as data_default  # deferred: the data package imports datasets

    return data_default()


# ---------------------------------------------------------------------------------------------------
# GPUs: datasheet figures by exact product name (the table is in training/gpu_peaks.py, which needs no torch)


def gpu_peak_flops(device_name: str, precision: str) -> PeakFlops:
    """Datasheet peak FLOP/s of the GPU named exactly device_name (up to case and surrounding spaces)."""
    entry = datasheet_entry(device_name)
    if entry is None or precision not in entry[2]:
        return PeakFlops(
            float("nan"),
            f"no peak-FLOP/s entry for {device_name!r} at {precision}: MFU not computed (add it to training/gpu_peaks.py)",
        )
    name, datasheet, figures = entry
    tflops = figures[precision]
    return PeakFlops(tflops * 1e12, f"table: {name} {precision} {tflops:g} TFLOP/s dense ({datasheet})")


# ---------------------------------------------------------------------------------------------------
# CPUs: a measured fp32 matmul rate, taken once per machine and thread count and cached

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


def measure_cpu_matmul_rates(
    n: int = CPU_MATMUL_SIZE, trials: int = CPU_TRIALS, trial_s: float = CPU_TRIAL_S, warmup_s: float = CPU_WARMUP_S
) -> list[float]:
    """FLOP/s of each of `trials` timed trials of n x n fp32 matmuls, with this process's torch threads.

    Each trial repeats the product until trial_s has passed (at least once) and counts 2 n^3 FLOPs per
    product, after warmup_s of the same work (thread pool, caches, clocks). The operands come from a
    private generator: the global RNG, which an exact resume depends on, is left as it was.
    """
    gen = torch.Generator().manual_seed(0)
    a = torch.rand(n, n, generator=gen)
    b = torch.rand(n, n, generator=gen)
    out = torch.empty(n, n)

    def products_for(seconds: float) -> tuple[int, float]:
        count, start = 0, time.perf_counter()
        while True:
            torch.mm(a, b, out=out)
            count += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                return count, elapsed

    products_for(warmup_s)
    rates = []
    for _ in range(trials):
        count, elapsed = products_for(trial_s)
        rates.append(2 * n**3 * count / elapsed)
    return rates


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


def cpu_peak_flops(cache_dir: Path, threads: int | None = None, remeasure: bool = False) -> PeakFlops:
    """The fp32 matmul rate of one process on this CPU with `threads` torch threads, as its peak FLOP/s.

    threads defaults to the process's current torch thread count, the one training runs with. A
    measurement is 9 trials (about 2 s: measure_cpu_matmul_rates) and its figure the median trial. The
    file under cache_dir/hardware keeps, per machine, thread count and torch version, the best measurement
    seen, since a peak is what the machine can do and other work only lowers a measurement. A call
    measures when there is no valid figure yet, when the kept figure's trials spread widely (more than
    CPU_SPREAD_LIMIT), or on remeasure; it measures up to CPU_MAX_MEASUREMENTS times while the spread
    stays wide, and a new figure replaces the kept one only when higher. Processes measuring at once
    would slow each other's trials down, so they take turns (one lock for the folder), and one that
    waited while another measured takes that figure: the ranks of a launch divide by the same peak.
    Nothing global is left changed: torch's thread count is restored and the global RNG is not used.
    """
    current = torch.get_num_threads()
    threads = current if threads is None else threads
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    key = cpu_cache_key(threads)
    path = cpu_cache_path(cache_dir, key)
    seen = _read_cpu_entry(path, key)
    if not remeasure and _settled(seen):
        return _cpu_peak(seen, f"cached {path}", cached=True)
    with _exclusive(path.parent / "cpu_peak.lock"):
        now = _read_cpu_entry(path, key)
        if not remeasure and now is not None and (now != seen or _settled(now)):
            return _cpu_peak(now, f"cached {path}", cached=True)  # measured by another process meanwhile
        taken = _measure_while_wide(threads, current)
        entry = _kept_entry(key, now, taken)
        where = _save_entry(path, entry)
    return _cpu_peak(entry, where, cached=False, taken=len(taken))


def _settled(entry: dict[str, Any] | None) -> bool:
    """A valid cached figure whose trials did not spread widely: used as it is, not measured again."""
    return entry is not None and not spread_is_wide(_relative_spread(entry))


def _relative_spread(measurement: dict[str, Any]) -> float:
    """Computed from the figures rather than read, so a file written under another limit is judged anew."""
    return (measurement["max_flops_per_s"] - measurement["min_flops_per_s"]) / measurement["flops_per_s"]


def _measure_while_wide(threads: int, current: int) -> list[dict[str, Any]]:
    """Measurements with `threads` torch threads, up to CPU_MAX_MEASUREMENTS, until one spreads narrowly."""
    if threads != current:
        torch.set_num_threads(threads)
    try:
        taken = [_measurement(measure_cpu_matmul_rates())]
        while spread_is_wide(taken[-1]["relative_spread"]) and len(taken) < CPU_MAX_MEASUREMENTS:
            taken.append(_measurement(measure_cpu_matmul_rates()))
        return taken
    finally:
        if torch.get_num_threads() != current:
            torch.set_num_threads(current)


# The fields of one measurement, as the cache file's top level holds the kept one.
MEASUREMENT_FIELDS = (
    "flops_per_s",
    "min_flops_per_s",
    "max_flops_per_s",
    "relative_spread",
    "trial_flops_per_s",
    "measured_at",
)


def _measurement(rates: list[float]) -> dict[str, Any]:
    median = statistics.median(rates)
    return {
        "flops_per_s": median,
        "min_flops_per_s": min(rates),
        "max_flops_per_s": max(rates),
        "relative_spread": (max(rates) - min(rates)) / median,
        "trial_flops_per_s": rates,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _kept_entry(key: dict[str, Any], cached: dict[str, Any] | None, taken: list[dict[str, Any]]) -> dict[str, Any]:
    """The cache entry after `taken`: the best measurement of the cached one and those, and how many were seen.

    Best is the highest median: other work on the machine only slows a measurement down, never speeds it up.
    """
    candidates = ([cached] if cached is not None else []) + taken
    best = max(candidates, key=lambda m: m["flops_per_s"])  # the first of equal ones: the cached figure stays
    kept = {name: best[name] for name in MEASUREMENT_FIELDS if name in best}
    kept["relative_spread"] = _relative_spread(best)
    seen_before = 0 if cached is None else int(cached.get("measurements", 1))
    latest = taken[-1]
    return {
        "key": key,
        **kept,
        "spread_wide": spread_is_wide(kept["relative_spread"]),
        "measurements": seen_before + len(taken),
        "latest": {name: latest[name] for name in ("flops_per_s", "relative_spread", "measured_at")},
    }


def _save_entry(path: Path, entry: dict[str, Any]) -> str:
    """Write the entry; where it went, for the source line (an unwritable cache is a note, not an error)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(entry, indent=2) + "\n")
    except OSError as e:
        return f"not cached ({e})"
    return f"saved to {path}"


def _read_cpu_entry(path: Path, key: dict[str, Any]) -> dict[str, Any] | None:
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


def _cpu_peak(entry: dict[str, Any], where: str, cached: bool, taken: int = 0) -> PeakFlops:
    key, rate = entry["key"], entry["flops_per_s"]
    low, high = entry["min_flops_per_s"], entry["max_flops_per_s"]
    n, threads = key["method"]["matmul_size"], key["torch_threads"]
    seen = entry.get("measurements", 1)
    best_of = f", best of {seen} measurements" if seen > 1 else ""
    wide = (
        f", trials spread over {CPU_SPREAD_LIMIT:.0%} (likely disturbed: measured again by the next run)"
        if spread_is_wide(_relative_spread(entry))
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


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive lock on lock_path, where the platform and file system allow one; else go on."""
    try:
        import fcntl

        lock_path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(lock_path, "a")  # noqa: SIM115 -- closed below
    except (ImportError, OSError):
        handle = None
    if handle is None:
        yield
        return
    with handle:
        with contextlib.suppress(OSError):
            fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes
        yield


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so a perf_counter difference measures the work itself."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


MIB = 2**20


def peak_memory_mib(device: torch.device) -> tuple[float, float]:
    """(peak allocated, peak reserved) in MiB since the last reset.

    On CPU both are the process's peak resident set size, which the OS cannot reset: on CPU the
    per-epoch figure is the peak since the process started.
    """
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / MIB, torch.cuda.max_memory_reserved(device) / MIB
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss_bytes = rss if sys.platform == "darwin" else rss * 1024  # Linux reports KiB, macOS bytes
    return rss_bytes / MIB, rss_bytes / MIB


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m training.hardware",
        description="This machine's CPU peak FLOP/s for MFU at the current torch thread count "
        "(OMP_NUM_THREADS): the best measurement seen, cached; measured again while its trials "
        f"spread more than {CPU_SPREAD_LIMIT:.0%}.",
    )
    parser.add_argument(
        "--cache_dir",
        type=Path,
        default=None,
        help="cache folder; the figure goes under DIR/hardware (default: $GPT2S_CACHE or "
        "~/.cache/gpt2-strategies, as the data cache)",
    )
    parser.add_argument(
        "--remeasure",
        action="store_true",
        help="measure again now; the cached figure is replaced when the new one is higher "
        "(a busy machine only lowers a measurement; delete the file to start over)",
    )
    args = parser.parse_args(argv)
    peak = cpu_peak_flops(default_cache_dir() if args.cache_dir is None else args.cache_dir, remeasure=args.remeasure)
    print(
        f"{peak.flops_per_s / 1e9:.1f} GFLOP/s per process, relative spread {peak.relative_spread:.1%}"
        f"{' (wide)' if peak.spread_wide else ''}, measured {peak.measured_at}"
        + (f"; {peak.measurements} measurement(s) taken now" if peak.measurements else "")
    )
    print(peak.source)
    return 0


if __name__ == "__main__":
    run_main(main)
