"""The experiment driver: one command per strategy with shared seed, data and a divisible global batch;
failures reported with exit code and log tail while the other strategies still run and are compared."""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path

import pytest

from analysis.experiment import Batch, ExperimentSpec, SetupError, build_launches, choose_batch, main, world_sizes
from tests.analysis_fixtures import write_launch_configs
from training.distributed.registry import config_files

CONFIG_FILES = config_files()  # each strategy's launch config, as the driver takes it from the registry

REPO = Path(__file__).resolve().parents[1]
TINY = {"block_size": 64, "micro_batch_size": 8, "global_batch_tokens": 16 * 64}


@pytest.fixture
def configs(tmp_path: Path) -> Path:
    return write_launch_configs(tmp_path)


def spec(tmp_path: Path, **changes) -> ExperimentSpec:
    values = dict(
        preset="tiny", out=tmp_path / "exp", max_steps=20, data=("a.csv", "b.csv"), seed=7, experiment="tiny-exp"
    )
    return ExperimentSpec(**{**values, **changes})


def flag(argv: tuple[str, ...], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_world_sizes_come_from_the_yaml_files(configs: Path) -> None:
    assert world_sizes(("single", "ddp", "fsdp"), configs) == {"single": 1, "ddp": 2, "fsdp": 2}
    (configs / "fsdp.yaml").write_text("num_processes: 4\n")
    assert world_sizes(("fsdp",), configs) == {"fsdp": 4}
    with pytest.raises(SetupError, match="not found"):
        world_sizes(("ddp",), configs / "missing")


def test_num_processes_sets_ddp_and_fsdp_and_is_passed_to_accelerate(tmp_path: Path, configs: Path, capsys) -> None:
    assert world_sizes(("single", "ddp", "fsdp"), configs, 1) == {"single": 1, "ddp": 1, "fsdp": 1}
    assert world_sizes(("single", "fsdp"), configs, 4) == {"single": 1, "fsdp": 4}
    out = tmp_path / "exp"
    argv = [
        "--preset",
        "tiny",
        "--max_steps",
        "5",
        "--out",
        str(out),
        "--strategies",
        "single",
        "fsdp",
        "--num_processes",
        "1",
        "--dry_run",
    ]
    assert main(argv, launcher=("accelerate", "launch"), config_dir=configs) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "global batch 1,024 tokens" in lines[0] and "single 2, fsdp 2" in lines[0]  # not raised for 2
    single, fsdp = (line for line in lines if line.startswith("accelerate launch"))
    assert "--num_processes" not in single
    assert re.match(r"accelerate launch --config_file \S+/fsdp\.yaml --num_processes 1 \S*train\.py ", fsdp)
    with pytest.raises(SetupError, match="num_processes must be > 0"):
        spec(tmp_path, num_processes=0)


@pytest.mark.parametrize("sizes", [[1, 2, 2], [1, 2, 4], [1, 3]])
def test_chosen_global_batch_is_divisible_for_every_world_size(tmp_path: Path, sizes: list[int]) -> None:
    batch = choose_batch(spec(tmp_path), sizes, TINY)
    for world_size in sizes:
        assert batch.global_batch_tokens % (8 * 64 * world_size) == 0
    assert batch.global_batch_tokens >= TINY["global_batch_tokens"]  # the preset's, raised only if needed
    assert choose_batch(spec(tmp_path), [1, 2, 2], TINY).global_batch_tokens == 1024


def test_a_given_global_batch_is_checked_not_changed(tmp_path: Path) -> None:
    assert choose_batch(spec(tmp_path, global_batch_tokens=4096), [1, 2], TINY).global_batch_tokens == 4096
    with pytest.raises(SetupError, match=r"not a multiple .* = 1024; use 2048 or 3072"):
        choose_batch(spec(tmp_path, global_batch_tokens=2500), [1, 2], TINY)


def test_the_driver_takes_trainings_batch_rule_and_defaults(tmp_path: Path) -> None:
    from training.config import OptimConfig
    from training.geometry import batch_geometry

    # A preset that sets only the block size: the micro-batch is OptimConfig's, the batch one per process.
    batch = choose_batch(spec(tmp_path), [1, 2, 3], {"block_size": 64})
    assert batch.micro_batch_size == OptimConfig().micro_batch_size
    for world_size in (1, 2, 3):
        optim = OptimConfig(micro_batch_size=batch.micro_batch_size, global_batch_tokens=batch.global_batch_tokens)
        assert batch_geometry(optim, 64, world_size).grad_accum_steps == batch.grad_accum(world_size)


def test_every_strategy_gets_the_same_seed_data_batch_and_group(tmp_path: Path, configs: Path) -> None:
    sizes = {"single": 1, "ddp": 2, "fsdp": 2}
    batch = Batch(micro_batch_size=8, block_size=64, global_batch_tokens=2048)
    launches = build_launches(
        spec(tmp_path, extra=("--overwrite",)), sizes, batch, ("accelerate", "launch"), cwd=tmp_path, config_dir=configs
    )
    assert [launch.strategy for launch in launches] == ["single", "ddp", "fsdp"]
    for launch in launches:
        argv = launch.argv
        assert argv[:2] == ("accelerate", "launch")
        assert flag(argv, "--config_file") == f"configs/{CONFIG_FILES[launch.strategy]}"
        assert flag(argv, "--seed") == "7" and flag(argv, "--experiment") == "tiny-exp"
        assert flag(argv, "--global_batch_tokens") == "2048" and flag(argv, "--micro_batch_size") == "8"
        assert flag(argv, "--max_steps") == "20" and flag(argv, "--preset") == "tiny"
        assert argv[argv.index("--data") + 1 : argv.index("--data") + 3] == ("a.csv", "b.csv")
        assert flag(argv, "--output_dir") == str(tmp_path / "exp" / "runs" / launch.strategy)
        assert flag(argv, "--strategy") == launch.strategy and argv[-1] == "--overwrite"
        assert launch.log == tmp_path / "exp" / "runs" / f"{launch.strategy}.log"
    assert batch.grad_accum(1) == 4 and batch.grad_accum(2) == 2


def test_epochs_instead_of_steps(tmp_path: Path, configs: Path) -> None:
    batch = Batch(8, 64, 1024)
    (launch,) = build_launches(
        spec(tmp_path, max_steps=None, epochs=2, strategies=("ddp",)),
        {"ddp": 2},
        batch,
        ("accelerate", "launch"),
        cwd=tmp_path,
        config_dir=configs,
    )
    assert flag(launch.argv, "--epochs") == "2" and "--max_steps" not in launch.argv


def test_spec_needs_exactly_one_budget(tmp_path: Path) -> None:
    with pytest.raises(SetupError, match="exactly one"):
        spec(tmp_path, epochs=3)


FAKE_TRAIN = """
    import json, sys
    from pathlib import Path
    sys.path.insert(0, {repo!r})
    from tests.analysis_fixtures import FakeRun, write_run

    argv = sys.argv[1:]
    out, strategy = Path(argv[argv.index("--output_dir") + 1]), argv[argv.index("--strategy") + 1]
    print("fake training", strategy, flush=True)
    if strategy == "ddp":
        out.mkdir(parents=True)
        (out / "metrics.jsonl").write_text("")
        # As under torchrun: the rank's own error line, then the launcher's failure report.
        print("error: NCCL error: unhandled system error", file=sys.stderr)
        print("Traceback (most recent call last):\\n  File launch.py\\nChildFailedError:", file=sys.stderr)
        print("=" * 60 + "\\ntrain.py FAILED\\n" + "-" * 60 + "\\n" + "=" * 60, file=sys.stderr)
        sys.exit(3)
    world = 1 if strategy == "single" else 2
    tokens = int(argv[argv.index("--global_batch_tokens") + 1])
    write_run(out, FakeRun(strategy, world, global_batch_tokens=tokens, seed=int(argv[argv.index("--seed") + 1])))
    (out / "argv.json").write_text(json.dumps(argv))
"""


@pytest.fixture
def fake_launcher(tmp_path: Path) -> tuple[str, ...]:
    script = tmp_path / "fake_train.py"
    script.write_text(textwrap.dedent(FAKE_TRAIN.format(repo=str(REPO))))
    return (sys.executable, str(script))


def test_a_failing_strategy_is_reported_and_the_others_compared(
    tmp_path: Path, configs: Path, fake_launcher, capsys
) -> None:
    out = tmp_path / "exp"
    argv = ["--preset", "tiny", "--max_steps", "20", "--out", str(out), "--seed", "11", "--experiment", "e1"]
    assert main(argv, launcher=fake_launcher, config_dir=configs, echo=False) == 1

    err = capsys.readouterr().err
    assert "ddp: FAILED, exit code 3" in err and "NCCL error" in err
    assert "NCCL error" in (out / "runs" / "ddp.log").read_text()
    assert "fake training single" in (out / "runs" / "single.log").read_text()
    for strategy in ("single", "fsdp"):
        launched = json.loads((out / "runs" / strategy / "argv.json").read_text())
        assert flag(tuple(launched), "--seed") == "11" and flag(tuple(launched), "--global_batch_tokens") == "1024"

    report = (out / "report.md").read_text()
    assert "ddp: training failed with exit code 3" in report
    assert "cause: error: NCCL error: unhandled system error" in report  # its own line, not the launcher's =====
    assert "1 run(s) left out" in report  # the failed run's directory has no summary.json
    table = (out / "table.csv").read_text()
    assert "single" in table and "fsdp" in table


def test_all_finishing_exits_0(tmp_path: Path, configs: Path, fake_launcher) -> None:
    out = tmp_path / "exp"
    argv = [
        "--preset",
        "tiny",
        "--max_steps",
        "5",
        "--out",
        str(out),
        "--strategies",
        "single",
        "fsdp",
        "--gpu_hour_price",
        "1.75",
    ]
    assert main(argv, launcher=fake_launcher, config_dir=configs, echo=False) == 0
    assert (out / "report.html").exists()
    report = (out / "report.md").read_text()  # the price reaches the report and its command
    assert "--gpu_hour_price 1.75" in report and "Cost per million tokens at 1.75 per device-hour" in report


def test_dry_run_prints_commands_and_launches_nothing(tmp_path: Path, configs: Path, capsys) -> None:
    out = tmp_path / "exp"
    argv = ["--preset", "tiny", "--epochs", "1", "--out", str(out), "--dry_run", "--extra", "--lr", "3e-4"]
    assert main(argv, launcher=("accelerate", "launch"), config_dir=configs) == 0
    lines = capsys.readouterr().out.splitlines()
    commands = [line for line in lines if line.startswith("accelerate launch")]
    assert len(commands) == 3 and all(c.endswith("--lr 3e-4") for c in commands)
    assert lines[-1].startswith("python -m analysis.compare")
    assert any(
        line.startswith("predicted wall time: none with --epochs (the steps depend on the data") for line in lines
    )
    assert not out.exists()


def test_the_plan_predicts_the_experiments_wall_time_and_the_report_sets_it_against_the_runs(
    tmp_path: Path, configs: Path, fake_launcher, capsys
) -> None:
    out = tmp_path / "exp"
    argv = ["--preset", "tiny", "--max_steps", "5", "--out", str(out), "--strategies", "single", "fsdp"]
    argv += ["--repeats", "2", "--gpu", "T4"]
    assert main(argv, launcher=fake_launcher, config_dir=configs, echo=False) == 0
    printed = capsys.readouterr().out
    line = next(line for line in printed.splitlines() if line.startswith("predicted wall time: "))
    assert "of training steps (single " in line and " on T4 (fp16, 65.0 TFLOP/s peak" in line
    assert printed.index("predicted wall time") < printed.index("wrote ")  # said before the runs, not with the report
    prediction = json.loads((out / "prediction.json").read_text())
    for strategy in ("single", "fsdp"):  # strategies x repeats x steps
        assert prediction["runs"][strategy] == 2
        assert prediction["seconds"][strategy] == pytest.approx(prediction["step_s"][strategy] * 5 * 2)
    assert prediction["total_s"] == pytest.approx(sum(prediction["seconds"].values()))
    assert all(0 < step_s < 1 for step_s in prediction["step_s"].values())  # the tiny model on a T4: milliseconds
    report = (out / "report.md").read_text()
    # The fake runs train 60 steps of 1,024 tokens at 40,000 tokens/s: 1.536 s each, 2 repeats: 3.07 s.
    single = f"single {prediction['seconds']['single']:.3g} s predicted, 3.07 s measured"
    assert "Plan against measurement (training steps; T4 (fp16" in report and single in report
    assert "of wall time in all (runs/order.json)" in report


@pytest.mark.multiprocess  # the session's profile: `python -m planner measure` spawns its processes
def test_without_a_gpu_the_prediction_is_for_this_cpu_as_its_profile_measured_it(
    tmp_path: Path, configs: Path, machine_profile: Path, capsys
) -> None:
    argv = ["--preset", "tiny", "--max_steps", "5", "--out", str(tmp_path / "exp"), "--dry_run"]
    assert main(argv, launcher=("accelerate", "launch"), config_dir=configs) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("predicted wall time: "))
    assert "on this CPU (fp32, 1 thread(s) per process" in line and str(machine_profile) in line
    assert "assumed" not in line  # every figure measured, none the planner's default
    assert not (tmp_path / "exp").exists()  # a dry run writes no prediction


