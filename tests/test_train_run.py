"""train.py end to end in one process: both sinks, consistent figures, the export, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.launch import REPO, launch_env, summary, train_lines

RUN_ARGS = [
    "--preset",
    "tiny",
    "--max_steps",
    "12",
    "--log_interval",
    "3",
    "--eval_interval",
    "6",
    "--checkpoint_interval",
    "6",
    "--experiment",
    "test-exp",
    "--seed",
    "11",
]


def _train(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "train.py", *args],
        cwd=REPO,
        env=env or launch_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )  # a hang guard; a run takes seconds


@pytest.fixture(scope="module")
def cache_dir(shared_cache: Path, machine_profile: Path) -> Path:
    return shared_cache  # the session's (tests/conftest.py): the CPU peak `planner measure` took once


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    """A tiny run on the bundled sample corpus, W&B in offline mode (no credentials on test machines)."""
    out = tmp_path_factory.mktemp("run") / "tiny"
    result = _train([*RUN_ARGS, "--output_dir", str(out), "--cache_dir", str(cache_dir)])
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def _wandb_records(run_dir: Path) -> list[dict[str, Any]]:
    (log,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    out = subprocess.run(
        [str(Path(sys.executable).with_name("wandb")), "leet", "inspect", "--json", str(log)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_run_writes_every_output(run_dir: Path) -> None:
    for name in ("metrics.jsonl", "summary.json", "config.json", "hf/config.json", "hf/model.safetensors"):
        assert (run_dir / name).is_file(), name
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_0000006", "step_0000012"]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["optim"]["max_steps"] == 12 and config["model"]["model_preset"] == "tiny"
    assert config["launch"]["effective"]["strategy"] == "single"
    assert config["launch"]["data_stats"]["source"]  # which data was used is recorded
    # The content key of the data goes into the summary, where the comparison checks it is shared.
    assert summary(run_dir)["data_key"] == config["launch"]["data_stats"]["cache_key"]
    assert len(summary(run_dir)["data_key"]) == 32


def test_every_lever_is_recorded_as_asked_and_as_in_effect(run_dir: Path) -> None:
    config = json.loads((run_dir / "config.json").read_text())
    asked = {
        "compile": "auto",
        "activation_checkpointing": False,
        "fused_adamw": "auto",
        "tf32": "auto",
        "pin_memory": True,
    }
    assert config["speed"] == asked
    in_effect = config["launch"]["levers"]
    assert in_effect == summary(run_dir)["levers"]
    assert (
        in_effect["compile"],
        in_effect["activation_checkpointing"],
        in_effect["fused_adamw"],
        in_effect["tf32"],
        in_effect["pin_memory"],
        in_effect["dataloader_workers"],
    ) == (False, "off", False, False, False, 0)
    assert "slower than eager" in in_effect["compile_reason"]  # the CPU default, with its reason
    (wandb_config,) = [r["config"]["update"] for r in _wandb_records(run_dir) if r["type"] == "config"]
    assert wandb_config["speed"] == asked and wandb_config["launch"]["levers"] == in_effect


def test_wandb_offline_run_holds_the_same_losses_as_metrics_jsonl(run_dir: Path) -> None:
    records = _wandb_records(run_dir)
    history = {r["history"]["item"]["_step"]: r["history"]["item"] for r in records if r["type"] == "history"}
    lines = train_lines(run_dir)
    epoch_ends = [
        sum(e["steps"] for e in summary(run_dir)["epochs"][: i + 1]) for i in range(len(summary(run_dir)["epochs"]))
    ]
    assert sorted(lines) == sorted({3, 6, 9, 12, *epoch_ends})  # every log_interval, and each epoch's end
    for step, line in lines.items():
        assert history[step]["train/loss"] == line["loss"]
        assert history[step]["train/grad_norm"] == line["grad_norm"]
        assert history[step]["perf/tokens_per_s"] == line["tokens_per_s"]
    evals = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"eval"' in x]
    assert [e["step"] for e in evals] == sorted({6, 12, *epoch_ends})
    assert history[12]["val/loss"] == evals[-1]["val_loss"]
    (run,) = [r["run"] for r in records if r["type"] == "run"]
    assert run["job_type"] == "single" and run["run_group"] == "test-exp"


def test_every_wandb_report_panel_key_is_in_the_logged_wandb_run(run_dir: Path) -> None:
    from analysis.wandb_report import bar_panels, line_panels

    records = _wandb_records(run_dir)
    rows = [r["history"]["item"] for r in records if r["type"] == "history"]
    summary = {key for r in records if r["type"] == "summary" for key in r["summary"]["update"]}
    for panel in line_panels():
        assert {panel.x, *panel.metrics} <= {key for row in rows for key in row}, panel.title
        # W&B plots a point only where x is in the same row: every row with the metric holds tokens.
        assert all(panel.x in row for row in rows if set(panel.metrics) & set(row)), panel.title
    for panel in bar_panels():
        assert set(panel.metrics) <= summary, panel.title


def test_throughput_is_tokens_over_the_measured_interval(run_dir: Path) -> None:
    by_step = train_lines(run_dir)
    lines = [by_step[s] for s in sorted(by_step)]
    assert len(lines) >= 4
    for before, after in zip(lines, lines[1:]):
        tokens = after["tokens"] - before["tokens"]
        seconds = after["elapsed_s"] - before["elapsed_s"]
        assert after["tokens_per_s"] == pytest.approx(tokens / seconds, rel=1e-9)
        assert after["step_time_s"] == pytest.approx(seconds / (after["step"] - before["step"]), rel=1e-9)
        assert after["samples_per_s"] == pytest.approx(after["tokens_per_s"] / 64, rel=1e-9)
    s = summary(run_dir)
    assert s["tokens_trained"] == 12 * s["global_batch_tokens"] == 12 * 1024
    assert s["total"]["train_time_s"] == pytest.approx(sum(s["step_times_s"]), rel=1e-9)
    assert s["total"]["tokens_per_s"] == pytest.approx(s["tokens_trained"] / s["total"]["train_time_s"], rel=1e-9)
    assert sum(e["steps"] for e in s["epochs"]) == 12


def test_summary_records_units_memory_and_mfu(run_dir: Path) -> None:
    s = summary(run_dir)
    t = s["total"]
    assert s["complete"] and s["precision"] == "fp32" and s["device_type"] == "cpu"
    assert 50 < t["peak_mem_allocated_mib_max"] < 24 * 1024  # a process's peak RSS, in MiB
    assert 0 < t["mfu"] < 1 and s["peak_flops_source"].startswith("measured")
    assert t["eval_time_s"] > 0 and t["checkpoint_time_s"] > 0
    assert t["final_val_ppl"] == pytest.approx(2.718281828 ** t["final_val_loss"], rel=1e-6)


def test_export_loads_in_transformers_and_generates(run_dir: Path) -> None:
    import transformers

    model = transformers.GPT2LMHeadModel.from_pretrained(run_dir / "hf")
    tokenizer = transformers.AutoTokenizer.from_pretrained(run_dir / "hf")
    assert tokenizer.model_max_length == model.config.n_positions
    generator = transformers.pipeline("text-generation", model=model, tokenizer=tokenizer)
    text = generator("The mayor", max_new_tokens=3, do_sample=False)[0]["generated_text"]
    # The greedy continuation, computed independently of the export: the trained model of the run's last
    # checkpoint (step 12, the end of the run), one argmax per new token.
    import torch

    from training.checkpoints.store import load_model_from_checkpoint

    ours = load_model_from_checkpoint(run_dir / "checkpoints" / "step_0000012").eval()
    ids = tokenizer("The mayor")["input_ids"]
    with torch.no_grad():
        for _ in range(3):
            logits = ours(torch.tensor([ids]))[0]
            ids.append(int(logits[0, -1].argmax()))
    assert text == tokenizer.decode(ids)


def _one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    return lines[0]


def test_missing_data_path_is_one_line_error(tmp_path: Path, cache_dir: Path) -> None:
    result = _train(
        [
            "--preset",
            "tiny",
            "--data",
            str(tmp_path / "nope.csv"),
            "--output_dir",
            str(tmp_path / "o"),
            "--cache_dir",
            str(cache_dir),
            "--wandb_mode",
            "disabled",
        ]
    )
    assert result.returncode == 2
    assert "nope.csv" in _one_error_line(result)


def test_an_existing_run_is_never_overwritten_by_accident(run_dir: Path, cache_dir: Path) -> None:
    before = {p: p.read_bytes() for p in (run_dir / "metrics.jsonl", run_dir / "summary.json")}
    result = _train(
        [*RUN_ARGS, "--output_dir", str(run_dir), "--cache_dir", str(cache_dir), "--wandb_mode", "disabled"]
    )
    assert result.returncode == 2
    assert "--resume" in _one_error_line(result)
    assert {p: p.read_bytes() for p in before} == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--resume"], "no complete checkpoint"),
        (["--global_batch_tokens", "1000"], "not a multiple"),
        (["--block_size", "512"], "exceeds the model's 256 positions"),
        (["--strategy", "fsdp"], "--strategy fsdp was requested but the launch config gives single"),
    ],
)
def test_bad_settings_are_one_line_errors(tmp_path: Path, cache_dir: Path, args: list[str], message: str) -> None:
    result = _train(
        [
            "--preset",
            "tiny",
            "--output_dir",
            str(tmp_path / "o"),
            "--cache_dir",
            str(cache_dir),
            "--wandb_mode",
            "disabled",
            *args,
        ]
    )
    assert result.returncode in (2, 3)
    assert message in _one_error_line(result)
    assert not (tmp_path / "o" / "metrics.jsonl").exists()


# Settings the command line itself refuses, before any training code runs: train.main in this process.
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max_steps", "-3"], "--max_steps must be > 0"),
        (["--wandb_finish_timeout_s", "-1"], "--wandb_finish_timeout_s must be >= 0"),
    ],
)
def test_bad_command_line_values_are_one_line_errors(
    tmp_path: Path, cache_dir: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import train

    status = train.main(
        [
            "--preset",
            "tiny",
            "--output_dir",
            str(tmp_path / "o"),
            "--cache_dir",
            str(cache_dir),
            "--wandb_mode",
            "disabled",
            *args,
        ]
    )
    err = capsys.readouterr().err
    assert status == 2
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in err, err
    assert not (tmp_path / "o" / "metrics.jsonl").exists()


def test_help_lists_every_config_section(capsys: pytest.CaptureFixture[str]) -> None:
    import train

    with pytest.raises(SystemExit) as exited:
        train.main(["--help"])
    assert exited.value.code in (0, None)
    stdout = capsys.readouterr().out
    for flag in (
        "--preset",
        "--data",
        "--max_steps",
        "--epochs",
        "--output_dir",
        "--seed",
        "--resume",
        "--global_batch_tokens",
        "--micro_batch_size",
        "--block_size",
        "--experiment",
    ):
        assert flag in stdout


def test_no_secret_from_the_environment_reaches_the_run_files_or_the_output(tmp_path: Path, cache_dir: Path) -> None:
    secrets = {
        "WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567",
        "HF_TOKEN": "hf_notarealtokenXYZ123",
        "GITHUB_TOKEN": "ghp_notarealtokenXYZ123456",
    }
    # Offline: with a key W&B's auto mode would go online, and this machine has no network.
    env = {**launch_env(), **secrets, "WANDB_MODE": "offline"}
    out = tmp_path / "run"
    result = _train(
        [
            "--preset",
            "tiny",
            "--max_steps",
            "3",
            "--output_dir",
            str(out),
            "--cache_dir",
            str(cache_dir),
            "--checkpoint_interval",
            "1",
        ],
        env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    files = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name.endswith(".wandb") for p in files) and any(p.name == "config.json" for p in files)
    for secret in secrets.values():
        assert secret not in result.stdout + result.stderr
        leaks = [p for p in files if secret.encode() in p.read_bytes()]
        assert not leaks, f"{secret[:6]}... found in {leaks}"


def test_epochs_cut_short_by_the_step_budget_are_marked_partial(run_dir: Path) -> None:
    s = summary(run_dir)
    per_epoch = json.loads((run_dir / "config.json").read_text())["launch"]["schedule"]["steps_per_epoch"]
    assert 12 % per_epoch, "the run must end inside an epoch for this test to mean anything"
    assert [e["partial"] for e in s["epochs"]] == [e["steps"] < per_epoch for e in s["epochs"]]
    assert s["epochs"][-1]["partial"] and not s["epochs"][0]["partial"]


def test_the_export_is_as_readable_as_the_rest_of_the_run_directory(run_dir: Path) -> None:
    import os

    umask = os.umask(0)
    os.umask(umask)
    assert (run_dir / "hf").stat().st_mode & 0o777 == 0o777 & ~umask
    for path in (run_dir / "hf").iterdir():
        assert path.stat().st_mode & 0o777 == 0o666 & ~umask, path.name
    assert (run_dir / "hf" / "model.safetensors").stat().st_mode & 0o777 == (
        run_dir / "summary.json"
    ).stat().st_mode & 0o777


def test_train_py_ends_as_the_interpreter_would_but_without_its_teardown(tmp_path: Path) -> None:
    """The exit train.py takes (after the run, whatever its status): a thread still running is waited for,
    exit handlers run (the run lock's release among them), buffered output reaches the pipe, the status is
    kept; only the interpreter's teardown, where gloo's worker threads could abort the process, is skipped."""
    program = f"""
import atexit, sys, threading, time
sys.path.insert(0, {str(REPO)!r})
import train
from training.run_folder import acquire_run_lock
acquire_run_lock(__import__("pathlib").Path({str(tmp_path)!r}))
threading.Thread(target=lambda: (time.sleep(0.3), print("thread finished", flush=True))).start()
atexit.register(lambda: print("exit handler ran", end=""))  # no newline: lost unless the exit flushes it
train.exit_without_teardown(7)
print("never printed")
"""
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )
    assert result.returncode == 7, result.stderr
    assert result.stdout.splitlines() == ["thread finished", "exit handler ran"]
    assert (tmp_path / ".lock").read_text() == ""  # released by its exit handler: no holder named
