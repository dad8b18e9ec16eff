"""The comparison table: every cell from summary.json, with units, per device vs total, max vs mean."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from analysis.runs import assign_labels, load_run, sort_runs
from analysis.table import build_table, to_csv, to_markdown
from tests.analysis_fixtures import FakeRun, write_run


@pytest.fixture
def table(tmp_path: Path):
    fakes = [
        FakeRun("single", 1, tokens_per_s=40_000, peak_alloc_mib=3000, peak_reserved_mib=3500, mfu=0.25),
        FakeRun(
            "ddp",
            2,
            tokens_per_s=72_000,
            peak_alloc_mib=3100,
            peak_alloc_mean_mib=3050,
            peak_reserved_mib=3600,
            mfu=0.225,
            global_batch_tokens=16384,
            epochs=2,
            precision="bf16",
        ),
    ]
    runs = [load_run(write_run(tmp_path / f.strategy, f)) for f in fakes]
    assign_labels(runs)
    return build_table(sort_runs(runs)), fakes


def cell(table, strategy: str, header: str):
    return table.rows[table.column("strategy").index(strategy)][table.headers.index(header)]


def test_throughput_total_and_per_device_are_the_stored_values(table) -> None:
    table, _ = table
    assert cell(table, "ddp", "throughput, total (tokens/s)") == 72_000
    assert cell(table, "ddp", "throughput, per device (tokens/s)") == 36_000  # total / world size
    assert cell(table, "single", "throughput, per device (tokens/s)") == 40_000
    assert cell(table, "ddp", "throughput excl. warm-up, total (tokens/s)") == pytest.approx(72_720)


def test_memory_max_and_mean_over_devices_are_separate_columns(table) -> None:
    table, _ = table
    assert cell(table, "ddp", "peak allocated, max over devices (MiB)") == 3100
    assert cell(table, "ddp", "peak allocated, mean over devices (MiB)") == 3050
    assert cell(table, "ddp", "peak reserved, max over devices (MiB)") == 3600


def test_mfu_is_shown_in_percent(table) -> None:
    table, _ = table
    assert cell(table, "single", "MFU (%)") == pytest.approx(25.0)
    assert cell(table, "ddp", "MFU (%)") == pytest.approx(22.5)


def test_losses_time_and_fairness_facts(table, tmp_path: Path) -> None:
    table, fakes = table
    summary = load_run(tmp_path / "ddp").summary
    assert cell(table, "ddp", "avg loss (nats)") == summary["total"]["loss_mean"]
    assert cell(table, "ddp", "final val loss (nats)") == summary["total"]["final_val_loss"]
    assert cell(table, "ddp", "avg grad norm") == fakes[1].grad_norm
    # 2 epochs x 20 steps x 16,384 tokens at 72,000 tokens/s
    assert cell(table, "ddp", "total training time (s)") == pytest.approx(40 * 16384 / 72_000)
    assert cell(table, "ddp", "world size (devices)") == 2
    assert cell(table, "ddp", "global batch (tokens)") == 16384
    assert cell(table, "ddp", "tokens trained") == 40 * 16384
    assert cell(table, "ddp", "precision") == "bf16"
    assert cell(table, "ddp", "seed") == 1337


def test_every_numeric_header_names_its_unit() -> None:
    from analysis.table import COLUMNS

    unitless = {"run", "strategy", "complete", "avg grad norm", "precision", "seed", "tokens trained"}
    for column in COLUMNS:
        assert column.header in unitless or column.header.endswith(")"), column.header


def test_markdown_is_readable_and_csv_keeps_full_precision(table) -> None:
    table, _ = table
    markdown = to_markdown(table)
    assert "| 72,000 |" in markdown and "| 36,000 |" in markdown and "| 22.50 |" in markdown
    rows = list(csv.DictReader(io.StringIO(to_csv(table))))
    assert [row["strategy"] for row in rows] == ["single", "ddp"]
    assert float(rows[1]["avg loss (nats)"]) == cell(table, "ddp", "avg loss (nats)")  # every digit


def test_a_missing_value_is_n_a_in_markdown_and_empty_in_csv(tmp_path: Path) -> None:
    import json

    path = write_run(tmp_path / "single", FakeRun())
    summary = json.loads((path / "summary.json").read_text())
    summary["total"]["final_val_loss"] = None
    (path / "summary.json").write_text(json.dumps(summary))
    table = build_table([load_run(path)])
    assert "n/a" in to_markdown(table)
    assert list(csv.DictReader(io.StringIO(to_csv(table))))[0]["final val loss (nats)"] == ""