def test_without_a_gpu_or_a_machine_profile_the_experiment_says_how_to_measure_one(
    tmp_path: Path, configs: Path, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("GPT2S_CACHE", str(tmp_path / "empty"))
    argv = ["--preset", "tiny", "--max_steps", "5", "--out", str(tmp_path / "exp"), "--dry_run"]
    assert main(argv, launcher=("accelerate", "launch"), config_dir=configs) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("predicted wall time: "))
    assert line.startswith("predicted wall time: none (no machine profile at ") and "python -m planner measure" in line


def test_setup_errors_are_one_line_and_exit_2(tmp_path: Path, configs: Path, capsys) -> None:
    argv = ["--preset", "tiny", "--max_steps", "5", "--out", str(tmp_path), "--global_batch_tokens", "1000"]
    assert main(argv, launcher=("true",), config_dir=configs) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --global_batch_tokens 1000 is not a multiple")


def test_a_launcher_that_cannot_start_is_a_failure(tmp_path: Path, configs: Path) -> None:
    argv = ["--preset", "tiny", "--max_steps", "5", "--out", str(tmp_path / "exp"), "--strategies", "single"]
    assert main(argv, launcher=(str(tmp_path / "no-such-launcher"),), config_dir=configs, echo=False) == 1
    assert "cannot start" in (tmp_path / "exp" / "runs" / "single.log").read_text()


