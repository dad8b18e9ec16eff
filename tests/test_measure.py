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

RATE = ComputeRate("tiny", 2, 1, "fp32", "cpu", mfu=0.2, peak_flops=1e11, adamw_gb_s=10.0)


def _profile(**changes) -> MachineProfile:
    return replace(MachineProfile({"host": "h"}, "2026-12-01T00:00:00Z", (RATE,), None), **changes)


def test_a_profile_is_read_back_as_written(tmp_path: Path) -> None:
    written = _profile(link={"backend": "gloo", "world_size": 2, "bus_gb_s": 1.0})
    write_profile(tmp_path / "p.json", written)
    assert read_profile(tmp_path / "p.json") == written


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
    ],
)
def test_measure_refuses_bad_input_in_one_line_before_measuring(argv, says, capsys, tmp_path: Path) -> None:
    assert main(["measure", "--cache_dir", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and says in err[0]
    assert not (tmp_path / "hardware").exists()  # nothing measured, nothing written


def test_the_session_profile_holds_every_layout_measured(machine_profile: Path) -> None:
    """`python -m planner measure` at its defaults (tests/conftest.py): tiny on 1 and 2 processes of one thread,
    each figure measured (positive), the two-process rate the slower; and the link between two."""
    profile = read_profile(machine_profile)
    one, two = profile.compute_for("tiny", 1, 1), profile.compute_for("tiny", 2, 1)
    assert one is not None and two is not None and profile.link["world_size"] == 2
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
    config["launch"]["link"] = {**read_profile(machine_profile).link, "bus_gb_s": 123.0, "latency_s": None}
    (old / "config.json").write_text(json.dumps(config))
    t = compare_run(old, profile=machine_profile)["step_time"]
    assert t["link_gb_s"] == 123.0 and t["latency_measured"] is False
