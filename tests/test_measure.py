"""The machine profile (planner/profile.py) and `python -m planner measure` (planner/measure.py): what the command
writes, how plans and `planner --run` read it, and what they say without one."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from planner.cli import main
from planner.errors import PlanError
from planner.plan import compare_run
from planner.profile import (
    PROFILE_VERSION,
    ComputeRate,
    MachineProfile,
    age_note,
    profile_path,
    read_profile,
    write_profile,
)

RATE = ComputeRate("tiny", 2, 1, "fp32", "cpu", 8, 64, mfu=0.2, peak_flops=1e11, adamw_gb_s=10.0)
LINK = {"backend": "gloo", "world_size": 2, "bus_gb_s": 1.0}


def _profile(**changes) -> MachineProfile:
    return replace(MachineProfile({"cpu_model": "A"}, "2026-12-01T00:00:00Z", (RATE,), {}), **changes)


def test_a_profile_is_read_back_as_written(tmp_path: Path) -> None:
    written = _profile(links={"2": LINK})
    assert write_profile(tmp_path / "p.json", written) == written
    assert read_profile(tmp_path / "p.json") == written


def test_a_later_measurement_adds_to_the_profile_and_replaces_what_it_measured_again(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    write_profile(path, _profile(links={"2": LINK}))
    again = replace(RATE, mfu=0.3)
    other = replace(RATE, preset="mini")
    four = {**LINK, "world_size": 4}
    merged = write_profile(
        path, _profile(measured_at="2026-12-02T00:00:00Z", compute=(again, other), links={"4": four})
    )
    assert read_profile(path) == merged and merged.measured_at == "2026-12-02T00:00:00Z"
    assert merged.compute_for("tiny", 2, 1) == again and merged.compute_for("mini", 2, 1) == other
    assert len(merged.compute) == 2 and merged.link_for(2) == LINK and merged.link_for(4) == four
    assert merged.link_for(3) is None


def test_a_rate_that_is_not_a_positive_number_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    data = _profile().to_dict()
    data["compute"][0]["mfu"] = float("nan")  # a GPU without a peak in the table would have given this
    path.write_text(json.dumps(data))
    with pytest.raises(PlanError, match="not a machine profile"):
        read_profile(path)


def test_a_rate_is_found_only_for_its_preset_processes_threads_and_precision() -> None:
    profile = _profile()
    assert profile.compute_for("tiny", 2, 1) == RATE
    for other in (("mini", 2, 1, "fp32"), ("tiny", 1, 1, "fp32"), ("tiny", 2, 2, "fp32"), ("tiny", 2, 1, "fp16")):
        assert profile.compute_for(*other) is None


@pytest.mark.parametrize(
    "content, says",
    [
        (None, "no machine profile at"),
        ("{not json", "cannot be read as a machine profile"),
        (json.dumps({"version": PROFILE_VERSION + 1}), f"expected {PROFILE_VERSION}"),
        (json.dumps({"version": PROFILE_VERSION, "machine": {}}), "not a machine profile"),
    ],
)
def test_a_missing_or_broken_profile_is_one_line_naming_the_command(tmp_path: Path, content, says) -> None:
    path = tmp_path / "p.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(PlanError, match=says) as error:
        read_profile(path)
    assert "\n" not in str(error.value)


def test_the_age_note_says_how_long_before_or_after_the_run_it_was_measured() -> None:
    profile = _profile(measured_at="2026-12-01T00:00:00Z")
    assert "older than the run: 12.0 hour(s) before it started" in age_note(profile, "2026-12-01T12:00:00+00:00")
    assert "3 day(s) after the run started" in age_note(profile, "2026-11-28T00:00:00+00:00")
    assert age_note(profile, "not a time") == "measured 2026-12-01T00:00:00Z"


def test_the_path_is_one_per_machine(tmp_path: Path) -> None:
    one = profile_path(tmp_path, {"cpu_model": "A", "torch_version": "2.13.0"})
    assert one == profile_path(tmp_path, {"torch_version": "2.13.0", "cpu_model": "A"})
    assert one != profile_path(tmp_path, {"cpu_model": "A", "torch_version": "2.14.0"})
    assert one.parent == tmp_path / "hardware"


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--presets", "huge"], "unknown preset(s) huge"),
        (["--presets", ""], "unknown preset(s)"),
        (["--processes", "0,2"], "--processes takes positive integers"),
        (["--processes", "two"], "--processes takes positive integers"),
        (["--threads", "0"], "--threads must be >= 1"),
        (["--precision", "bf16", "--device", "cpu"], "runs on the CPU train in fp32"),
    ],
)
def test_measure_refuses_bad_input_in_one_line_before_measuring(argv, says, capsys, tmp_path: Path) -> None:
    assert main(["measure", "--cache_dir", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and says in err[0]
    assert not (tmp_path / "hardware").exists()  # nothing measured, nothing written


@pytest.mark.multiprocess
def test_the_session_profile_holds_every_layout_measured(machine_profile: Path) -> None:
    """`python -m planner measure` at its defaults (tests/conftest.py): tiny on 1 and 2 processes of one thread and
    on one process of torch's own thread count (a plain `python train.py`), each figure measured (positive); and
    the link between two, none between one."""
    profile = read_profile(machine_profile)
    one, two = profile.compute_for("tiny", 1, 1), profile.compute_for("tiny", 2, 1)
    assert one is not None and two is not None and profile.link_for(2)["world_size"] == 2
    assert profile.link_for(1) is None and set(profile.links) == {"2"}
    for rate in (one, two):
        assert 0 < rate.mfu < 1 and rate.peak_flops > 0 and rate.adamw_gb_s > 0 and rate.device == "cpu"
    assert profile.machine["torch_version"] and profile.measured_at.endswith("Z")


@pytest.mark.multiprocess
def test_a_run_is_priced_from_the_profile_and_without_one_says_what_it_assumed(
    shared_runs, machine_profile: Path, tmp_path: Path, monkeypatch
) -> None:
    run = shared_runs["ddp"]
    profile = read_profile(machine_profile)
    summary = json.loads((run / "summary.json").read_text())
    rate = profile.compute_for(summary["preset"], 2, summary["threads_per_process"])
    t = compare_run(run, profile=machine_profile)["step_time"]
    assert t["mfu_given"] == rate.mfu and t["host_update_gb_s"] == rate.adamw_gb_s and t["predicted_s"] > 0
    assert "older than the run" in t["basis"]  # measured before the session's launches
    assert compare_run(run, mfu=0.5, profile=machine_profile)["step_time"]["mfu_given"] == 0.5  # --mfu wins
    # No profile for this machine: the planner's assumptions, said; a two-process run has no link to price.
    monkeypatch.setenv("GPT2S_CACHE", str(tmp_path / "empty"))
    bare = compare_run(run)["step_time"]
    assert bare["predicted_s"] is None and "no machine profile at" in bare["basis"] and "assumed" in bare["basis"]
    assert "python -m planner measure --processes 2" in bare["why_not"]
    # A profile named but missing is an error, not a fallback.
    with pytest.raises(PlanError, match="no machine profile at"):
        compare_run(run, profile=tmp_path / "none.json")


@pytest.mark.multiprocess
def test_a_run_from_before_the_profile_keeps_the_link_it_recorded(shared_runs, machine_profile, tmp_path) -> None:
    """Runs written before runs stopped measuring their link (config.json's launch "link") are priced with it."""
    old = tmp_path / "old-ddp"
    shutil.copytree(shared_runs["ddp"], old, ignore=shutil.ignore_patterns("checkpoints", "wandb", "hf"))
    config = json.loads((old / "config.json").read_text())
    config["launch"]["link"] = {**read_profile(machine_profile).link_for(2), "bus_gb_s": 123.0, "latency_s": None}
    (old / "config.json").write_text(json.dumps(config))
    t = compare_run(old, profile=machine_profile)["step_time"]
    assert t["link_gb_s"] == 123.0 and t["latency_measured"] is False


def test_the_workers_values_come_back_by_rank() -> None:
    from planner.measure import _gather
    from tests.measure_workers import rank_squared

    assert _gather(rank_squared, lambda rank: (), 3) == [0, 1, 4]


def test_a_worker_that_fails_stops_the_measurement_at_once_and_leaves_none_behind() -> None:
    """One process failing (a GPU out of memory) must not leave the others, or the command, waiting."""
    import multiprocessing
    import time

    from planner.measure import _gather
    from tests.measure_workers import fail_first_wait_others

    began = time.perf_counter()
    with pytest.raises(PlanError, match=r"measuring process 0 failed: RuntimeError: out of memory, say"):
        _gather(fail_first_wait_others, lambda rank: (600.0,), 2)
    assert time.perf_counter() - began < 60  # not the other worker's 600 s
    assert multiprocessing.active_children() == []


@pytest.mark.multiprocess
def test_a_profile_measured_for_other_runs_says_so_and_does_not_price_them(
    shared_runs, machine_profile: Path, tmp_path: Path
) -> None:
    """A run in fp16 is not priced with an fp32 rate; a profile measured on another CPU is named as such."""
    run = tmp_path / "ddp-fp16"
    shutil.copytree(shared_runs["ddp"], run, ignore=shutil.ignore_patterns("checkpoints", "wandb", "hf"))
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "precision": "fp16"}))
    config = json.loads((run / "config.json").read_text())
    config["launch"]["cpu_model"] = "Another CPU"
    (run / "config.json").write_text(json.dumps(config))
    t = compare_run(run, profile=machine_profile)["step_time"]
    assert "no fp16 compute rate for tiny" in t["basis"] and "MFU 0.3 assumed" in t["basis"]
    assert t["mfu_given"] == 0.3 and "the run ran on Another CPU" in t["basis"]


