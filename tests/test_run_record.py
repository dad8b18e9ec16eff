"""The run record (training/records/record.py): what train.py writes is what analysis/ reads back, old folders included."""

from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path

import pytest

from analysis.runs import load_run, sort_runs
from training.records.record import (
    BatchRecord,
    EffectiveRecord,
    EpochFigures,
    LaunchRecord,
    RequestedRecord,
    RunFacts,
    RunSummary,
    RunTotals,
    ScheduleRecord,
    StopRecord,
    run_summary,
)

SAMPLE_RUNS = Path(__file__).resolve().parent.parent / "docs" / "sample_report" / "runs"


def launch() -> LaunchRecord:
    return LaunchRecord(
        requested=RequestedRecord("fsdp", 2, "bf16"),
        effective=EffectiveRecord(
            "fsdp",
            2,
            1,
            "gloo",
            "FSDP",
            "FSDPModule",
            True,
            5000,
            10000,
            "bf16",
            "cpu",
            (0.5, 0.5),
            True,
            False,
            ("cpu",),
            0,
        ),
        run_name="fsdp-2x-bf16",
        device_name="cpu",
        threads_per_process=1,
        batch=BatchRecord(4, 2, 2, 16384, 16),
        schedule=ScheduleRecord(40, 20, 2),
        eval_blocks=8,
        model_config={"n_layer": 2, "n_embd": 64},
        n_params=10000,
        n_params_non_embedding=9000,
        flops_per_token=6e4,
        peak_flops_per_device=3e11,
        peak_flops_source="measured",
        data_stats={"cache_key": "abc123", "train": {"blocks": 100}},
        wandb_mode="disabled",
        levers={"compile": False, "tf32": False},
    )


def epoch(n: int) -> EpochFigures:
    return EpochFigures(
        n, False, 20, 20 * 16384, 6.5, 0, 1.2, 0, 0, 4.0, 81920.0, 40960.0, 5.0, 900.0, 880.0, 1000.0, 990.0, 6.4, 601.8
    )


def totals() -> RunTotals:
    return RunTotals(*[float(i) for i in range(1, len(fields(RunTotals)) + 1)])


def summary(stop: StopRecord | None = None) -> RunSummary:
    return run_summary(
        launch(),
        RunFacts(
            experiment="tiny-test",
            preset="tiny",
            seed=1337,
            block_size=128,
            sharding_observed={"params": "sharded"},
            memory={"step_peak_bytes": 123},
            steps=40,
            tokens_trained=40 * 16384,
            complete=stop is None,
            epochs=[epoch(1), epoch(2)],
            total=totals(),
            step_times_s=[0.2] * 40,
            skipped_step_numbers=[3],
            stop=stop,
        ),
    )


@pytest.mark.parametrize(
    "record",
    [launch(), summary(), summary(StopRecord("signal", 143, "stopped by SIGTERM"))],
    ids=["launch", "summary", "stopped summary"],
)
def test_round_trip_through_json(record) -> None:
    as_json = json.loads(json.dumps(record.to_dict()))
    assert type(record).from_dict(as_json) == record


def test_summary_takes_its_identity_from_the_launch_record() -> None:
    s = summary()
    assert (s.strategy, s.requested_strategy, s.world_size, s.precision) == ("fsdp", "fsdp", 2, "bf16")
    assert (s.data_key, s.micro_batch_size, s.grad_accum_steps, s.global_batch_tokens) == ("abc123", 4, 2, 16384)
    assert s.requested_precision == "bf16"
    fp32 = run_summary(
        replace(launch(), requested=RequestedRecord("single", 1, "no")),
        RunFacts(None, None, 1, 8, {}, None, 0, 0, False, [], totals(), [], []),
    )
    assert fp32.requested_precision == "fp32"


def test_stop_is_written_only_when_the_run_stopped_early() -> None:
    assert "stop" not in summary().to_dict()
    stopped = summary(StopRecord("nonfinite", 4, "diverged")).to_dict()
    assert list(stopped)[-1] == "stop" and stopped["stop"] == {
        "reason": "nonfinite",
        "exit_status": 4,
        "message": "diverged",
    }


def test_non_finite_figures_are_written_as_null() -> None:
    written = replace(summary(), total=replace(totals(), final_loss=float("nan"), mfu=float("inf"))).to_dict()
    assert written["total"]["final_loss"] is None and written["total"]["mfu"] is None
    json.dumps(written, allow_nan=False)


@pytest.mark.parametrize("name", ["single", "ddp", "fsdp"])
def test_the_sample_reports_summaries_load(name: str) -> None:
    raw = json.loads((SAMPLE_RUNS / name / "summary.json").read_text(encoding="utf-8"))
    record = RunSummary.from_dict(raw)
    assert record.to_dict() == raw  # nothing in them is unknown to the record, nothing is lost
    run = load_run(SAMPLE_RUNS / name)
    assert run.usable and run.complete and run.strategy == name
    assert run.record == record
    assert run.total.to_dict() == raw["total"] and [e.to_dict() for e in run.epochs] == raw["epochs"]
    assert run.fact("world_size") == raw["world_size"] and run.fact("memory") == raw["memory"]
    assert run.step_times_s == raw["step_times_s"]


def test_the_sample_reports_launch_records_load() -> None:
    for name in ("single", "ddp", "fsdp"):
        raw = json.loads((SAMPLE_RUNS / name / "config.json").read_text(encoding="utf-8"))["launch"]
        assert LaunchRecord.from_dict(raw).to_dict() == raw


def test_a_summary_missing_optional_keys_loads(tmp_path: Path) -> None:
    old = {
        "strategy": "ddp",
        "world_size": 2,
        "complete": True,
        "total": {"tokens_per_s": 1000.0},
        "epochs": [{"epoch": 1, "steps": 5}],
        "some_future_key": {"x": 1},
    }
    record = RunSummary.from_dict(old)
    assert record.strategy == "ddp" and record.seed is None and record.memory is None and record.stop is None
    assert record.total.tokens_per_s == 1000.0 and record.total.mfu is None
    assert record.epochs[0].steps == 5 and record.epochs[0].val_loss is None
    assert record.step_times_s is None

    (tmp_path / "summary.json").write_text(json.dumps(old), encoding="utf-8")
    run = load_run(tmp_path)
    assert run.usable and run.complete and run.strategy == "ddp"
    assert run.total.tokens_per_s == 1000.0 and run.total.mfu is None
    assert run.fact("seed") is None and run.fact("some_future_key") is None and run.fact("world_size") == 2
    assert run.step_times_s == []


def test_runs_sort_in_the_registry_order(tmp_path: Path) -> None:
    from training.distributed import registry

    runs = []
    for name in ("mystery", "fsdp_offload", "fsdp", "ddp", "single"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps({"strategy": name, "total": {}}), encoding="utf-8")
        runs.append(load_run(tmp_path / name))
    assert [r.strategy for r in sort_runs(runs)] == [
        *[n for n in registry.names() if n not in ("fsdp_zero2", "hsdp")],
        "mystery",
    ]