def test_wandb_report_without_a_login_says_in_one_line_how_to_build_it_later(
    tmp_path: Path, configs: Path, fake_launcher, monkeypatch, capsys
) -> None:
    from tests.wandb_stub import log_out

    log_out(monkeypatch, tmp_path)
    out = tmp_path / "exp"
    argv = [
        "--preset",
        "tiny",
        "--max_steps",
        "5",
        "--out",
        str(out),
        "--strategies",
        "single",
        "fsdp",
        "--experiment",
        "tiny-test",
        "--wandb_report",
    ]
    assert main(argv, launcher=fake_launcher, config_dir=configs, echo=False) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if "W&B report" in line]
    assert line.startswith("W&B report not built (not logged in to W&B); build it later with: wandb login && ")
    runs = [out / "runs" / "single", out / "runs" / "fsdp"]
    assert f"wandb sync {runs[0]}/wandb/offline-run-* {runs[1]}/wandb/offline-run-* && " in line
    assert line.endswith(
        f"python -m analysis.wandb_report --experiment tiny-test --project gpt2-strategies --runs {runs[0]} {runs[1]}"
    )


def test_wandb_report_when_logged_in_is_built_from_the_run_directories(
    tmp_path: Path, configs: Path, fake_launcher, monkeypatch, capsys
) -> None:
    from tests.wandb_stub import StubBackend, install

    backend = install(monkeypatch, StubBackend(entity="me"))
    argv = [
        "--preset",
        "tiny",
        "--max_steps",
        "5",
        "--out",
        str(tmp_path / "exp"),
        "--experiment",
        "tiny-test",
        "--wandb_report",
    ]
    assert main(argv, launcher=fake_launcher, config_dir=configs, echo=False) == 1  # ddp fails: still 1
    out = capsys.readouterr().out
    assert "W&B report: https://wandb.stub/me/gpt2-strategies/reports/Strategy-comparison:-tiny-test--" in out
    text = json.dumps(backend.saved_specs())
    # The answer of the two runs that finished, at equal throughput in the fake training, one run each:
    assert "Speed: **single** leads, 40,400 tokens/s; 1.00x fsdp (1 run each): not established" in text
    assert "runs/ddp" not in text.split("Produced by")[-1]  # the failed strategy left no summary.json