def test_link_from_takes_the_link_a_profile_holds(tmp_path: Path, capsys) -> None:
    from planner.plan import plan
    from planner.request import PlanRequest

    path = tmp_path / "p.json"
    write_profile(path, _profile(links={"2": {**LINK, "bus_gb_s": 7.5, "seconds_per_all_reduce": 0.01}}))
    result = plan(PlanRequest(preset="gpt2", gpu="T4", num_gpus=2, link_from=path))
    assert result["gpu"]["link_gb_s"] == 7.5 and str(path) in result["gpu"]["link"]
    write_profile(tmp_path / "one.json", _profile())
    assert main(["--preset", "gpt2", "--gpu", "T4", "--num_gpus", "2", "--link_from", str(tmp_path / "one.json")]) == 2
    assert "the profile measured one process, no link" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------- priced from a profile
# Made-up figures over the sample runs (docs/sample_report/runs: tiny, 2 processes of one thread, fp32 on a CPU),
# so what the planner reads from a profile is checked exactly, without measuring.

SAMPLE_RUNS = Path(__file__).resolve().parents[1] / "docs" / "sample_report" / "runs"
FULL_LINK = {
    "backend": "gloo",
    "world_size": 2,
    "message_bytes": 4_000_000,
    "seconds_per_all_reduce": 0.01,
    "algorithm_gb_s": 0.4,
    "bus_gb_s": 0.4,
    "latency_s": 0.001,
    "shard_group_size": 2,
    "seconds_per_all_gather": 0.02,
    "all_gather_latency_s": 0.002,
    "seconds_per_reduce_scatter": 0.03,
    "reduce_scatter_latency_s": 0.003,
    "fsdp_all_gather_call_s": 0.0004,
    "fsdp_kept_all_gather_call_s": 0.0006,
    "fsdp_reduce_scatter_call_s": 0.0005,
}
PRICED = ComputeRate("tiny", 2, 1, "fp32", "cpu", 8, 64, mfu=0.15, peak_flops=5e10, adamw_gb_s=3.0)


