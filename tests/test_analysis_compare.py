"""`python -m analysis.compare`: the report folder, broken runs, exit codes, self-contained HTML."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.compare import main
from tests.analysis_fixtures import FakeRun, three_strategies, write_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FIGURES = (
    "throughput_per_epoch.png",
    "grad_norm_per_epoch.png",
    "training_time_per_epoch.png",
    "peak_memory_per_epoch.png",
    "loss_per_epoch.png",
    "loss_vs_tokens.png",
    "step_time_distribution.png",
)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path], dict[Path, str]]:
    """One full report of three 3-epoch runs, shared by the tests that only read it (rendering is slow)."""
    root = tmp_path_factory.mktemp("three")
    run_dirs = three_strategies(root / "runs")
    before = _digests(run_dirs)
    assert main([*map(str, run_dirs), "--out", str(root / "report")]) == 0
    return root / "report", run_dirs, before


def _digests(run_dirs: list[Path]) -> dict[Path, str]:
    return {path: hashlib.sha256(path.read_bytes()).hexdigest() for d in run_dirs for path in d.iterdir()}


def test_report_folder_has_tables_figures_and_reports(report) -> None:
    out, _, _ = report
    for name in ("table.md", "table.csv", "report.md", "report.html", *FIGURES):
        assert (out / name).stat().st_size > 0, name
    for name in FIGURES:
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5_000, name
    assert not list(out.glob(".*.tmp")), "temporary files left behind"


def test_inputs_are_left_untouched(report) -> None:
    _, run_dirs, before = report
    assert _digests(run_dirs) == before


def test_html_is_self_contained(report) -> None:
    page = (report[0] / "report.html").read_text()
    sources = re.findall(r'(?:src|href)="([^"]*)"', page)
    assert len(sources) == len(FIGURES) and all(s.startswith("data:image/png;base64,") for s in sources)
    assert "<table>" in page and "<link" not in page and "<script" not in page


def test_markdown_report_links_every_figure_and_states_the_reading(report) -> None:
    text = (report[0] / "report.md").read_text()
    for name in FIGURES:
        assert f"]({name})" in text
    answer, notes = section(text, "Answer"), section(text, "Notes")
    # One run per strategy: the highest throughput leads, not established; memory is a count and is.
    assert "Speed: **ddp** leads" in answer and "(1 run each): not established" in answer
    assert "Memory: use **fsdp**" in answer
    assert "Loss curves agree within noise against single" in notes and "Fair comparison" in notes
    assert "Unfair" not in text and "## Problems" not in text
    assert "python -m analysis.compare" in text  # the command that produced it


def section(markdown: str, title: str) -> str:
    """The text of one `## title` section of report.md (the method section also names the verdicts)."""
    return markdown.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_report_says_when_loss_curves_differ_by_more_than_noise(tmp_path: Path) -> None:
    # fsdp ends 0.2 nats above the others, four times the step-to-step noise of 0.05 nats.
    run_dirs = three_strategies(tmp_path / "runs", fsdp={"loss_end": 6.2})
    assert main([*map(str, run_dirs), "--out", str(tmp_path / "out")]) == 0
    reading = section((tmp_path / "out" / "report.md").read_text(), "Notes")
    assert "Loss curves **differ by more than noise** (more than 2 sigma) against single" in reading
    assert "agree within noise" not in reading


def test_missing_summary_partial_run_and_corrupt_line_are_reported(tmp_path: Path, capsys) -> None:
    single, ddp, fsdp = three_strategies(tmp_path / "runs")
    (fsdp / "summary.json").unlink()  # crashed or still running
    summary = json.loads((ddp / "summary.json").read_text())
    summary["complete"] = False
    (ddp / "summary.json").write_text(json.dumps(summary))
    with (single / "metrics.jsonl").open("a") as stream:
        stream.write('{"kind": "train", "step": 61, "lo\n\n')  # a torn line and an empty one

    assert main([str(single), str(ddp), str(fsdp), "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert any("fsdp" in line and "no summary.json" in line for line in err)
    assert any("ddp" in line and "partial run" in line for line in err)
    assert any("single" in line and "2 empty or corrupt line(s)" in line for line in err)
    assert all(line.startswith("warning: ") for line in err)

    text = (tmp_path / "out" / "report.md").read_text()
    assert "1 run(s) left out of the comparison" in text and "no summary.json" in text
    assert "partial run" in text and "no (partial)" in text
    table = (tmp_path / "out" / "table.csv").read_text()
    assert "single" in table and "ddp" in table and "fsdp" not in table


def test_unequal_global_batches_raise_a_prominent_warning(tmp_path: Path) -> None:
    run_dirs = three_strategies(tmp_path / "runs", ddp={"global_batch_tokens": 16384})
    assert main([*map(str, run_dirs), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "report.md").read_text()
    warning = text.split("## Reading")[0]  # above the reading, not buried in it
    assert "> **Unfair comparison: global batch (tokens) differs**" in warning


def test_no_usable_run_exits_2(tmp_path: Path, capsys) -> None:
    crashed = write_run(tmp_path / "crashed", FakeRun())
    (crashed / "summary.json").unlink()
    assert main([str(crashed), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and "no report written" in err[-1]
    assert not (tmp_path / "out").exists()


def test_corrupt_summary_is_a_problem_not_a_crash(tmp_path: Path, capsys) -> None:
    good = write_run(tmp_path / "good", FakeRun())
    bad = write_run(tmp_path / "bad", FakeRun("ddp", 2))
    (bad / "summary.json").write_text('{"strategy": "ddp", ')
    assert main([str(good), str(bad), "--out", str(tmp_path / "out")]) == 0
    assert "summary.json is unreadable (JSONDecodeError)" in capsys.readouterr().err


def test_nonexistent_run_dir_exits_2_with_one_line(tmp_path: Path, capsys) -> None:
    good = write_run(tmp_path / "good", FakeRun())
    assert main([str(good), str(tmp_path / "nope"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: not a run directory:") and "nope" in err[0]


def test_one_epoch_single_run_still_renders(tmp_path: Path) -> None:
    run = write_run(tmp_path / "single", FakeRun(epochs=1, steps_per_epoch=5))
    assert main([str(run), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "report.md").read_text()
    assert "Fewer than two strategies have a figure to compare: nothing to decide." in text
    assert "cannot judge agreement" in text


def test_wandb_without_login_is_one_line_and_exit_2(tmp_path: Path) -> None:
    # A fresh HOME and no API key: wandb refuses before any network access, as on an offline machine.
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(
        HOME=str(tmp_path),
        NETRC=str(tmp_path / ".netrc"),
        WANDB_CONFIG_DIR=str(tmp_path / "wandb"),
        PYTHONPATH=str(Path(__file__).resolve().parents[1]),
    )
    # timeout: a bound only; without a key wandb refuses at once, and a hang would be the failure.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "analysis.compare",
            "--from_wandb",
            "me/proj",
            "--group",
            "g",
            "--out",
            str(tmp_path / "out"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot fetch W&B runs of me/proj, group 'g'")


def test_from_wandb_fetches_through_the_wandb_client(tmp_path: Path) -> None:
    """`--from_wandb` with the real W&B client against a W&B server on 127.0.0.1 holding the three runs:
    the report's table is the local one, and the client asked nothing the server does not implement."""
    from analysis.wandb_fetch import wandb_namespace
    from tests.test_analysis_wandb import as_wandb
    from tests.wandb_server import ENTITY, FakeWandbServer, RemoteRun

    local = three_strategies(tmp_path / "runs")
    assert main([*map(str, local), "--out", str(tmp_path / "local")]) == 0
    namespace = wandb_namespace()
    server = FakeWandbServer(projects={(ENTITY, "proj")}).start()
    server.runs.extend(RemoteRun(ENTITY, "proj", path.name, "tiny-test", *as_wandb(path, namespace)) for path in local)
    server.runs.append(RemoteRun(ENTITY, "proj", "elsewhere", "other-group", {}, {}, []))  # not in the group
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(
        HOME=str(tmp_path),
        NETRC=str(tmp_path / ".netrc"),
        WANDB_CONFIG_DIR=str(tmp_path / "wandb"),
        WANDB_BASE_URL=server.base_url,
        WANDB_API_KEY="f" * 40,  # a made-up key: only this server sees it
        PYTHONPATH=str(Path(__file__).resolve().parents[1]),
    )
    try:
        # 300 s: a bound only, so that a client retrying forever fails the test instead of stalling it.
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "analysis.compare",
                "--from_wandb",
                f"{ENTITY}/proj",
                "--group",
                "tiny-test",
                "--out",
                str(tmp_path / "fetched"),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    assert server.unknown_operations == []
    assert sorted(p.name for p in (tmp_path / "fetched" / "wandb_runs").iterdir()) == ["ddp", "fsdp", "single"]
    fetched_table = list(csv.reader(io.StringIO((tmp_path / "fetched" / "table.csv").read_text())))
    local_table = list(csv.reader(io.StringIO((tmp_path / "local" / "table.csv").read_text())))
    assert len(local_table) == 4 and fetched_table == local_table
