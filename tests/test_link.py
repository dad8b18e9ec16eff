"""The measured link: NCCL's bus-bandwidth arithmetic, the message size, and one real two-process run that
measures it over gloo and records it in config.json and summary.json."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from training.link import DDP_BUCKET_BYTES, bus_bandwidth_gb_s, call_cost_s, measure_link, message_bytes
from training.record import LaunchRecord, LinkRecord, RunSummary


def test_bus_bandwidth_is_the_algorithm_bandwidth_times_2_n_minus_1_over_n() -> None:
    # 1 GB in 1 s: algorithm bandwidth 1 GB/s; a ring all-reduce moves 2(n-1)/n of it over every link.
    assert bus_bandwidth_gb_s(10**9, 1.0, 2) == pytest.approx(1.0)
    assert bus_bandwidth_gb_s(10**9, 1.0, 4) == pytest.approx(1.5)
    assert bus_bandwidth_gb_s(10**9, 1.0, 8) == pytest.approx(1.75)
    # A 25 MiB bucket in 5 ms between two GPUs: 26,214,400 / 0.005 x 1 / 1e9 = 5.24 GB/s.
    assert bus_bandwidth_gb_s(DDP_BUCKET_BYTES, 0.005, 2) == pytest.approx(5.24288)
    with pytest.raises(ValueError):
        bus_bandwidth_gb_s(10**9, 1.0, 1)
    with pytest.raises(ValueError):
        bus_bandwidth_gb_s(10**9, 0.0, 2)


def test_the_message_is_one_ddp_bucket_or_all_the_gradients_when_fewer() -> None:
    assert DDP_BUCKET_BYTES == 25 * 2**20
    assert message_bytes(124_439_808, torch.float32) == DDP_BUCKET_BYTES  # GPT-2 124M: a full bucket
    assert message_bytes(124_439_808, torch.float16) == DDP_BUCKET_BYTES
    assert message_bytes(1000, torch.float32) == 4000  # the tiny model's gradients are fewer
    assert message_bytes(1000, torch.bfloat16) == 2000


@given(
    without=st.floats(0.0, 10.0),
    extra=st.floats(1e-6, 10.0),
    calls=st.integers(1, 64),
)
def test_a_cost_per_call_is_what_the_calls_add_divided_by_their_number(
    without: float, extra: float, calls: int
) -> None:
    assert call_cost_s(without + extra, without, calls) == pytest.approx(extra / calls)


@pytest.mark.parametrize(
    "with_calls, without_calls, calls",
    [
        (0.010, 0.012, 8),
        (0.010, 0.010, 8),
        (math.nan, 0.010, 8),
        (math.inf, 0.010, 8),
        (0.010, -math.inf, 8),
        (0.2, 0.1, 0),
    ],
)
def test_a_cost_per_call_that_noise_made_negative_zero_or_infinite_is_refused(
    with_calls: float, without_calls: float, calls: int
) -> None:
    """FSDP2's per-unit calls are timed as a difference of two means on a shared machine: a difference that is
    not a positive finite number measured the noise, and is never recorded as what a call costs."""
    with pytest.raises(ValueError):
        call_cost_s(with_calls, without_calls, calls)


def test_one_process_measures_no_link() -> None:
    assert measure_link(torch.device("cpu"), 1000, torch.float32) is None


def test_the_link_is_read_back_and_old_runs_have_none() -> None:
    link = LinkRecord("nccl", 2, DDP_BUCKET_BYTES, "float32", 5, 0.005, 5.24288, 5.24288)
    launch = LaunchRecord.from_dict({"link": link.to_dict(), "repeat": 2})
    assert launch.link == link and launch.repeat == 2
    assert LaunchRecord.from_dict({}).link is None and RunSummary.from_dict({}).repeat is None


@pytest.mark.multiprocess
def test_a_two_process_run_measures_its_link_and_records_it(shared_runs) -> None:
    """The session's DDP run on the CPU (tests/conftest.py): gloo between the two processes."""
    out = shared_runs["ddp"]
    launch = json.loads((out / "config.json").read_text())["launch"]
    summary = json.loads((out / "summary.json").read_text())
    link = launch["link"]
    assert link == summary["link"]  # the summary carries the launch's figure as it is
    assert link["backend"] == "gloo" and link["world_size"] == 2 and link["dtype"] == "float32"
    assert link["message_bytes"] == 4 * launch["n_params"]  # the tiny model's gradients are under a bucket
    assert math.isfinite(link["bus_gb_s"]) and link["bus_gb_s"] > 0
    assert link["bus_gb_s"] == pytest.approx(link["algorithm_gb_s"])  # 2(n-1)/n = 1 for two processes
    assert link["seconds_per_all_reduce"] > 0 and "repeat" not in summary  # not one of several repeats


@pytest.mark.multiprocess
def test_a_sharding_run_also_measures_its_all_gather_reduce_scatter_and_fsdp2_unit_calls(shared_runs) -> None:
    """The session's FSDP run prices its own collectives (the DDP run does not: it has none of them), and the
    planner's --run prices that run's all-gathers and reduce-scatters with them."""
    from planner.plan import compare_run, runs_text

    link = json.loads((shared_runs["fsdp"] / "summary.json").read_text())["link"]
    for kind in ("all_gather", "reduce_scatter"):
        assert 0 < link[f"{kind}_latency_s"] < link[f"seconds_per_{kind}"]  # one element against the message
        call = link.get(f"fsdp_{kind}_call_s")  # left out where noise made the difference meaningless
        assert call is None or (math.isfinite(call) and call > 0)
    entry = compare_run(shared_runs["fsdp"])
    t = entry["step_time"]
    assert f"all-gather {t['all_gather_gb_s']:.3g} GB/s" in runs_text([entry])  # said beside the step time
    n, nbytes = link["world_size"], link["message_bytes"]
    gathered = (n - 1) / n * nbytes / (link["seconds_per_all_gather"] - link["all_gather_latency_s"]) / 1e9
    assert t["all_gather_gb_s"] == pytest.approx(gathered)
    assert t["all_gather_call_s"] == link.get("fsdp_all_gather_call_s")
    ddp = json.loads((shared_runs["ddp"] / "summary.json").read_text())["link"]
    assert not any(key in ddp for key in ("seconds_per_all_gather", "fsdp_all_gather_call_s"))
