"""What the planner and the report's plan section share: the planner's one-line input error and its
error against a measurement, in percent.

Its own module, torch-free, so that neither imports the other for them: planner/plan.py (which imports
torch through model.config) reads finished runs, and analysis/plan_report.py puts them in the report.
"""

from __future__ import annotations


class PlanError(ValueError):
    """Bad input to the planner: one line for the user."""


def error_pct(predicted: float, measured: float | None) -> float | None:
    """(predicted - measured) / measured in percent; None when nothing (or zero) was measured."""
    return None if not measured else (predicted - measured) / measured * 100
