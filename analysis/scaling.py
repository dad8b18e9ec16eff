"""Two figures of each run that need the rest of the comparison or a price: scaling efficiency and cost.

Scaling efficiency = N-device throughput / (N x throughput of a comparable single-device run): 100% is
perfect scaling. Cost per million tokens = price per device-hour x devices / 3600 / (tokens/s) x 10^6.
Both use the throughput the reading ranks the runs by (`ranked_throughput`), so the table, the reading
and this section never mix warm-up steps in and out. Torch-free: the experiment driver imports it.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from analysis.runs import Run, recorded
from analysis.table import COLUMNS, Column, fixed
from training.distributed import registry
from training.records.schema import MFU, TABLE, THROUGHPUT, THROUGHPUT_EXCL_WARMUP, Metric

# A multi-device run scales against a single run only when these agree: the same device, the same model,
# the same sequence length and global batch (the same work per optimizer step) and the same precision.
SCALING_FACTS = {
    "device_name": "device",
    "n_params": "parameters",
    "block_size": "block size",
    "global_batch_tokens": "global batch (tokens)",
    "precision": "precision",
}
# Every CPU is named "cpu": there the peak FLOP/s, measured once per machine and thread count, and the
# threads per process tell one machine's runs from another's.
CPU_SCALING_FACTS = {
    "peak_flops_per_device": "measured CPU peak FLOP/s",
    "threads_per_process": "threads per process",
}
SCALING_HEADER = "scaling efficiency (%)"
COST_HEADER = "cost per million tokens (at --gpu_hour_price)"
SECONDS_PER_HOUR = 3600
MILLION = 1e6


def ranked_throughput(runs: list[Run]) -> Metric:
    """Rank by throughput without warm-up steps when every run has it; otherwise all with it."""
    if runs and all((recorded(run.total, THROUGHPUT_EXCL_WARMUP) or 0.0) > 0 for run in runs):
        return THROUGHPUT_EXCL_WARMUP
    return THROUGHPUT


def throughput_name(metric: Metric) -> str:
    return "whole job, warm-up steps excluded" if metric.excludes_warmup else "whole job"


def throughput(run: Run, metric: Metric) -> float | None:
    """The run's whole-job tokens/s as `metric` records it, None unless a positive finite number."""
    value = recorded(run.total, metric)
    return value if value is not None and math.isfinite(value) and value > 0 else None


def world_size(run: Run) -> int | None:
    value = run.fact("world_size")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def _shown(value: object) -> str:
    if value is None:
        return "not recorded"
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def comparable_single(run: Run, runs: list[Run], facts: dict[str, str]) -> tuple[Run | None, str]:
    """The first single-device run of `runs` (other than `run`) whose `facts` equal `run`'s, and why not
    when there is none: which facts differ from the first single run's."""
    singles = [
        other
        for other in runs
        if other is not run and registry.single_process(other.strategy) and world_size(other) == 1
    ]
    if not singles:
        return None, "no single run in this comparison"
    for single in singles:
        if all(run.fact(key) is not None and run.fact(key) == single.fact(key) for key in facts):
            return single, ""
    first = singles[0]
    differing = [
        f"{name} {_shown(run.fact(key))} vs {_shown(first.fact(key))}"
        for key, name in facts.items()
        if run.fact(key) is None or run.fact(key) != first.fact(key)
    ]
    return None, f"no comparable single run ({first.label} differs: {', '.join(differing)})"


@dataclass(frozen=True)
class Scaling:
    """A run's scaling efficiency (a fraction; None with `reason` when there is none) and its baseline."""

    efficiency: float | None
    reason: str = ""
    baseline: Run | None = None
    devices: int = 0
    tokens_per_s: float = math.nan
    baseline_tokens_per_s: float = math.nan


