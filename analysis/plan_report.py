"""The report's "Plan beside measurement": rank 0's predicted memory (planner.plan.compare_run) beside what
each run measured (summary.json "memory"), and the gaps between strategies in words, from those figures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from analysis.runs import Run
from analysis.scaling import comparable_single
from analysis.table import Cell, Table
from planner.errors import PlanError, error_pct
from training.distributed import registry
from training.distributed.registry import Communication

MIB = 2**20
FLAG_PCT = 15.0  # errors above this are flagged
STATE_KINDS = ("parameters", "gradients", "optimizer")
# A gap between two strategies' memory compares like with like only when these agree.
MEMORY_FACTS = {
    "device_name": "device",
    "n_params": "parameters",
    "micro_batch_size": "micro-batch",
    "block_size": "block size",
    "precision": "precision",
}
NOT_MEASURED = "not measured (run recorded before memory measurement)"
HEADERS = [
    "run",
    "strategy",
    "model state, predicted (MiB)",
    "model state, measured (MiB)",
    "model state error (%)",
    "step peak, predicted (MiB)",
    "step peak, measured (MiB)",
    "step peak error (%)",
    "predicted peak phase",
]
# What each kind of the predicted peak (planner/cost_model.py StepMemory) holds, in the gap sentences.
KIND_NAMES = {
    "parameters": "parameters",
    "gradients": "gradients",
    "optimizer": "AdamW state",
    "activations": "saved activations",
    "logits": "the vocabulary-sized loss tensors",
    "communication": "communication buffers",
    "temporaries": "temporaries",
}


@dataclass
class Compared:
    """One run beside its plan: rank 0's figures in bytes, and the plan's peak by kind."""

    run: Run
    predicted_state: int
    measured_state: int | None  # None unless all three kinds were measured
    predicted_peak: int
    measured_peak: int | None
    phase: str
    peak: dict[str, Any]  # planner.cost_model.StepMemory.to_dict() of rank 0
    notes: list[str] = field(default_factory=list)

    @property
    def state_error(self) -> float | None:
        return error_pct(self.predicted_state, self.measured_state)

    @property
    def peak_error(self) -> float | None:
        return error_pct(self.predicted_peak, self.measured_peak)


@dataclass
class PlanSection:
    table: Table | None  # None when no run could be put beside its plan
    lines: list[str]


def compared(run: Run, entry: dict[str, Any]) -> Compared:
    """`entry` is planner.plan.compare_run's answer for `run`."""
    predicted, measured = entry["predicted"], entry["measured"]
    state = sum(measured[k] for k in STATE_KINDS) if all(measured.get(k) is not None for k in STATE_KINDS) else None
    return Compared(
        run,
        sum(predicted[k] for k in STATE_KINDS),
        state,
        predicted["step_peak"],
        measured.get("step_peak"),
        entry["ranks"][0]["peak_phase"],
        entry["ranks"][0]["predicted_peak"],
        list(entry.get("notes") or []),
    )


def _read(run: Run) -> Compared | str:
    """The run beside its plan, or the one line that says why not."""
    if not run.fact("memory"):
        return NOT_MEASURED
    from planner.plan import compare_run  # the planner imports torch (model.config's package)

    try:
        return compared(run, compare_run(run.path))
    except PlanError as exc:
        return f"no plan: {exc}"
    except (KeyError, TypeError, ValueError, IndexError) as exc:  # a memory record of an unexpected shape
        return f"no plan: its memory record cannot be read ({type(exc).__name__}: {exc})"


def _mib(n: float) -> str:
    return f"{n / MIB:,.1f}"


def _error_cell(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:+.1f}" + (f" (over {FLAG_PCT:g}%)" if abs(value) > FLAG_PCT else "")


