"""The run schema against what runs record, and the names its consumers take from it."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from training.records.record import EpochFigures, EvalLine, RunTotals, TrainLine
from training.records.schema import (
    BARS,
    CURVES,
    LINE_KIND_KEY,
    METRICS,
    TABLE,
    WANDB_SUMMARY_PREFIX,
    X_AXIS,
    Bars,
    Curve,
    Metric,
    Ranks,
    Scope,
    Steps,
    TableColumn,
    in_scope,
    metric,
)

SAMPLE_RUNS = sorted((Path(__file__).resolve().parents[1] / "docs" / "sample_report" / "runs").iterdir())


def recorded_keys(run_dir: Path) -> dict[Scope, set[str]]:
    """Every key a run directory holds, by where it is recorded."""
    keys: dict[Scope, set[str]] = {scope: set() for scope in Scope}
    for line in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()):
        keys[Scope(line[LINE_KIND_KEY])] |= set(line) - {LINE_KIND_KEY}
    summary = json.loads((run_dir / "summary.json").read_text())
    keys[Scope.TOTAL] = set(summary["total"])
    keys[Scope.EPOCH] = {key for epoch in summary["epochs"] for key in epoch}
    return keys


@pytest.mark.parametrize("run_dir", SAMPLE_RUNS, ids=lambda path: path.name)
def test_every_key_a_run_records_is_declared_and_every_declared_key_is_recorded(run_dir: Path) -> None:
    for scope, keys in recorded_keys(run_dir).items():
        declared = {m.key for m in in_scope(scope)}
        assert keys - declared == set(), f"undeclared {scope.value} keys"
        assert declared - keys == set(), f"declared {scope.value} keys no run records"


def test_the_whole_run_figures_training_computes_are_declared() -> None:
    from tests.test_analysis_wandb_report import total_keys_written_by_training

    assert total_keys_written_by_training() == {m.key for m in in_scope(Scope.TOTAL)}


def test_every_wandb_key_names_one_metric_and_differs_from_the_summary_keys() -> None:
    history = [m.wandb_key for m in METRICS if m.wandb_key is not None]
    assert len(history) == len(set(history))
    summary = {m.wandb_summary_key for m in in_scope(Scope.TOTAL)}
    assert all(key.startswith(WANDB_SUMMARY_PREFIX) for key in summary)
    assert not summary & set(history)


def test_the_wandb_names_and_table_headers_stay_those_already_in_use() -> None:
    # W&B history and summary keys and the table headers are what earlier runs and reports hold.
    from training.records.sinks import WANDB_KEYS

    assert WANDB_KEYS == {
        "loss": "train/loss",
        "loss_interval": "train/loss_interval",
        "grad_norm": "train/grad_norm",
        "lr": "train/lr",
        "epoch": "train/epoch",
        "tokens": "train/tokens",
        "step_time_s": "time/step_time_s",
        "elapsed_s": "time/elapsed_s",
        "eval_time_s": "time/eval_time_s",
        "tokens_per_s": "perf/tokens_per_s",
        "tokens_per_s_per_device": "perf/tokens_per_s_per_device",
        "samples_per_s": "perf/samples_per_s",
        "mfu": "perf/mfu",
        "peak_mem_allocated_mib": "mem/peak_allocated_mib",
        "peak_mem_reserved_mib": "mem/peak_reserved_mib",
        "peak_mem_allocated_mib_mean": "mem/peak_allocated_mib_mean",
        "peak_mem_reserved_mib_mean": "mem/peak_reserved_mib_mean",
        "val_loss": "val/loss",
        "val_ppl": "val/ppl",
        "skipped_steps": "skipped_steps",
        "skipped_steps_interval": "skipped_steps_interval",
    }
    assert [column.header for column in TABLE] == [
        "avg loss (nats)",
        "final val loss (nats)",
        "avg grad norm",
        "total training time (s)",
        "peak allocated, max over devices (MiB)",
        "peak reserved, max over devices (MiB)",
        "peak allocated, mean over devices (MiB)",
        "throughput, total (tokens/s)",
        "throughput, per device (tokens/s)",
        "throughput excl. warm-up, total (tokens/s)",
        "MFU (%)",
    ]


def test_every_column_header_carries_its_unit() -> None:
    for column in TABLE:
        unit = "%" if column.percent else column.metric.unit
        assert column.header.endswith(f" ({unit})") if unit else column.header == column.label, column.metric.key
        assert column.metric in in_scope(Scope.TOTAL)


def test_the_comparison_table_shows_the_declared_columns_in_order() -> None:
    from analysis.table import COLUMNS

    headers = [column.header for column in COLUMNS]
    declared = [column.header for column in TABLE]
    start = headers.index(declared[0])
    assert headers[start : start + len(declared)] == declared


def test_every_panel_refers_to_declared_metrics_of_one_unit_named_in_its_y_title() -> None:
    assert X_AXIS in METRICS and X_AXIS.wandb_key is not None
    for panel in (*CURVES, *BARS):
        assert panel.metrics and all(m in METRICS for m in panel.metrics), panel.title
        units = {m.unit for m in panel.metrics}
        assert len(units) == 1, panel.title
        assert units.pop() in panel.y_title, panel.title
    assert all(m.wandb_key is not None for curve in CURVES for m in curve.metrics)
    assert all(Scope.TOTAL in m.scopes for bars in BARS for m in bars.metrics)


def test_a_declaration_that_cannot_hold_fails_at_once() -> None:
    with pytest.raises(ValueError, match="only metrics.jsonl lines are logged"):
        Metric("time_s", (Scope.EPOCH,), "s", "epoch time", Steps.SUM, Ranks.MAIN, wandb_key="time/epoch_s")
    with pytest.raises(ValueError, match="whole-run figures only"):
        TableColumn(metric("loss", Scope.TRAIN), "loss", 4)
    with pytest.raises(ValueError, match="only an epoch figure"):
        Metric("final_loss", (Scope.TOTAL,), "nats", "last loss", Steps.LAST, Ranks.MEAN, epoch_last_of="loss")
    with pytest.raises(ValueError, match="logged to the W&B history"):
        Curve("Warm-up", (metric("warmup", Scope.TRAIN),), "")
    with pytest.raises(ValueError, match="whole-run figures"):
        Bars("Loss", (metric("loss", Scope.TRAIN),), "nats")
    with pytest.raises(KeyError, match="'grad_norm_renamed' is not declared for total"):
        metric("grad_norm_renamed", Scope.TOTAL)


def test_the_schema_and_its_records_import_without_torch() -> None:
    # The report tools import it on machines and in processes that never load torch.
    code = "import sys, training.records.schema, training.records.record; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("run_dir", SAMPLE_RUNS, ids=lambda path: path.name)
def test_the_records_built_from_the_schema_hold_the_files_keys_in_their_order(run_dir: Path) -> None:
    # The schema's order within a scope is the order train.py writes, so the records keep the files as they were.
    summary = json.loads((run_dir / "summary.json").read_text())
    assert list(summary["total"]) == [f.name for f in fields(RunTotals)]
    assert all(list(epoch) == [f.name for f in fields(EpochFigures)] for epoch in summary["epochs"])
    for line in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()):
        record = TrainLine if line[LINE_KIND_KEY] == Scope.TRAIN.value else EvalLine
        assert list(line) == [LINE_KIND_KEY, *(f.name for f in fields(record))]
        assert record.from_dict(line).line() == line
