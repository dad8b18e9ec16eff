"""How a run's per-step values become one figure: the single definition that train.py's summary and
the report's W&B path both use, so a figure means the same wherever it was computed.

Pure Python (no torch), so the analysis side can import it cheaply.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class SteadyMean:
    """The mean of a per-step figure and what it left out."""

    value: float  # nan when no step had a finite value
    steps: int  # steps averaged
    nonfinite_left_out: int  # steps in the averaged range whose value was inf, nan or missing


def steady_mean(points: Iterable[tuple[int, float | None]], warmup_steps: int) -> SteadyMean:
    """Mean of (step, value) pairs over the steps after the first `warmup_steps` (over all of them when
    none lies after), leaving out non-finite values and counting them.

    The warm-up steps are left out because they include one-off costs and the steepest part of the loss
    curve; non-finite values (an fp16 overflow that the grad scaler skipped) are left out because one of
    them would turn the whole mean into nan, and counted so the figure says what it omits.
    """
    pairs = list(points)
    chosen = [value for step, value in pairs if step > warmup_steps] or [value for _, value in pairs]
    finite = [float(v) for v in chosen if _finite(v)]
    mean = statistics.fmean(finite) if finite else float("nan")
    return SteadyMean(mean, len(finite), len(chosen) - len(finite))


def _finite(value: float | None) -> bool:
    # bool is an int; a stray true/false is not a measurement.
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