def test_dry_run_prints_the_wandb_report_command(tmp_path: Path, configs: Path, capsys) -> None:
    out = tmp_path / "exp"
    argv = ["--preset", "tiny", "--epochs", "1", "--out", str(out), "--experiment", "e2", "--dry_run", "--wandb_report"]
    assert main(argv, launcher=("accelerate", "launch"), config_dir=configs) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == (
        f"python -m analysis.wandb_report --experiment e2 --runs {out}/runs/single {out}/runs/ddp {out}/runs/fsdp"
    )


def test_the_cause_of_a_failure_without_an_error_line_is_its_last_meaningful_line(tmp_path: Path) -> None:
    from analysis.experiment import failure_cause

    log = tmp_path / "x.log"
    log.write_text("step 3/10 loss=4.2\rKilled\n\n" + "=" * 40 + "\n")
    assert failure_cause(log) == "Killed"
    log.write_text("error: first\nmore\nerror: --block_size 2048 exceeds the model's 1024 positions\n-----\n")
    assert failure_cause(log) == "error: --block_size 2048 exceeds the model's 1024 positions"
    log.write_text("")
    assert failure_cause(log) == "(no output)"


def test_the_other_fsdp_modes_are_strategies_of_their_own(tmp_path: Path, capsys) -> None:
    # The project's own config files: both modes launch 2 processes, --num_processes sets them as for fsdp.
    assert world_sizes(("fsdp_zero2", "fsdp_offload"), REPO / "accelerate_configs") == {
        "fsdp_zero2": 2,
        "fsdp_offload": 2,
    }
    assert world_sizes(("fsdp_zero2", "fsdp_offload"), REPO / "accelerate_configs", 1) == {
        "fsdp_zero2": 1,
        "fsdp_offload": 1,
    }
    batch = Batch(micro_batch_size=8, block_size=64, global_batch_tokens=2048)
    launches = build_launches(
        spec(tmp_path, strategies=("single", "fsdp_zero2", "fsdp_offload")),
        {"single": 1, "fsdp_zero2": 2, "fsdp_offload": 2},
        batch,
        ("accelerate", "launch"),
        cwd=REPO,
        config_dir=REPO / "accelerate_configs",
    )
    assert [flag(launch.argv, "--config_file") for launch in launches] == [
        "accelerate_configs/single_gpu.yaml",
        "accelerate_configs/fsdp_zero2.yaml",
        "accelerate_configs/fsdp_offload.yaml",
    ]
    assert [flag(launch.argv, "--strategy") for launch in launches] == ["single", "fsdp_zero2", "fsdp_offload"]
    assert [launch.run_dir.name for launch in launches] == ["single", "fsdp_zero2", "fsdp_offload"]
    assert ExperimentSpec(preset="tiny", out=tmp_path, max_steps=1).strategies == ("single", "ddp", "fsdp")


