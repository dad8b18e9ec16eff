"""The whole experiment driver on CPU: three real strategies (tiny preset, a few steps), then the report."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from tests.launch import REPO, launch_env

pytestmark = pytest.mark.multiprocess

FIGURES = ("throughput_per_epoch.png", "grad_norm_per_epoch.png", "training_time_per_epoch.png",
           "peak_memory_per_epoch.png", "loss_per_epoch.png", "loss_vs_tokens.png", "step_time_distribution.png")


def test_experiment_runs_every_strategy_and_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "experiment"
    result = subprocess.run(
        [sys.executable, "-m", "analysis.experiment", "--preset", "tiny", "--max_steps", "10", "--out", str(out),
         "--extra", "--cache_dir", str(tmp_path / "cache"), "--wandb_mode", "disabled", "--dropout", "0"],
        cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    with (out / "table.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [row["strategy"] for row in rows] == ["single", "ddp", "fsdp"]
    assert len({row["global batch (tokens)"] for row in rows}) == 1  # the driver matched the batches
    assert [row["world size (devices)"] for row in rows] == ["1", "2", "2"]
    for name in FIGURES:
        assert (out / name).stat().st_size > 10_000, name
    report = (out / "report.md").read_text()
    # Same data, order, batch and seed in fp32: the reading must find the curves the same.
    assert "Loss curves agree within noise" in report
    assert "src=\"" not in (out / "report.html").read_text().replace('src="data:', "")