def scaling_efficiency(run: Run, runs: list[Run], key: Metric) -> Scaling:
    """`run`'s tokens/s / (its devices x the comparable single run's tokens/s), both as `key` records them."""
    if registry.single_process(run.strategy):
        return Scaling(None, "the single-device baseline")
    devices = world_size(run)
    if devices is None:
        return Scaling(None, "world size not recorded")
    facts = {**SCALING_FACTS, **(CPU_SCALING_FACTS if run.fact("device_type") == "cpu" else {})}
    base, reason = comparable_single(run, runs, facts)
    if base is None:
        return Scaling(None, reason)
    mine, theirs = throughput(run, key), throughput(base, key)
    if mine is None or theirs is None:
        return Scaling(None, f"no throughput recorded ({run.label if mine is None else base.label})", base)
    return Scaling(mine / (devices * theirs), "", base, devices, mine, theirs)


def cost_per_million_tokens(price_per_device_hour: float, devices: int, tokens_per_s: float) -> float:
    """What a million trained tokens cost: the job's price per second over its tokens per second, x 10^6."""
    return price_per_device_hour * devices / SECONDS_PER_HOUR / tokens_per_s * MILLION


def run_cost(run: Run, key: Metric, price_per_device_hour: float | None) -> float | None:
    devices, tokens = world_size(run), throughput(run, key)
    if price_per_device_hour is None or devices is None or tokens is None:
        return None
    return cost_per_million_tokens(price_per_device_hour, devices, tokens)


def gpu_hour_price(text: str) -> float:
    """argparse type of --gpu_hour_price: a positive finite number."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number (price of one device for one hour), got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def price_text(price: float) -> str:
    """The price as the user gave it: every significant digit, no trailing zeros."""
    return format(price, ".12g")


def table_columns(runs: list[Run], price_per_device_hour: float | None) -> tuple[Column, ...]:
    """The table's columns with scaling efficiency and cost after MFU."""
    key = ranked_throughput(runs)
    efficiency = {run.label: scaling_efficiency(run, runs, key).efficiency for run in runs}
    added = (
        Column(
            SCALING_HEADER, lambda run: None if efficiency[run.label] is None else 100 * efficiency[run.label], fixed(1)
        ),
        Column(COST_HEADER, lambda run: run_cost(run, key, price_per_device_hour), fixed(4)),
    )
    mfu = next(column.header for column in TABLE if column.metric is MFU)
    at = next(i for i, column in enumerate(COLUMNS) if column.header == mfu) + 1
    return COLUMNS[:at] + added + COLUMNS[at:]


def scaling_lines(runs: list[Run], price_per_device_hour: float | None) -> list[str]:
    """The section's sentences: how each run's efficiency was computed or why it is n/a, and the cost."""
    key = ranked_throughput(runs)
    lines = []
    for run in runs:
        result = scaling_efficiency(run, runs, key)
        if result.baseline is not None and result.efficiency is not None:
            lines.append(
                f"Scaling efficiency of {run.label}: {result.tokens_per_s:,.0f} tokens/s / "
                f"({result.devices} x {result.baseline_tokens_per_s:,.0f} tokens/s of "
                f"{result.baseline.label}) = {result.efficiency:.1%}."
            )
        elif not registry.single_process(run.strategy):
            lines.append(f"Scaling efficiency of {run.label}: n/a, {result.reason}.")
    if price_per_device_hour is None:
        lines.append(
            "Cost per million tokens: not computed; pass `--gpu_hour_price PRICE` (one device for one "
            "hour, any currency) to `python -m analysis.compare` or `python -m analysis.experiment`."
        )
    else:
        costs = [(run, run_cost(run, key, price_per_device_hour)) for run in runs]
        shown = ", ".join(
            f"{run.label} {cost:,.4f}" if cost is not None else f"{run.label} n/a (no throughput)"
            for run, cost in costs
        )
        lines.append(
            f"Cost per million tokens at {price_text(price_per_device_hour)} per device-hour (the currency of "
            f"--gpu_hour_price): {shown}."
        )
    lines.append(f"Both use the throughput of the reading ({throughput_name(key)}, `{key.key}` in summary.json).")
    return lines
