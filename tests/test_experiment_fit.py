"""The experiment driver leaves out the strategies the planner says will not fit, and the report says so."""

from __future__ import annotations

import json
from pathlib import Path

from analysis.experiment import main
from tests.test_analysis_experiment import configs, fake_launcher  # noqa: F401 (fixtures)

# tiny's batch (8 x 64 tokens) on a GPU of 0.86 GiB: the planned peaks are 0.35 GiB for single and DDP and
# 0.31 for FSDP, and 0.86 GiB leaves (0.86 - 0.5) / 1.1 = 0.33 GiB for a peak (planner/plan.py's margin).
ONLY_FSDP_FITS = ["--gpu_memory_gib", "0.86"]


def test_strategies_that_do_not_fit_are_skipped_and_marked_in_the_report(
    tmp_path: Path, configs: Path, fake_launcher, capsys
) -> None:
    out = tmp_path / "exp"
    argv = ["--preset", "tiny", "--max_steps", "5", "--out", str(out), *ONLY_FSDP_FITS]
    assert main(argv, launcher=fake_launcher, config_dir=configs, echo=False) == 0
    printed = capsys.readouterr()
    assert "skipping single: does not fit (planned 0.35 GiB of 0.86 GiB" in printed.out
    assert "Traceback" not in printed.out + printed.err
    assert [r["strategy"] for r in json.loads((out / "runs" / "order.json").read_text())["runs"]] == ["fsdp"]
    report = (out / "report.md").read_text()
    assert "single: does not fit (planned 0.35 GiB of 0.86 GiB" in report
    assert "ddp: does not fit (planned 0.35 GiB of 0.86 GiB" in report


def test_nothing_that_fits_is_one_line_and_exit_2(tmp_path: Path, configs: Path, capsys) -> None:
    argv = [
        "--preset",
        "gpt2-xl",
        "--max_steps",
        "5",
        "--out",
        str(tmp_path / "exp"),
        "--gpu",
        "T4",
        "--strategies",
        "single",
        "ddp",
    ]
    assert main(argv, launcher=("true",), config_dir=configs) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no strategy fits gpt2-xl") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "exp").exists()