def test_a_strategy_spanning_machines_is_launched_on_each_with_its_rank(tmp_path: Path, capsys) -> None:
    common = [
        "--preset",
        "tiny",
        "--max_steps",
        "5",
        "--out",
        str(tmp_path / "exp"),
        "--dry_run",
        "--main_process_ip",
        "10.0.0.1",
        "--num_processes",
        "1",
    ]
    # Machine rank 0 trains every strategy; HSDP keeps its config's 4 processes and learns where it runs.
    assert main([*common, "--strategies", "single", "fsdp", "hsdp"], launcher=("accelerate", "launch")) == 0
    lines = capsys.readouterr().out.splitlines()
    commands = {flag(tuple(c.split()), "--strategy"): c.split() for c in lines if c.startswith("accelerate launch")}
    assert list(commands) == ["single", "fsdp", "hsdp"]
    # The batch fits HSDP's 4 processes (all machines'): the preset's 16 blocks are raised to 4 x 8.
    assert "global batch 2,048 tokens" in lines[0] and "fsdp 4, hsdp 1" in lines[0]
    hsdp = tuple(commands["hsdp"])
    assert (flag(hsdp, "--machine_rank"), flag(hsdp, "--main_process_ip")) == ("0", "10.0.0.1")
    assert "--num_processes" not in hsdp and flag(tuple(commands["fsdp"]), "--num_processes") == "1"
    # Machine rank 1 joins HSDP only; machine rank 0's report is the experiment's.
    assert (
        main(
            [*common, "--strategies", "single", "fsdp", "hsdp", "--machine_rank", "1"],
            launcher=("accelerate", "launch"),
        )
        == 0
    )
    commands = [c for c in capsys.readouterr().out.splitlines() if c.startswith("accelerate launch")]
    assert len(commands) == 1 and flag(tuple(commands[0].split()), "--machine_rank") == "1"


