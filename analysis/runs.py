"""Load run directories (config.json, metrics.jsonl, summary.json; see docs/run_directory.md).

A run that cannot be compared is not an error here: whatever is wrong with it is collected in
`Run.problems`, so the report can say so and still compare the others.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from training.config import arm_index
from training.distributed import registry
from training.records.record import EpochFigures, EvalLine, Record, RunSummary, RunTotals, TrainLine
from training.records.schema import LINE_KIND_KEY, Metric, Scope

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"


@dataclass
class Run:
    """One training run as read from its directory; `summary` is None when it could not be read.

    `summary` is summary.json's object as read; `record` is the same read into training.records.record's types,
    and `total` and `epochs` are its figures as the run schema's records, as `train` and `evals` are
    metrics.jsonl's lines.
    """

    path: Path
    summary: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    train: list[TrainLine] = field(default_factory=list)  # metrics.jsonl lines of kind "train"
    evals: list[EvalLine] = field(default_factory=list)  # metrics.jsonl lines of kind "eval"
    problems: list[str] = field(default_factory=list)  # one human-readable sentence each
    label: str = ""  # unique name in tables and legends; set by `assign_labels`

    @property
    def record(self) -> RunSummary | None:
        """The summary as training.records.record.RunSummary (read afresh, so it follows edits to `summary`)."""
        return None if self.summary is None else RunSummary.from_dict(self.summary)

    @property
    def usable(self) -> bool:
        """A run is compared when its summary has whole-run figures, even if it is partial."""
        record = self.record
        return record is not None and record.total is not None

    @property
    def complete(self) -> bool:
        record = self.record
        return record is not None and record.complete is True

    @property
    def strategy(self) -> str:
        record = self.record
        return str(record.strategy if record is not None and record.strategy else "unknown")

    @property
    def arm(self) -> str:
        """What the report compares: the strategy, or the label an experiment gave it when one strategy ran
        under several (config.json run.arm, e.g. ddp#2 of an A/A experiment `--strategies ddp ddp`)."""
        run = (self.config or {}).get("run")
        arm = run.get("arm") if isinstance(run, dict) else None
        # An arm that is not a label of this run's strategy (a hand-edited config) is ignored, not believed.
        return arm if isinstance(arm, str) and arm_index(arm, self.strategy) is not None else self.strategy

    @property
    def total(self) -> RunTotals:
        """The whole-run figures; every one None when the run has none."""
        record = self.record
        return RunTotals.from_dict({}) if record is None or record.total is None else record.total

    @property
    def epochs(self) -> list[EpochFigures]:
        record = self.record
        return [] if record is None or not record.epochs else list(record.epochs)

    @property
    def step_times_s(self) -> list[float]:
        record = self.record
        return [float(t) for t in (record.step_times_s if record is not None and record.step_times_s else [])]

    def fact(self, key: str) -> Any:
        """A top-level summary value (world_size, seed, precision, ...), None when absent or not a summary field."""
        record = self.record
        if record is None or key not in _SUMMARY_FIELDS:
            return None
        value = getattr(record, key)
        if isinstance(value, Record):
            return value.to_dict()
        return list(value) if isinstance(value, tuple) else value  # as summary.json holds it


_SUMMARY_FIELDS = frozenset(f.name for f in fields(RunSummary))


def load_run(path: Path) -> Run:
    """Read one run directory. Files are only opened for reading."""
    run = Run(path=path)
    run.summary = _read_summary(path / SUMMARY_FILE, run.problems)
    run.config = _read_json_object(path / CONFIG_FILE, run.problems, required=False)
    run.train, run.evals = _read_metrics(path / METRICS_FILE, run.problems)
    run.label = path.name
    return run


def _read_summary(path: Path, problems: list[str]) -> dict[str, Any] | None:
    if not path.exists():
        problems.append(f"no {SUMMARY_FILE} (crashed or still running); left out of the comparison")
        return None
    summary = _read_json_object(path, problems, required=True)
    if summary is None:
        return None
    if not isinstance(summary.get("total"), dict):
        problems.append(f"{SUMMARY_FILE} has no 'total' figures; left out of the comparison")
        return None
    if summary.get("complete") is not True:
        problems.append(
            f"partial run (complete: false, {summary.get('steps', '?')} steps, "
            f"{len(summary.get('epochs') or [])} epochs); compared as far as it got"
        )
    return summary


def _read_json_object(path: Path, problems: list[str], required: bool) -> dict[str, Any] | None:
    if not path.exists():
        if required:
            problems.append(f"no {path.name}")
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        problems.append(f"{path.name} is unreadable ({type(err).__name__}); ignored")
        return None
    if not isinstance(value, dict):
        problems.append(f"{path.name} is not a JSON object; ignored")
        return None
    return value


def _read_metrics(path: Path, problems: list[str]) -> tuple[list[TrainLine], list[EvalLine]]:
    train: list[TrainLine] = []
    evals: list[EvalLine] = []
    if not path.exists():
        problems.append(f"no {METRICS_FILE}; loss-against-tokens curve missing")
        return train, evals
    bad: list[int] = []
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last record, not an empty line
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            bad.append(number)
            continue
        if not isinstance(record, dict):
            bad.append(number)
        elif record.get(LINE_KIND_KEY) == Scope.TRAIN.value:
            train.append(TrainLine.from_dict(record))
        elif record.get(LINE_KIND_KEY) == Scope.EVAL.value:
            evals.append(EvalLine.from_dict(record))
        # Other kinds are newer additions to the format; ignoring them keeps old reports working.
    if bad:
        # One sentence per run, however many lines: a killed run often leaves a torn last line.
        shown = ", ".join(str(n) for n in bad[:5]) + (", ..." if len(bad) > 5 else "")
        problems.append(f"{METRICS_FILE}: {len(bad)} empty or corrupt line(s) skipped (line {shown})")
    return train, evals


def recorded(record: Any, metric: Metric) -> float | None:
    """`metric`'s value in a record built from the schema (RunTotals, a TrainLine, ...) as float, None when
    absent or not a number."""
    return number(getattr(record, metric.key, None))


def number(value: Any) -> float | None:
    """A measurement as float, or None when absent or not a number."""
    # bool is an int in Python; a stray true/false must not pass for a measurement.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def assign_labels(runs: list[Run]) -> None:
    """Label each run by its arm (its strategy, or ddp#2 and the like); where two runs share one, add the
    directory name."""
    counts: dict[str, int] = {}
    for run in runs:
        counts[run.arm] = counts.get(run.arm, 0) + 1
    for run in runs:
        run.label = run.arm if counts[run.arm] == 1 else f"{run.arm} ({run.path.name})"


def sort_runs(runs: list[Run]) -> list[Run]:
    """In the strategy registry's order (the reference's baseline first), then anything else by name; a
    strategy's arms by number (ddp, ddp#2, ..., ddp#10)."""

    def key(run: Run) -> tuple[int, str, int, str]:
        return registry.order(run.strategy), run.strategy, arm_index(run.arm, run.strategy) or 1, run.label

    return sorted(runs, key=key)
