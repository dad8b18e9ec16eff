"""notebooks/support.py: the plan for the devices there are, the data found, the all-reduce retry, W&B
credentials from the environment only, the requirements check and the driver command."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from notebooks import support


@pytest.mark.parametrize(
    "gpus, strategies, processes, preset",
    [
        (0, ["single", "ddp", "fsdp"], None, "tiny"),
        (1, ["single"], 1, "gpt2"),
        (2, ["single", "ddp", "fsdp"], None, "gpt2"),
    ],
)
def test_plan_follows_the_devices(gpus: int, strategies: list[str], processes: int | None, preset: str) -> None:
    plan = support.plan_run("auto", None, gpus)
    assert (plan.strategies, plan.num_processes, plan.preset) == (strategies, processes, preset)
    assert plan.max_steps == support.DEFAULT_STEPS[preset]
    assert support.plan_run("tiny", 4, gpus).max_steps == 4


def test_driver_command_passes_only_what_the_plan_needs(tmp_path: Path) -> None:
    from analysis.experiment import parse_spec

    one_gpu = support.plan_run("auto", 7, 1)
    data = support.DataChoice(["a.csv", "b.csv"], ["--hf_dataset", "x"], "")
    spec = support.experiment_spec(one_gpu, tmp_path, "exp", data, "--text_column article")
    command = support.experiment_command(spec)
    assert command[:3] == [sys.executable, "-m", "analysis.experiment"]
    joined = " ".join(command)
    assert "--strategies single --data a.csv b.csv" in joined  # one process each: no --num_processes
    assert joined.endswith("--extra --hf_dataset x --text_column article")
    assert parse_spec(command[3:]) == spec  # the driver reads back the experiment the notebook built
    empty = support.DataChoice([], [], "")
    cpu = support.experiment_command(support.experiment_spec(support.plan_run("tiny", 4, 0), tmp_path, "exp", empty))
    assert "--num_processes" not in cpu and "--data" not in cpu and "--extra" not in cpu


def test_all_the_news_is_found_wherever_it_is_mounted(tmp_path: Path, monkeypatch) -> None:
    mounted = tmp_path / "input" / "datasets" / "someone" / "all-the-news"
    mounted.mkdir(parents=True)
    for name in ("articles2.csv", "articles1.csv", "articles3.csv"):
        (mounted / name).write_text(",id,title,content\n")
    monkeypatch.setattr(support, "KAGGLE_INPUT", tmp_path / "input")
    choice = support.choose_data("auto", "gpt2", tmp_path / "out")
    assert [Path(p).name for p in choice.paths] == ["articles1.csv", "articles2.csv", "articles3.csv"]
    assert "All the News, 3 file(s)" in choice.note


def test_without_the_dataset_the_sample_is_used_and_said(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(support, "find_all_the_news", lambda: [])
    tiny = support.choose_data("auto", "tiny", tmp_path)
    assert tiny.paths == [] and "bundled sample" in tiny.note
    gpt2 = support.choose_data("auto", "gpt2", tmp_path)  # 1024-token blocks: the sample repeated
    (corpus,) = gpt2.paths
    assert len(Path(corpus).read_text().splitlines()) == 64 * 40
    assert support.choose_data("hf:user/news", "gpt2", tmp_path).train_args == ["--hf_dataset", "user/news"]
    assert support.choose_data("my dir/*.csv other.txt", "gpt2", tmp_path).paths == ["my", "dir/*.csv", "other.txt"]


def test_a_hanging_allreduce_is_killed_and_retried_without_p2p(monkeypatch) -> None:
    seen = []

    def fake_run(command, env, timeout_s):
        seen.append(env.get("NCCL_P2P_DISABLE"))
        return support._Result(len(seen) == 2, "hung (no result after 1 s)", "")

    monkeypatch.setattr(support, "_run_with_timeout", fake_run)
    monkeypatch.setenv("NCCL_P2P_DISABLE", "")  # recorded, so that teardown restores the environment
    monkeypatch.delenv("NCCL_P2P_DISABLE")
    assert "ok with NCCL_P2P_DISABLE=1" in support.allreduce_check(2, timeout_s=1)
    assert seen == [None, "1"] and os.environ["NCCL_P2P_DISABLE"] == "1"

    seen.clear()
    monkeypatch.setattr(support, "_run_with_timeout", lambda c, e, t: support._Result(False, "hung", "last words"))
    with pytest.raises(RuntimeError, match="(?s)hung even with NCCL_P2P_DISABLE=1.*last words"):
        support.allreduce_check(2, timeout_s=1)


def _gone(pid: int) -> bool:
    """The process has ended: it no longer exists, or only its exit status is left (a zombie)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_command_past_its_timeout_is_killed_with_its_children() -> None:
    # The parent starts a child that would sleep a minute, says its id, and sleeps too. The child does not
    # hold the output pipe, so a child that is not killed does not keep the call waiting: it outlives it.
    command = [
        sys.executable,
        "-c",
        "import subprocess, sys, time; "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
        "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
        "print('child', child.pid, flush=True); time.sleep(60)",
    ]
    # 5 s: long enough for a loaded machine to start the two interpreters before the timeout strikes.
    result = support._run_with_timeout(command, dict(os.environ), timeout_s=5)
    assert not result.ok and result.problem.startswith("hung")
    (child,) = [int(line.split()[1]) for line in result.output.splitlines() if line.startswith("child ")]
    try:
        # Polled until the child has ended; the bound only stops a survivor from hanging the test, and is
        # far below the child's own 60 s, so a child left alive fails here rather than ending by itself.
        deadline = time.monotonic() + 15
        while not _gone(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(child), f"the child {child} outlived the timeout"
    finally:
        if not _gone(child):
            os.kill(child, signal.SIGKILL)


def test_wandb_key_from_the_environment_is_never_shown(monkeypatch, tmp_path: Path, capsys) -> None:
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert support.wandb_setup()[0] is False
    key = "f" * 40
    monkeypatch.setenv("WANDB_API_KEY", key)
    online, note = support.wandb_setup()
    assert online and "the environment" in note and key not in note
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert support.wandb_setup()[0] is False
    assert key not in capsys.readouterr().out


def test_missing_requirements_are_the_unsatisfied_lines(tmp_path: Path) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("# comment\ntorch>=1  # installed\ntorch<1\nno-such-package-gpt2s>=1\npytest<1\n")
    assert support.missing_requirements(requirements) == ["torch<1", "no-such-package-gpt2s>=1"]  # not pytest


def test_torch_is_never_installed() -> None:
    with pytest.raises(RuntimeError, match="torch"):
        support.install(["torch>=99"])


def test_estimate_orders_the_strategies_by_their_work() -> None:
    minutes = support.estimate_minutes("gpt2", 500, ["single", "ddp", "fsdp"], 2)
    # With the planner's default overlap (DDP's all-reduce in backward, FSDP prefetching) both hide most of their
    # communication behind the compute on 2 x T4; what cannot hide (DDP's last bucket, FSDP's root unit) leaves
    # them within a few percent of each other (docs/planning.md), both well ahead of one GPU.
    assert max(minutes["ddp"], minutes["fsdp"]) < minutes["single"]
    assert abs(minutes["ddp"] - minutes["fsdp"]) < 0.05 * minutes["fsdp"]
    assert 5 < sum(minutes.values()) < 60  # the default is sized for one sitting, well within a Kaggle session


def test_report_section(tmp_path: Path) -> None:
    report = tmp_path / "report.md"
    report.write_text("# R\n\n## Reading\n\n- a\n- b\n\n## Table\n\n| x |\n")
    assert support.report_section(report, "Reading") == "- a\n- b"
    assert support.report_section(report, "Missing") == ""


def test_one_gpu_runs_single_and_says_why_ddp_and_fsdp_are_skipped() -> None:
    plan = support.plan_run("auto", None, 1)
    assert plan.strategies == ["single"]
    (note,) = plan.notes
    assert "ddp, fsdp need two GPUs" in note and "skipped" in note
    assert note in plan.describe()


def test_the_wandb_report_is_asked_for_only_when_told(tmp_path: Path) -> None:
    plan, data = support.plan_run("tiny", 4, 0), support.DataChoice([], [], "")
    asked = support.experiment_spec(plan, tmp_path, "exp", data, wandb_report=True)
    assert "--wandb_report" in support.experiment_command(asked)
    assert "--wandb_report" not in support.experiment_command(support.experiment_spec(plan, tmp_path, "exp", data))


def _logged_run(out: Path, strategy: str, entity: str | None, project: str) -> None:
    (out / "runs" / strategy).mkdir(parents=True)
    config = {"run": {"wandb_entity": entity, "wandb_project": project}, "launch": {"wandb_mode": "online"}}
    (out / "runs" / strategy / "config.json").write_text(json.dumps(config))


def test_wandb_links_use_the_runs_own_entity_and_project(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("WANDB_ENTITY", raising=False)
    _logged_run(tmp_path, "single", "team", "their-project")
    assert support.wandb_place(tmp_path) == ("team", "their-project")
    assert support.wandb_group_url("exp", tmp_path) == "https://wandb.ai/team/their-project/groups/exp"


def test_without_a_recorded_entity_wandb_entity_is_used(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_ENTITY", "lab")
    _logged_run(tmp_path, "single", None, "p")
    assert support.wandb_group_url("exp", tmp_path) == "https://wandb.ai/lab/p/groups/exp"
