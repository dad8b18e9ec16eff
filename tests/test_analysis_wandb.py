"""A W&B run (config, summary, history as train.py logs them) rebuilds the run directory's files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.runs import load_run
from analysis.table import build_table
from analysis.wandb_fetch import _write_run_files, run_files_from_wandb, wandb_namespace
from tests.analysis_fixtures import FakeRun, write_run


def as_wandb(run_dir: Path, namespace: dict[str, str]) -> tuple[dict, dict, list[dict]]:
    """What train.py hands W&B for this run: resolved config, total/* summary, namespaced history."""
    summary = json.loads((run_dir / "summary.json").read_text())
    config = {
        "preset": summary["preset"],
        "run": {"seed": summary["seed"], "experiment": summary["experiment"],
                "perf_warmup_steps": json.loads((run_dir / "config.json").read_text())["run"]["perf_warmup_steps"]},
        "data": {"block_size": summary["block_size"]},
        "launch": {
            "run_name": summary["run_name"], "data_stats": {"cache_key": summary["data_key"]},
            "device_name": summary["device_name"], "n_params": summary["n_params"],
            "effective": {"strategy": summary["strategy"], "world_size": summary["world_size"],
                          "num_machines": 1, "precision": summary["precision"], "device_type": "cuda"},
            "batch": {"micro_batch_size": 4, "grad_accum_steps": summary["grad_accum_steps"],
                      "global_batch_tokens": summary["global_batch_tokens"]},
            "schedule": {"total_steps": summary["steps"]},
        },
    }
    rows: dict[int, dict] = {}
    for line in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()):
        row = rows.setdefault(line["step"], {"_step": line["step"]})  # W&B merges lines of one step
        row.update({namespace.get(k, k): v for k, v in line.items()
                    if k not in ("kind", "step") and isinstance(v, (int, float)) and not isinstance(v, bool)})
    return config, {f"total/{k}": v for k, v in summary["total"].items()}, list(rows.values())


@pytest.fixture(scope="module")
def namespace() -> dict[str, str]:
    return wandb_namespace()


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
        assert got["tokens_per_s"] == pytest.approx(want["tokens_per_s"])
        assert got["loss_mean"] == pytest.approx(want["loss_mean"])
        assert got["val_loss"] == pytest.approx(want["val_loss"])
    kinds = [r["kind"] for r in files.metrics]
    assert kinds.count("train") == 60 and kinds.count("eval") == 3
