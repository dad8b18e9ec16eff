"""This machine's CPU peak FLOP/s for MFU: the fp32 matmul rate, measured with a repeatable method and cached
per machine, thread count and torch version (training/records/peaks.py reads it; runs never measure it).
Other work on the machine can only slow a measurement down, so the cache keeps the best measurement seen, and
a measurement whose trials spread widely (a sign that something else ran during it) is taken again.

`python -m planner measure` takes it with the rest of the machine profile; `python -m planner.cpu_peak
[--cache_dir DIR] [--remeasure]` takes only this figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from training.cli import run_main
from training.durable import write_atomic
from training.records.peaks import (
    CPU_MATMUL_SIZE,
    CPU_MAX_MEASUREMENTS,
    CPU_SPREAD_LIMIT,
    CPU_TRIAL_S,
    CPU_TRIALS,
    CPU_WARMUP_S,
    PeakFlops,
    cpu_cache_key,
    cpu_cache_path,
    cpu_peak_from_entry,
    default_cache_dir,
    read_cpu_entry,
    relative_spread,
    spread_is_wide,
)


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
    waited while another measured takes that figure.
    Nothing global is left changed: torch's thread count is restored and the global RNG is not used.
    """
    current = torch.get_num_threads()
    threads = current if threads is None else threads
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    key = cpu_cache_key(threads)
    path = cpu_cache_path(cache_dir, key)
    seen = read_cpu_entry(path, key)
    if not remeasure and _settled(seen):
        return cpu_peak_from_entry(seen, f"cached {path}", cached=True)
    with _exclusive(path.parent / "cpu_peak.lock"):
        now = read_cpu_entry(path, key)
        if not remeasure and now is not None and (now != seen or _settled(now)):
            return cpu_peak_from_entry(now, f"cached {path}", cached=True)  # measured by another process meanwhile
        taken = _measure_while_wide(threads, current)
        entry = _kept_entry(key, now, taken)
        where = _save_entry(path, entry)
    return cpu_peak_from_entry(entry, where, cached=False, taken=len(taken))


def _settled(entry: dict[str, Any] | None) -> bool:
    """A valid cached figure whose trials did not spread widely: used as it is, not measured again."""
    return entry is not None and not spread_is_wide(relative_spread(entry))


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
    kept["relative_spread"] = relative_spread(best)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m planner.cpu_peak",
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