@pytest.mark.parametrize(
    "args,message",
    [
        (["--strategies", "hsdp"], "hsdp spans machines: give --main_process_ip"),
        (["--strategies", "ddp", "--machine_rank", "1"], "only machine rank 0 trains strategies that do not span"),
    ],
)
def test_bad_machine_settings_are_one_line_and_exit_2(tmp_path: Path, capsys, args: list[str], message: str) -> None:
    argv = ["--preset", "tiny", "--max_steps", "5", "--out", str(tmp_path), "--dry_run", *args]
    assert main(argv, launcher=("accelerate", "launch")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_the_command_line_and_the_spec_are_one_thing(tmp_path: Path) -> None:
    """Every field is a flag: a spec with each one changed from its default comes back whole from the command line
    it gives (the notebook runs the driver that way), and a hand-written command line gives the hand-built spec."""
    from dataclasses import fields

    from analysis.experiment import parse_spec
    from training.cli import command_line

    changed = ExperimentSpec(
        preset="tiny", out=tmp_path / "exp", epochs=2, strategies=("fsdp", "hsdp"), data=("a.csv", "b c.csv"),
        seeds=(3, 4), repeats=2, global_batch_tokens=4096, micro_batch_size=2, block_size=64, experiment="e",
        num_processes=1, machine_rank=1, main_process_ip="10.0.0.1", gpu_hour_price=1.75, gpu="T4",
        gpu_memory_gib=15.0, precision="bf16", target_loss=5.5, dry_run=True, wandb_report=True, check_exports=True,
        extra=("--overwrite", "--lr", "3e-4"),
    )  # fmt: skip
    defaults = ExperimentSpec(preset="tiny", out=tmp_path, max_steps=1)
    unchanged = {f.name for f in fields(ExperimentSpec) if getattr(changed, f.name) == getattr(defaults, f.name)}
    assert unchanged == {"preset", "seed"}  # --seeds stands for --seed
    assert parse_spec(command_line(changed)) == changed
    written = ["--preset", "tiny", "--max_steps", "3", "--out", str(tmp_path), "--seed", "5", "--extra", "--lr", "1"]
    assert parse_spec(written) == ExperimentSpec(preset="tiny", out=tmp_path, max_steps=3, seed=5, extra=("--lr", "1"))
