"""The answer a comparison exists for, in three lines and one table, read from report.json alone.

Speed, memory and (with a target) time to it: which strategy, by how much against each other, from how many
runs, and whether that is established, equivalent within the figure's practical margin, or not established
and what would establish it. The report, the experiment's console, the notebook and the W&B report all show
these lines first; analysis/uncertainty.py decides every status, this module only words it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from analysis.table import Table
from analysis.uncertainty import MAX_UNITS, MIB, STEP_PEAK, TARGET_SECONDS, TARGET_TOKENS, THROUGHPUT


def _comparison(report: dict[str, Any], figure: str, a: str, b: str) -> dict[str, Any] | None:
    """a / b as report.json holds it, turned round when it stored b / a."""
    for c in report.get("comparisons", []):
        if c["figure"] != figure:
            continue
        if (c["a"], c["b"]) == (a, b):
            return c
        if (c["a"], c["b"]) == (b, a):
            ci = c["ci95"]
            flipped = {"higher": "lower", "lower": "higher"}.get(c["direction"] or "", c["direction"])
            return {
                **c,
                "a": a,
                "b": b,
                "units_a": c["units_b"],
                "units_b": c["units_a"],
                "ratio": 1 / c["ratio"],
                "ci95": None if ci is None else [1 / ci[1], 1 / ci[0]],
                "direction": flipped,
            }
    return None


def ranked(report: dict[str, Any], figure: str) -> list[str]:
    """The figure's strategies, the best first (higher or lower as the figure says; ties keep table order)."""
    entry = report["figures"].get(figure)
    if not entry:
        return []
    strategies = entry["strategies"]
    sign = -1 if entry["higher_is_better"] else 1
    # A strategy some of whose runs never got a value (a target not reached) ranks after every one whose did.
    return sorted(strategies, key=lambda s: (strategies[s].get("missing", 0) > 0, sign * strategies[s]["centre"]))


def _units(c: dict[str, Any], unit: str) -> str:
    a, b = c["units_a"], c["units_b"]
    return f"{a} {unit}{'s' if a != 1 else ''} each" if a == b else f"{a} and {b} {unit}s"


def _status(c: dict[str, Any], margin: float, unit: str) -> str:
    """'established', 'equivalent within the 2% margin', 'not established: 4 runs each would establish it'."""
    if c["status"] == "established":
        return "established"
    if c["status"] == "equivalent":
        return f"equivalent within the {margin:.1%} margin".replace(".0%", "%")
    if c.get("reason"):
        return f"not established ({c['reason']})"
    if abs(math.log(c["ratio"])) <= math.log1p(margin):
        return f"not established (the ratio is inside the {margin:.1%} margin, its interval is not)".replace(".0%", "%")
    needed = c.get("units_needed")
    if needed is None and c.get("spread") is None:
        return f"not established: no strategy has 2 {unit}s to measure the spread"
    if needed is None:
        return f"not established: more than {MAX_UNITS} {unit}s each would be needed"
    return f"not established: {needed} {unit}s each would establish it"


def _spread(comparisons: list[dict[str, Any]]) -> str:
    """' (run-to-run spread 2.1%, measured)', once per line, where a run count was worked out from it."""
    used = [c for c in comparisons if c["status"] == "not established" and c.get("spread") is not None]
    if not used:
        return ""
    how = "measured" if used[0]["spread_measured"] else "assumed: no strategy has 2 runs to measure it"
    # The count is for the rule as applied: Welch at 5% over the figure's pairs, the estimate outside the margin.
    return f" (run-to-run spread {used[0]['spread']:.1%}, {how})"


def _evidence(c: dict[str, Any], unit: str) -> str:
    """'95% CI 1.74-1.94, 3 runs each', 'exact, 1 run each'."""
    if c["method"] == "exact values":
        return f"exact, {_units(c, unit)}"
    if c["ci95"] is None:
        return _units(c, unit)
    low, high = c["ci95"]
    return f"95% CI {low:.2f}-{high:.2f}, {_units(c, unit)}"