def _sample(tmp_path: Path, name: str, **summary_changes) -> Path:
    run = tmp_path / name
    shutil.copytree(SAMPLE_RUNS / name, run)
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, **summary_changes}))
    return run


def _priced_profile(tmp_path: Path, links: dict | None = None) -> Path:
    path = tmp_path / "profile.json"
    path.unlink(missing_ok=True)
    write_profile(path, _profile(compute=(PRICED,), links={"2": FULL_LINK} if links is None else links))
    return path


def test_ddp_is_priced_at_the_profiles_rate_over_its_all_reduce_without_fsdps_collectives(tmp_path: Path) -> None:
    from planner.plan import link_from_record

    t = compare_run(_sample(tmp_path, "ddp"), profile=_priced_profile(tmp_path))["step_time"]
    assert (t["mfu_given"], t["peak_flops"], t["host_update_gb_s"]) == (0.15, 5e10, 3.0)  # the rate's own peak
    assert t["link_gb_s"] == pytest.approx(link_from_record(FULL_LINK).gb_s) and t["latency_s"] == 0.001
    assert t["latency_measured"] is True
    assert t["all_gather_gb_s"] is None and t["all_gather_call_s"] is None and t["reduce_scatter_call_s"] is None


def test_fsdp_is_priced_with_the_profiles_own_collectives(tmp_path: Path) -> None:
    t = compare_run(_sample(tmp_path, "fsdp"), profile=_priced_profile(tmp_path))["step_time"]
    assert t["all_gather_call_s"] == 0.0004 and t["reduce_scatter_call_s"] == 0.0005
    assert t["all_gather_gb_s"] == pytest.approx(0.5 * 4e6 / (0.02 - 0.002) / 1e9)


