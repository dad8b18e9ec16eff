"""The W&B report: its specification (dry run), its panels against what train.py logs, the reading it
carries, the wandb-workspaces objects it becomes, and the live path: the real `wandb.Api` and
wandb-workspaces against a W&B server on 127.0.0.1 (tests/wandb_server.py), which answers only the
GraphQL operations it implements; a test fails when any other arrives."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from analysis.compare import main as compare_main
from analysis.wandb_fetch import wandb_namespace
from analysis.wandb_report import bar_panels, line_panels, main, to_wandb_report, wandb_metric
from tests.analysis_fixtures import three_strategies
from tests.test_analysis_wandb import as_wandb
from tests.wandb_server import ENTITY, VIEW_ID, FakeWandbServer, RemoteRun
from training.records.sinks import WANDB_KEYS, WANDB_SUMMARY_PREFIX

GROUP = "tiny-test"  # the experiment of the fixture runs


@pytest.fixture
def runs(tmp_path: Path) -> list[Path]:
    return three_strategies(tmp_path / "runs")


def dry_run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["--experiment", GROUP, "--dry_run", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def panels(spec: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    grids = [block for block in spec["blocks"] if block["type"] == "panel_grid"]
    return [panel for grid in grids for panel in grid["panels"] if panel["kind"] == kind]


def markdown(spec: dict[str, Any]) -> str:
    return "\n".join(block["text"] for block in spec["blocks"] if block["type"] == "markdown")


def total_keys_written_by_training() -> set[str]:
    """The "total" keys of summary.json, from the function train.py computes them with."""
    from training.records.metrics import (
        EpochMemory,
        MetricsTracker,
        RunTimes,
        StepRecord,
        ThroughputFacts,
        eval_line,
        total_summary,
    )

    tracker = MetricsTracker.__new__(MetricsTracker)  # no Accelerator: total_summary needs only these
    tracker.perf_warmup_steps = 1
    tracker.facts = ThroughputFacts(
        tokens_per_step=1024, samples_per_step=16, world_size=2, flops_per_token=1e6, peak_flops_per_device=1e12
    )
    tracker.records = [StepRecord(i, 1, 1024 * i, 5.0, 1.0, 1e-3, 0.1, warmup=i == 1) for i in range(1, 5)]
    tracker.memory = EpochMemory(100.0, 90.0, 120.0, 110.0)
    total = total_summary(tracker, [], RunTimes(train_s=0.4), 1.0, eval_line(4, 1, 4096, 5.0, 0.1), open_epoch=True)
    return {key for key, value in vars(total).items() if value is not None}


# ---------------------------------------------------------------------------------------------
# The specification


def test_runset_is_the_experiments_group_grouped_by_strategy(runs: list[Path], capsys) -> None:
    spec = dry_run(["--project", "proj", "--runs", *map(str, runs)], capsys)
    runset = spec["runset"]
    assert runset["filters"] == [{"key": "Group", "op": "=", "value": GROUP}]
    assert runset["group_by"] == ["JobType"]  # train.py's job type is the arm (the strategy in effect unless --arm)
    assert runset["project"] == spec["project"] == "proj"
    assert runset["entity"] is None and spec["entity"] is None  # unknown until built with a login


def test_panels_cover_the_five_metrics_and_mfu(capsys) -> None:
    spec = dry_run([], capsys)
    lines = {m for p in panels(spec, "line") for m in p["metrics"]}
    bars = {m for p in panels(spec, "bar") for m in p["metrics"]}
    # loss (and validation loss), grad norm, throughput, peak memory per device: against tokens
    assert {"train/loss", "val/loss", "train/grad_norm", "perf/tokens_per_s", "mem/peak_allocated_mib"} <= lines
    # time, throughput without warm-up, peak allocated and reserved memory, MFU, final loss: whole run
    assert {
        "total/train_time_s",
        "total/tokens_per_s_excl_warmup",
        "total/peak_mem_allocated_mib_max",
        "total/peak_mem_reserved_mib_max",
        "total/mfu",
        "total/final_loss",
    } <= bars


def test_every_panel_key_is_a_key_training_logs(capsys) -> None:
    spec = dry_run([], capsys)
    logged_history = set(WANDB_KEYS.values())
    logged_summary = {WANDB_SUMMARY_PREFIX + key for key in total_keys_written_by_training()}
    for panel in panels(spec, "line"):
        assert {panel["x"], *panel["metrics"]} <= logged_history, panel["title"]
    for panel in panels(spec, "bar"):
        assert set(panel["metrics"]) <= logged_summary, panel["title"]
    assert len(panels(spec, "line")) >= 5 and len(panels(spec, "bar")) >= 6


def test_a_metric_training_does_not_log_fails_the_build() -> None:
    assert wandb_metric("grad_norm") == "train/grad_norm"
    with pytest.raises(Exception, match="'grad_norm_renamed' is not logged to W&B"):
        wandb_metric("grad_norm_renamed")


def test_line_plots_run_against_tokens_when_global_batches_differ(tmp_path: Path, capsys) -> None:
    unequal = three_strategies(tmp_path / "runs", ddp={"global_batch_tokens": 16384})
    spec = dry_run(["--runs", *map(str, unequal)], capsys)
    assert [p["x"] for p in panels(spec, "line")] == [WANDB_KEYS["tokens"]] * len(panels(spec, "line"))
    assert all(p["x_title"] == "tokens trained (whole job)" for p in panels(spec, "line"))
    assert "**Unfair comparison: global batch (tokens) differs**" in markdown(spec)


def test_the_reading_is_the_local_reports(runs: list[Path], tmp_path: Path, capsys) -> None:
    assert compare_main([*map(str, runs), "--out", str(tmp_path / "local")]) == 0
    local = (tmp_path / "local" / "report.md").read_text()
    answer = re.search(r"## Answer\n\n(.*?)\n\n", local, re.S).group(1).splitlines()
    notes = re.search(r"## Notes\n\n(.*?)\n\n", local, re.S).group(1).splitlines()
    capsys.readouterr()
    text = markdown(dry_run(["--runs", *map(str, runs)], capsys))
    assert len(answer) == 2 and len(notes) >= 4
    for line in [*answer, *notes]:
        assert line in text
    # The answer comes first in the W&B report too, its table under it.
    assert text.index(answer[0]) < text.index("| strategy | runs |") < text.index(notes[0])
    assert "Fair comparison: all 3 runs share global batch (tokens) 8,192" in text  # the fairness facts
    assert "Produced by `python -m analysis.wandb_report --experiment tiny-test --dry_run --runs" in text


def test_the_reading_carries_the_time_to_target_and_its_verdicts(runs: list[Path], capsys) -> None:
    text = markdown(dry_run(["--runs", *map(str, runs), "--target_loss", "7"], capsys))
    assert "- Time to loss 7: **" in text and "(1 run each): not established" in text
    assert "| time to loss 7 (s) |" in text
    assert "Time to loss" not in markdown(dry_run(["--runs", *map(str, runs)], capsys))


def test_without_runs_the_dry_run_says_where_the_reading_comes_from(tmp_path: Path, monkeypatch, capsys) -> None:
    log_out(monkeypatch, tmp_path)  # a dry run needs no login
    text = markdown(dry_run(["--title", "My comparison"], capsys))
    assert "filled in from the runs when the report is built online" in text
    assert "Throughput:" not in text


def test_dry_run_writes_the_specification_to_a_file(tmp_path: Path, capsys) -> None:
    out = tmp_path / "spec.json"
    assert main(["--experiment", "g1", "--dry_run", "--out", str(out), "--title", "T"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote the report specification to {out}"
    spec = json.loads(out.read_text())
    assert spec["title"] == "T" and spec["runset"]["filters"][0]["value"] == "g1"


def test_runs_of_another_experiment_are_refused(runs: list[Path], capsys) -> None:
    assert main(["--experiment", "other", "--dry_run", "--runs", *map(str, runs)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "belongs to experiment 'tiny-test', not 'other'" in err[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "the following arguments are required: --experiment"),
        (["--experiment", "it's"], "which a W&B report filter cannot express"),
        (["--experiment", "g", "--runs", "/no/such/run"], "not a run directory: /no/such/run"),
        (["--experiment", "g", "--title", "x" * 129], "--title must be 1 to 128 characters"),
    ],
)
def test_bad_arguments_are_one_line_errors(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--dry_run"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]


# ---------------------------------------------------------------------------------------------
# wandb-workspaces objects, offline


def test_the_specification_becomes_wandb_workspaces_objects_offline(runs: list[Path], capsys) -> None:
    import wandb_workspaces.reports.v2 as wr

    from analysis.wandb_report import build_spec, reading_of

    spec = build_spec(GROUP, "proj", None, None, "cmd", reading_of(runs, GROUP), "the runs")
    report = to_wandb_report(spec)
    assert isinstance(report, wr.Report) and report.title == f"Strategy comparison: {GROUP}"
    grids = [b for b in report.blocks if isinstance(b, wr.PanelGrid)]
    assert [type(p).__name__ for p in grids[0].panels] == ["LinePlot"] * len(line_panels())
    assert [type(p).__name__ for p in grids[1].panels] == ["BarPlot"] * len(bar_panels())
    # The library's own serialisation, short of the project lookup that needs the server:
    runset = grids[0].runsets[0]._to_model().model_dump(by_alias=True, exclude_none=True)
    assert runset["filters"]["filters"] == [
        {"key": {"section": "run", "name": "group"}, "op": "=", "value": GROUP, "disabled": False}
    ]
    assert [key.name for key in grids[0].runsets[0]._to_model().grouping] == ["jobType"]
    line = grids[0].panels[0]._to_model().model_dump(by_alias=True, exclude_none=True)
    assert line["config"]["xAxis"] == "train/tokens" and line["config"]["metrics"] == ["train/loss"]
    bar = grids[1].panels[4]._to_model().model_dump(by_alias=True, exclude_none=True)
    assert bar["viewType"] == "Bar Chart" and bar["config"]["metrics"] == ["total/mfu"]


# ---------------------------------------------------------------------------------------------
# The live path: without a login, and against the local W&B server


def log_out(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No W&B credentials in the environment or in a netrc file."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The local W&B server, logged in to with a made-up key; the report's project exists there.

    After the test, no GraphQL operation the server does not implement may have arrived: each was
    answered with an error, and one the client sent unseen would make the test pass for the wrong reason.
    """
    fake = FakeWandbServer(projects={("team", "gpt2-strategies"), ("team", "proj"), (ENTITY, "p2")}).start()
    for name in [k for k in os.environ if k.startswith("WANDB_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("WANDB_BASE_URL", fake.base_url)
    monkeypatch.setenv("WANDB_API_KEY", "f" * 40)  # made up: only this server sees it
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    try:
        yield fake
    finally:
        fake.stop()
    assert fake.unknown_operations == []


def graphql(fake: FakeWandbServer, operation: str) -> list[dict[str, Any]]:
    """The variables of every `operation` request the server received, in order."""
    return [json.loads(r.body).get("variables") or {} for r in fake.requests if r.operation == operation]


def report_url(fake: FakeWandbServer, entity: str, project: str) -> str:
    return f"{fake.base_url}/{entity}/{project}/reports/Strategy-comparison:-{GROUP}--{VIEW_ID}"


def test_without_a_login_it_is_one_line_and_exit_2(tmp_path: Path, monkeypatch, capsys) -> None:
    log_out(monkeypatch, tmp_path)
    assert main(["--experiment", GROUP]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: not logged in to W&B")
    assert "wandb login" in err[0] and "--dry_run" in err[0]


def test_live_path_saves_the_report_on_the_server(runs: list[Path], tmp_path: Path, server, capsys) -> None:
    out = tmp_path / "sent.json"
    assert main(["--experiment", GROUP, "--entity", "team", "--runs", *map(str, runs), "--out", str(out)]) == 0
    url = capsys.readouterr().out.strip().splitlines()[-1]
    assert url == report_url(server, "team", "gpt2-strategies")

    lookups = graphql(server, "ProjectInternalId")
    assert lookups and all(v == {"entityName": "team", "projectName": "gpt2-strategies"} for v in lookups)
    (sent,) = server.views
    assert sent["entityName"] == "team" and sent["type"] == "runs" and sent["displayName"].endswith(GROUP)
    saved = json.loads(sent["spec"])
    blocks = saved["blocks"]
    grids = [b for b in blocks if b["type"] == "panel-grid"]
    assert len(grids) == 2
    for grid in grids:
        (runset,) = grid["metadata"]["runSets"]
        assert runset["project"] == {"entityName": "team", "name": "gpt2-strategies", "id": "internal-1"}
        assert runset["filters"]["filters"][0]["value"] == GROUP
    sent_metrics = {
        m for g in grids for p in g["metadata"]["panelBankSectionConfig"]["panels"] for m in p["config"]["metrics"]
    }
    assert sent_metrics == {m for p in (*line_panels(), *bar_panels()) for m in p.metrics}
    assert "Speed: **ddp** leads" in json.dumps(blocks)
    assert json.loads(out.read_text())["entity"] == "team"  # --out records what was sent


def test_live_path_fetches_the_reading_from_wandb(tmp_path: Path, server, capsys) -> None:
    namespace = wandb_namespace()
    for number, run_dir in enumerate(three_strategies(tmp_path / "runs")):
        server.runs.append(RemoteRun(ENTITY, "p2", f"run{number}", GROUP, *as_wandb(run_dir, namespace)))
    server.runs.append(RemoteRun(ENTITY, "p2", "other", "another-group", {}, {}, []))  # not fetched
    assert main(["--experiment", GROUP, "--project", "p2"]) == 0
    assert capsys.readouterr().out.strip().endswith(report_url(server, ENTITY, "p2"))  # the login's default entity
    asked = graphql(server, "Runs")
    assert asked and all(
        (v["entity"], v["project"], json.loads(v["filters"])) == (ENTITY, "p2", {"group": GROUP}) for v in asked
    )
    histories = {v["run"] for v in graphql(server, "HistoryPage")} | {
        v["runName"] for v in graphql(server, "RunParquetHistory")
    }
    assert histories == {"run0", "run1", "run2"}
    text = server.views[0]["spec"]
    assert "Speed: **ddp** leads" in text and f"fetched from W&B ({ENTITY}/p2)" in text


def test_a_backend_that_refuses_is_one_line_and_exit_2(runs: list[Path], server, capsys) -> None:
    server.refuse = "permission denied for entity team"
    assert main(["--experiment", GROUP, "--entity", "team", "--runs", *map(str, runs)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0] == "error: cannot save the W&B report to team/gpt2-strategies: permission denied for entity team"
    assert server.views == []


def test_an_empty_group_on_wandb_is_one_line_and_exit_2(server, capsys) -> None:
    assert main(["--experiment", "nothing-here", "--entity", "team"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no W&B runs in team/gpt2-strategies with group 'nothing-here'" in err[0]
    assert [json.loads(v["filters"]) for v in graphql(server, "Runs")] == [{"group": "nothing-here"}]


# ---------------------------------------------------------------------------------------------
# At the end of an experiment


def logged_as(run_dirs: list[Path], mode: str) -> None:
    """Record in config.json the W&B mode train.py ran with, as a real run does."""
    for run_dir in run_dirs:
        config = json.loads((run_dir / "config.json").read_text())
        config["launch"] = {"wandb_mode": mode}
        config["run"] |= {"wandb_project": "proj", "wandb_entity": "team"}
        (run_dir / "config.json").write_text(json.dumps(config))


def test_after_an_experiment_logged_offline_it_says_how_to_sync_and_build(runs, server, capsys) -> None:
    from analysis.wandb_report import report_after_experiment

    # logged in now (the server fixture), but the runs went to offline files
    logged_as(runs, "offline")
    assert report_after_experiment(GROUP, runs) is False
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert line.startswith("W&B report not built (not every run was logged online); build it later with: wandb sync ")
    assert "wandb login" not in line
    assert line.endswith(f"--experiment {GROUP} --project proj --entity team --runs {' '.join(map(str, runs))}")
    assert report_after_experiment(GROUP, runs, 7.0) is False  # the experiment's --target_loss goes along
    assert "--entity team --target_loss 7 --runs " in capsys.readouterr().out
    assert server.requests == []


def test_after_an_experiment_without_wandb_nothing_is_built(runs, server, capsys) -> None:
    from analysis.wandb_report import report_after_experiment

    logged_as(runs, "disabled")
    assert report_after_experiment(GROUP, runs) is False
    assert capsys.readouterr().err.strip() == (
        "W&B report not built: the runs were not logged to W&B (--wandb_mode disabled)"
    )
    assert report_after_experiment("it's", runs) is False  # no exit from inside the experiment driver
    assert "which a W&B report filter cannot express" in capsys.readouterr().err
    assert server.requests == []


def test_after_an_experiment_logged_online_the_report_goes_to_the_runs_project(runs, server, capsys) -> None:
    from analysis.wandb_report import report_after_experiment

    logged_as(runs, "online")
    assert report_after_experiment(GROUP, runs) is True
    assert capsys.readouterr().out.strip() == f"W&B report: {report_url(server, 'team', 'proj')}"
    assert [v["projectName"] for v in server.views] == ["proj"]


# ---------------------------------------------------------------------------------------------
# Which entity the report goes to


def _log_runs_to(runs: list[Path], entity: str) -> None:
    for run in runs:
        config = json.loads((run / "config.json").read_text())
        config.setdefault("run", {})["wandb_entity"] = entity
        (run / "config.json").write_text(json.dumps(config))


def test_wandb_entity_in_the_environment_aims_the_report(monkeypatch, capsys) -> None:
    monkeypatch.setenv("WANDB_ENTITY", "team")
    spec = dry_run([], capsys)
    assert spec["entity"] == "team" and spec["runset"]["entity"] == "team"


def test_the_runs_own_entity_beats_the_environment_and_the_flag_beats_both(runs, monkeypatch, capsys) -> None:
    monkeypatch.setenv("WANDB_ENTITY", "someone")
    _log_runs_to(runs, "team")
    assert dry_run(["--runs", *map(str, runs)], capsys)["entity"] == "team"
    assert dry_run(["--runs", *map(str, runs), "--entity", "other"], capsys)["entity"] == "other"


def test_without_any_entity_the_dry_run_leaves_it_to_the_login(monkeypatch, capsys) -> None:
    monkeypatch.delenv("WANDB_ENTITY", raising=False)
    assert dry_run([], capsys)["entity"] is None


def test_two_arms_of_one_strategy_are_two_wandb_groups(tmp_path: Path) -> None:
    # The report groups by JobType: an A/A experiment's ddp and ddp#2 must log two job types, or W&B
    # draws both arms as one strategy's band.
    from types import SimpleNamespace

    from training.config import RunConfig
    from training.trainer import _start_wandb

    job_types = []
    for arm in (None, "ddp#2"):
        started: list[dict[str, Any]] = []
        record = SimpleNamespace(
            effective=SimpleNamespace(strategy="ddp", precision="fp32"), run_name="r", wandb_mode="offline"
        )
        trainer = SimpleNamespace(
            cfg=SimpleNamespace(run=RunConfig(experiment=GROUP, strategy="ddp", arm=arm)),
            wandb=SimpleNamespace(start=lambda project, resolved, kwargs, out=started: out.append(kwargs)),
            out=tmp_path,
            is_main=False,
            launch=record,
            resolved={},
        )
        _start_wandb(trainer)
        job_types.append(started[0]["job_type"])
    assert job_types == ["ddp", "ddp#2"]