def plan_table(items: list[Compared]) -> Table:
    rows: list[list[Cell]] = []
    shown: list[list[str]] = []
    for c in items:
        row: list[Cell] = [
            c.run.label,
            c.run.strategy,
            c.predicted_state / MIB,
            None if c.measured_state is None else c.measured_state / MIB,
            c.state_error,
            c.predicted_peak / MIB,
            None if c.measured_peak is None else c.measured_peak / MIB,
            c.peak_error,
            c.phase,
        ]
        rows.append(row)
        shown.append(
            [
                c.run.label,
                c.run.strategy,
                _mib(c.predicted_state),
                "n/a" if c.measured_state is None else _mib(c.measured_state),
                _error_cell(c.state_error),
                _mib(c.predicted_peak),
                "n/a" if c.measured_peak is None else _mib(c.measured_peak),
                _error_cell(c.peak_error),
                c.phase,
            ]
        )
    return Table(list(HEADERS), rows, shown)


def _kind_note(kind: str, c: Compared, base: Compared, delta: int) -> str:
    """What one kind of the peak is, for the run that holds more of it."""
    holder = c if delta > 0 else base
    entry, peak = registry.find(holder.run.strategy), holder.peak
    if kind == "communication" and entry is not None and entry.communication is Communication.ALL_REDUCE:
        return (
            f"DDP's gradient buckets, one fp32 copy of the gradients (4 bytes x {peak['communication'] // 4:,} "
            "parameters)"
        )
    if kind == "communication" and registry.shards(holder.run.strategy):
        return "FSDP's parameters gathered (unsharded) for computing"
    if kind == "gradients" and c.phase == base.phase == "loss":
        return (
            f"gradients held from earlier micro-batches ({base.run.label} accumulates "
            f"{base.run.fact('grad_accum_steps')} micro-batches per step, {c.run.label} "
            f"{c.run.fact('grad_accum_steps')})"
        )
    sharded = next((x.run for x in (c, base) if registry.shards(x.run.strategy)), None)
    if kind in STATE_KINDS and sharded is not None:
        return f"{KIND_NAMES[kind]} ({sharded.label} shards them over {sharded.fact('world_size')} ranks)"
    return KIND_NAMES[kind]


def gap_line(c: Compared, base: Compared) -> str:
    """How `c`'s step peak differs from the single run's, measured and planned, and the plan's kinds behind it."""
    assert c.measured_peak is not None and base.measured_peak is not None
    measured = c.measured_peak - base.measured_peak
    planned = c.predicted_peak - base.predicted_peak
    if abs(measured) < 0.05 * MIB:
        head = f"{c.run.label}'s step peak equals {base.run.label}'s within 0.1 MiB"
    else:
        head = (
            f"{c.run.label}'s step peak is {_mib(abs(measured))} MiB {'above' if measured > 0 else 'below'} "
            f"{base.run.label}'s"
        )
    head += (
        f" (measured {_mib(c.measured_peak)} vs {_mib(base.measured_peak)} MiB; planned {_mib(c.predicted_peak)}"
        f" vs {_mib(base.predicted_peak)} MiB, {planned / MIB:+,.1f} MiB)"
    )
    deltas = [(kind, c.peak[kind] - base.peak[kind]) for kind in KIND_NAMES]
    deltas = sorted(((k, d) for k, d in deltas if abs(d) >= 0.05 * MIB), key=lambda kd: -abs(kd[1]))
    if not deltas:
        return f"{head}: the plan holds the same bytes of every kind at both peaks."
    parts = [f"{d / MIB:+,.1f} MiB {_kind_note(kind, c, base, d)}" for kind, d in deltas]
    phases = (
        f"both at the {c.phase} phase"
        if c.phase == base.phase
        else f"{c.run.label} at the {c.phase} phase, {base.run.label} at the {base.phase} phase"
    )
    return f"{head}. By the plan ({phases}): {'; '.join(parts)}."