def test_a_run_is_not_priced_with_a_rate_of_another_precision_or_a_link_of_another_size(tmp_path: Path) -> None:
    profile = _priced_profile(tmp_path)
    fp16 = compare_run(_sample(tmp_path, "ddp", precision="fp16"), profile=profile)["step_time"]
    assert fp16["mfu_given"] == 0.3 and "no fp16 compute rate for tiny" in fp16["basis"]
    four = _priced_profile(tmp_path, links={"4": {**FULL_LINK, "world_size": 4}})
    t = compare_run(_sample(tmp_path / "b", "ddp"), profile=four)["step_time"]
    assert t["predicted_s"] is None and "no machine profile holds one between 2 processes" in t["why_not"]


def test_a_rate_measured_at_other_micro_batches_is_used_and_said(tmp_path: Path) -> None:
    t = compare_run(_sample(tmp_path, "ddp", micro_batch_size=4), profile=_priced_profile(tmp_path))["step_time"]
    assert t["mfu_given"] == 0.15 and "measured at micro-batches of 8 x 64 tokens, the run's are 4 x 64" in t["basis"]


def test_the_experiment_prices_each_strategy_at_its_layouts_profile(tmp_path: Path, monkeypatch) -> None:
    from analysis import prediction
    from planner.plan import link_from_record, plan_strategy, workload_for
    from planner.profile import default_profile_path
    from planner.request import PlanRequest

    monkeypatch.setenv("GPT2S_CACHE", str(tmp_path))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # one thread per process, as accelerate gives
    with pytest.raises(PlanError, match="no machine profile at"):
        prediction.hardware_for(None, None, "fp32")
    one = replace(PRICED, processes=1, mfu=0.25, adamw_gb_s=6.0)
    write_profile(default_profile_path(), _profile(compute=(PRICED, one), links={"2": FULL_LINK}))
    hw, basis = prediction.hardware_for(None, None, "fp32")
    assert str(default_profile_path()) in basis
    priced, mfu = prediction._profiled_cpu(hw, prediction._profile_of(hw), "tiny", 2)
    assert (mfu, priced.peak_flops, priced.link.host_update_gb_s) == (0.15, 5e10, 3.0)
    assert priced.link.gb_s == pytest.approx(link_from_record(FULL_LINK).gb_s)
    alone, mfu_alone = prediction._profiled_cpu(hw, prediction._profile_of(hw), "tiny", 1)
    assert (mfu_alone, alone.link.host_update_gb_s) == (0.25, 6.0)
    workload = {
        "preset": "tiny",
        "block_size": 64,
        "micro_batch_size": 8,
        "global_batch_tokens": 1024,
        "precision": "fp32",
    }
    predicted = prediction.predict([prediction.Planned("ddp", 2, 5, 3)], workload, hw, basis)
    w = replace(
        workload_for(PlanRequest(num_gpus=2, **workload), "ddp"), precision="fp32", fused_adamw=False, device="cpu"
    )
    step = plan_strategy(w, "ddp", priced, 0.15, "full")["predicted_step_s"]
    assert predicted.step_s["ddp"] == pytest.approx(step) and predicted.seconds["ddp"] == pytest.approx(step * 15)
    assert "assumed" not in predicted.basis
    with pytest.raises(PlanError, match="no compute rate for mini on 2 process"):
        prediction._profiled_cpu(hw, prediction._profile_of(hw), "mini", 2)
    write_profile(default_profile_path(), _profile(compute=(replace(PRICED, processes=4),), links={}))
    with pytest.raises(PlanError, match="no link between 4 processes"):
        four = prediction.hardware_for(None, None, "fp32")[0]
        prediction._profiled_cpu(four, prediction._profile_of(four), "tiny", 4)


def test_a_resume_keeps_the_link_its_run_recorded_before_the_profile(tmp_path: Path) -> None:
    from training.records.record import LinkRecord
    from training.trainer import _earlier_link

    assert _earlier_link(tmp_path) is None  # no config.json yet: a fresh run
    (tmp_path / "config.json").write_text(json.dumps({"launch": {"link": FULL_LINK}}))
    assert _earlier_link(tmp_path) == LinkRecord.from_dict(FULL_LINK)
    (tmp_path / "config.json").write_text(json.dumps({"launch": {}}))  # a run of the profile's time: none
    assert _earlier_link(tmp_path) is None
    (tmp_path / "config.json").write_text("[1, 2]")
    assert _earlier_link(tmp_path) is None
