"""A W&B run rebuilds the run directory's files: read back from the offline record of a real train.py
run (config, summary and history as train.py logged them), and `as_wandb`, the conversion the W&B
report's tests serve from the local W&B server, checked against that record."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from analysis.runs import load_run
from analysis.table import build_table
from analysis.wandb_fetch import _write_run_files, run_files_from_wandb, wandb_namespace
from tests.analysis_fixtures import FakeRun, write_run
from tests.launch import train_lines


def as_wandb(run_dir: Path, namespace: dict[str, str]) -> tuple[dict, dict, list[dict]]:
    """What train.py hands W&B for this run, rebuilt from its files: resolved config, total/* summary,
    namespaced history (test_as_wandb_holds_what_a_real_record_holds checks it against a real record)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    config = {
        "preset": summary["preset"],
        "run": {
            "seed": summary["seed"],
            "experiment": summary["experiment"],
            "perf_warmup_steps": json.loads((run_dir / "config.json").read_text())["run"]["perf_warmup_steps"],
        },
        "data": {"block_size": summary["block_size"]},
        "launch": {
            "run_name": summary["run_name"],
            "data_stats": {"cache_key": summary["data_key"]},
            "device_name": summary["device_name"],
            "n_params": summary["n_params"],
            "effective": {
                "strategy": summary["strategy"],
                "world_size": summary["world_size"],
                "num_machines": summary["num_machines"],
                "precision": summary["precision"],
                "device_type": summary["device_type"],
            },
            "batch": {
                "micro_batch_size": summary["micro_batch_size"],
                "grad_accum_steps": summary["grad_accum_steps"],
                "global_batch_tokens": summary["global_batch_tokens"],
            },
            "schedule": {"total_steps": summary["steps"]},
        },
    }
    rows: dict[int, dict] = {}
    for line in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()):
        row = rows.setdefault(line["step"], {"_step": line["step"]})  # W&B merges lines of one step
        row.update(
            {
                namespace.get(k, k): v
                for k, v in line.items()
                if k not in ("kind", "step") and isinstance(v, (int, float)) and not isinstance(v, bool)
            }
        )
    return config, {f"total/{k}": v for k, v in summary["total"].items()}, list(rows.values())


@pytest.fixture(scope="module")
def namespace() -> dict[str, str]:
    return wandb_namespace()


@pytest.fixture(scope="module")
def recorded_run(shared_runs) -> Path:
    """The session's shared single run (tests/conftest.py): W&B at its default, offline without credentials,
    and 12 steps that cross into a second epoch."""
    return shared_runs["single"]


def offline_record(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """(config, summary, history rows) as W&B holds them, read back from the run's offline record."""
    (log,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    # timeout: a bound only, so that a reader that hangs fails the test instead of stalling it.
    out = subprocess.run(
        [str(Path(sys.executable).with_name("wandb")), "leet", "inspect", "--json", str(log)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    config: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    for record in records:
        if record["type"] == "config":
            config.update(record["config"]["update"])
        elif record["type"] == "summary":
            summary.update(record["summary"]["update"])
    rows = [record["history"]["item"] for record in records if record["type"] == "history"]
    assert config and summary and rows, sorted({record["type"] for record in records})
    return config, summary, rows


def test_a_real_record_rebuilds_the_run_files(recorded_run: Path, tmp_path: Path, namespace) -> None:
    files = run_files_from_wandb(*offline_record(recorded_run), namespace)
    rebuilt = load_run(_write_run_files(tmp_path / "fetched", files))
    original = load_run(recorded_run)
    assert rebuilt.usable and rebuilt.complete and not rebuilt.problems
    assert build_table([rebuilt]).rows[0][1:] == build_table([original]).rows[0][1:]
    assert len(original.epochs) == 2 and [e["epoch"] for e in files.summary["epochs"]] == [1, 2]
    # Everything summary.json holds of the launch (devices, levers, the measured peak with its time and
    # spread, the data key, ...) comes back as written; what W&B does not hold comes back null.
    unknown = {"sharding_observed", "memory", "skipped_step_numbers"}
    approximated = {"epochs", "total", "step_times_s"}  # rebuilt from the logged lines, checked here and below
    written = json.loads((recorded_run / "summary.json").read_text())
    # Per-save timings are this launch's own record, never logged to W&B: a rebuilt summary leaves the
    # optional key out, as a summary written before it existed does.
    not_held = {"checkpoint_saves"}
    assert not_held <= set(written) and set(files.summary) == set(written) - not_held
    written = {k: v for k, v in written.items() if k not in not_held}
    assert {k: files.summary[k] for k in set(written) - unknown - approximated} == {
        k: written[k] for k in set(written) - unknown - approximated
    }
    assert all(files.summary[k] is None for k in unknown)
    for got, want in zip(files.summary["epochs"], original.epochs):
        assert got["steps"] == want.steps and got["tokens"] == want.tokens
        assert got["loss_mean"] == pytest.approx(want.loss_mean, rel=1e-9)
        assert got["tokens_per_s"] == pytest.approx(want.tokens_per_s, rel=1e-9)
    # Every train line of metrics.jsonl comes back, with its loss.
    local = train_lines(recorded_run)
    fetched = {line["step"]: line for line in files.metrics if line["kind"] == "train"}
    assert sorted(fetched) == sorted(local)
    assert all(fetched[step]["loss"] == local[step]["loss"] for step in local)


def test_as_wandb_holds_what_a_real_record_holds(recorded_run: Path, namespace) -> None:
    """The hand conversion the W&B report's tests serve says what a real run's record says."""
    config, summary, rows = offline_record(recorded_run)
    our_config, our_summary, our_rows = as_wandb(recorded_run, namespace)
    assert our_summary == {k: v for k, v in summary.items() if k.startswith("total/")}

    def nested_items(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
        flat = {}
        for key, value in d.items():
            flat.update(nested_items(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key: value})
        return flat

    real = nested_items(config)
    for key, value in nested_items(our_config).items():
        assert real[key] == value, key
    by_step = {row["_step"]: row for row in rows}
    for row in our_rows:
        assert {k: v for k, v in by_step[row["_step"]].items() if k in row} == row, row["_step"]


def test_rebuilt_run_gives_the_same_table_row(tmp_path: Path, namespace) -> None:
    original = write_run(tmp_path / "ddp", FakeRun("ddp", 2, tokens_per_s=72_000, epochs=3))
    files = run_files_from_wandb(*as_wandb(original, namespace), namespace)
    rebuilt = load_run(_write_run_files(tmp_path / "fetched", files))
    assert rebuilt.usable and rebuilt.complete and not rebuilt.problems
    assert build_table([rebuilt]).rows[0][1:] == build_table([load_run(original)]).rows[0][1:]


def test_rebuilt_epochs_and_curves_follow_the_logged_lines(tmp_path: Path, namespace) -> None:
    original = load_run(write_run(tmp_path / "single", FakeRun(epochs=3, steps_per_epoch=20)))
    files = run_files_from_wandb(*as_wandb(original.path, namespace), namespace)
    epochs = files.summary["epochs"]
    assert [e["epoch"] for e in epochs] == [1, 2, 3] and [e["steps"] for e in epochs] == [20, 20, 20]
    for got, want in zip(epochs, original.epochs):
        assert got["tokens_per_s"] == pytest.approx(want.tokens_per_s)
        assert got["loss_mean"] == pytest.approx(want.loss_mean)
        assert got["val_loss"] == pytest.approx(want.val_loss)
    kinds = [r["kind"] for r in files.metrics]
    assert kinds.count("train") == 60 and kinds.count("eval") == 3