def figure_line(
    report: dict[str, Any],
    figure: str,
    head: str,
    value: Callable[[float, str], str],
    lead: tuple[str, str] = ("use **{}**", "**{}** leads"),
) -> str | None:
    """'Speed: leads **ddp**, 1,900 tokens/s; 1.05x fsdp (95% CI ..., 3 runs each): not established ...; 1.83x
    single (...): established.' `lead`: the word when every gap is established, and otherwise. None when the
    figure has fewer than two strategies."""
    order = ranked(report, figure)
    if len(order) < 2:
        return None
    entry = report["figures"][figure]
    best, margin = order[0], entry["margin"]
    seeds = entry["unit_of_replication"] == "seed" or any(
        s["units"] + s.get("missing", 0) != s["runs"] for s in entry["strategies"].values()
    )
    unit = "seed" if seeds else "run"
    parts, comparisons = [], []
    for other in order[1:]:
        c = _comparison(report, figure, best, other)
        if c is not None:
            comparisons.append(c)
            parts.append((f"{c['ratio']:.2f}x {other} ({_evidence(c, unit)})", _status(c, margin, unit)))
    statuses = {status for _, status in parts}
    if len(statuses) == 1:
        said = f"{', '.join(text for text, _ in parts)}: {statuses.pop()}"
    else:
        said = "; ".join(f"{text}: {status}" for text, status in parts)
    word = lead[0] if all(status == "established" for _, status in parts) else lead[1]
    if all(c["status"] == "equivalent" for c in comparisons):
        word = "any of " + ", ".join(f"**{name}**" for name in order).replace("{", "{{").replace("}", "}}")
    return f"{head}: {word.format(best)}, {value(entry['strategies'][best]['centre'], best)}; {said}{_spread(comparisons)}."


def answer_lines(report: dict[str, Any]) -> list[str]:
    """At most three lines: the strategy to use for speed, for memory and for the time to the target."""
    lines = [
        figure_line(report, THROUGHPUT, "Speed", lambda v, _: f"{v:,.0f} tokens/s"),
        figure_line(report, STEP_PEAK, "Memory", lambda v, _: f"step peak {v / MIB:,.1f} MiB"),
    ]
    if "target_loss" in report:
        lines.append(target_line(report))
    said = [line for line in lines if line]
    return said or ["Fewer than two strategies have a figure to compare: nothing to decide."]


def target_line(report: dict[str, Any]) -> str | None:
    """Time to the target: the sooner strategy, or the only one whose runs reached it."""
    head = f"Time to loss {report['target_loss']:g}"
    price, devices = report.get("price_per_device_hour"), report.get("devices") or {}

    def seconds(value: float, strategy: str) -> str:
        cost = f", cost {price * devices.get(strategy, 1) * value / 3600:,.4f}" if price is not None else ""
        return f"{value:,.1f} s{cost}"

    line = figure_line(report, TARGET_SECONDS, head, seconds)
    reached = ranked(report, TARGET_SECONDS)
    if line is not None or len(reached) != 1:
        return line
    only = report["figures"][TARGET_SECONDS]["strategies"][reached[0]]
    return (
        f"{head}: only **{reached[0]}** reached it ({only['runs'] - only['missing']} of {only['runs']} runs), "
        f"{seconds(only['centre'], reached[0])}."
    )


def _centre(report: dict[str, Any], figure: str, strategy: str) -> float | None:
    entry = report["figures"].get(figure, {}).get("strategies", {}).get(strategy)
    return None if entry is None else entry["centre"]


def _row_status(report: dict[str, Any], best: str, strategy: str) -> str:
    if THROUGHPUT not in report["figures"]:
        return "n/a"
    if strategy == best:
        return "fastest"
    c = _comparison(report, THROUGHPUT, strategy, best)
    if c is None:
        return "n/a"
    return "slower, established" if c["status"] == "established" else c["status"]


def answer_table(report: dict[str, Any]) -> Table:
    """Strategy, runs, throughput and its ratio to the fastest, step peak, time to the target, speed status."""
    order = ranked(report, THROUGHPUT) or ranked(report, STEP_PEAK)
    best = order[0] if order else None
    target = report.get("target_loss")
    headers = ["strategy", "runs", "throughput (tokens/s)", "x fastest", "step peak (MiB)"]
    headers += [f"time to loss {target:g} (s)", f"tokens to loss {target:g}"] if target is not None else []
    headers.append("speed")
    rows: list[list[Any]] = []
    for strategy in order:
        runs = (
            report["figures"][THROUGHPUT]["strategies"].get(strategy, {}).get("runs")
            if THROUGHPUT in report["figures"]
            else None
        )
        speed, fastest = _centre(report, THROUGHPUT, strategy), _centre(report, THROUGHPUT, best) if best else None
        peak = _centre(report, STEP_PEAK, strategy)
        row = [strategy, runs, speed, speed / fastest if speed and fastest else None, peak / MIB if peak else None]
        if target is not None:
            row += [_centre(report, TARGET_SECONDS, strategy), _centre(report, TARGET_TOKENS, strategy)]
        rows.append([*row, _row_status(report, best, strategy)])
    shown = [[_shown(header, cell) for header, cell in zip(headers, row)] for row in rows]
    return Table(headers=headers, rows=rows, shown=shown)


def _shown(header: str, cell: Any) -> str:
    if cell is None:
        return "n/a" if header not in ("speed",) else ""
    if isinstance(cell, str) or isinstance(cell, int):
        return str(cell)
    if header == "x fastest":
        return f"{cell:.2f}"
    return f"{cell:,.1f}" if header.startswith(("step peak", "time to")) else f"{cell:,.0f}"