def sharding_line(c: Compared, base: Compared) -> str | None:
    """For a sharded run: how much model state sharding saves against how much the peak falls, and what at
    the peak sharding does not divide."""
    if not registry.shards(c.run.strategy) or c.measured_state is None or base.measured_state is None:
        return None
    if c.measured_peak is None or base.measured_peak is None or not base.measured_state:
        return None
    saved = base.measured_state - c.measured_state
    fall = base.measured_peak - c.measured_peak
    local, total = c.run.fact("local_param_numel"), c.run.fact("n_params")
    counts = (
        f"; {local:,} of {total:,} parameters on rank 0" if isinstance(local, int) and isinstance(total, int) else ""
    )
    line = (
        f"{c.run.label} holds {c.measured_state / base.measured_state:.0%} of {base.run.label}'s model state "
        f"per rank ({_mib(c.measured_state)} vs {_mib(base.measured_state)} MiB measured{counts}), "
    )
    if fall <= 0:
        line += f"yet its step peak is {_mib(-fall)} MiB higher"
    elif fall < saved:
        line += f"but its step peak falls only by {_mib(fall)} MiB ({fall / base.measured_peak:.0%})"
    else:
        line += f"and its step peak falls by {_mib(fall)} MiB ({fall / base.measured_peak:.0%})"
    undivided = c.peak["activations"] + c.peak["logits"]
    if undivided and c.predicted_peak:
        line += (
            f": at its planned peak ({c.phase} phase) the saved activations ({_mib(c.peak['activations'])} MiB) "
            f"and the vocabulary-sized loss tensors ({_mib(c.peak['logits'])} MiB), which sharding does not "
            f"divide, are {undivided / c.predicted_peak:.0%} of it"
        )
    return line + "."


def flag_line(items: list[Compared]) -> str | None:
    errors = [
        (c, what, value, predicted, measured)
        for c in items
        for what, value, predicted, measured in (
            ("model state", c.state_error, c.predicted_state, c.measured_state),
            ("step peak", c.peak_error, c.predicted_peak, c.measured_peak),
        )
        if value is not None
    ]
    if not errors:
        return None
    flagged = [
        f"{c.run.label} {what} {value:+.1f}% (planned {_mib(p)} MiB, measured {_mib(m)} MiB)"
        for c, what, value, p, m in errors
        if abs(value) > FLAG_PCT
    ]
    if flagged:
        return f"Errors above {FLAG_PCT:g}% (flagged in the table): {'; '.join(flagged)}."
    worst = max(abs(value) for _, _, value, _, _ in errors)
    return f"Every error is within {FLAG_PCT:g}% (the largest: {worst:.1f}%); errors above {FLAG_PCT:g}% are flagged."


def _by_value(pairs: list[tuple[str, str]]) -> list[str]:
    """Each distinct text once, with the runs it belongs to."""
    labels: dict[str, list[str]] = {}
    for label, value in pairs:
        labels.setdefault(value, []).append(label)
    return [f"{value} ({', '.join(names)})" for value, names in labels.items()]


def plan_section(runs: list[Run]) -> PlanSection:
    items: list[Compared] = []
    lines: list[str] = []
    for run in runs:
        result = _read(run)
        if isinstance(result, str):
            lines.append(f"{run.label}: {result}.")
        else:
            items.append(result)
    if not items:
        return PlanSection(None, lines)
    for c in items:
        if registry.single_process(c.run.strategy):  # the baseline the others' gaps are measured from
            continue
        base_run, reason = comparable_single(c.run, [i.run for i in items], MEMORY_FACTS)
        base = next((i for i in items if i.run is base_run), None)
        if base is None:
            lines.append(
                f"{c.run.label}: no gap to explain against a single run: {reason}, among the runs with memory measured."
            )
        elif c.measured_peak is not None and base.measured_peak is not None:
            lines.append(gap_line(c, base))
            if (sharding := sharding_line(c, base)) is not None:
                lines.append(sharding)
    if (flags := flag_line(items)) is not None:
        lines.append(flags)
    sources = [
        (c.run.label, str(c.run.fact("memory").get("step_peak_source")))
        for c in items
        if isinstance(c.run.fact("memory"), dict) and c.run.fact("memory").get("step_peak_source")
    ]
    lines += [f"Step peak measured by {text}." for text in _by_value(sources)]
    lines += [f"Plan note: {text}." for text in _by_value([(c.run.label, note) for c in items for note in c.notes])]
    return PlanSection(plan_table(items), lines)
