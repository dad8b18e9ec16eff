"""The measured link: NCCL's bus-bandwidth arithmetic, the message size, `python -m planner measure` measuring it
over gloo between two processes into the machine profile, and runs that measure nothing at start."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from planner.link import (
    DDP_BUCKET_BYTES,
    TOY_UNITS,
    ToyTimings,
    bus_bandwidth_gb_s,
    call_cost_s,
    measure_link,
    message_bytes,
    sharded_calls,
    unit_call_costs,
)
from training.records.record import LaunchRecord, LinkRecord, RunSummary


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


@given(
    root=st.floats(0.0, 0.05),
    hooks=st.floats(1e-5, 1e-2),
    gather=st.floats(1e-5, 1e-2),
    scatter=st.floats(1e-5, 1e-2),
)
def test_fsdp2_per_call_costs_are_slopes_over_units_and_a_kept_unit_pays_all_its_hooks_on_one_gather(
    root: float, hooks: float, gather: float, scatter: float
) -> None:
    """Toy timings built from FSDP2's work: `root` once per step whatever the units, `hooks` per unit per
    micro-step, `gather` per all-gather (two per unit resharded after forward, one kept gathered) and
    `scatter` per reduce-scatter. The per-call figures are those of the units alone: the root's once-per-step
    work cancels, a resharded unit's hooks are split over its two gathers, a kept unit's all on its one."""
    compute = 1e-4  # the toy's own forward and backward per unit, paid with or without FSDP

    def timed(per_unit: float) -> tuple[float, float]:
        a, b = (n * (compute + per_unit) + 1e-3 for n in TOY_UNITS)
        return a + root, b + root

    t = ToyTimings(
        plain=tuple(n * compute + 1e-3 for n in TOY_UNITS),
        resharded=timed(hooks + 2 * gather),
        resharded_synced=timed(hooks + 2 * gather + scatter),
        kept=timed(hooks + gather),
    )
    resharded, kept, scattered = unit_call_costs(t)
    assert resharded == pytest.approx(hooks / 2 + gather, rel=1e-6)
    assert kept == pytest.approx(hooks + gather, rel=1e-6)
    assert scattered == pytest.approx(scatter, rel=1e-6)


@pytest.fixture
def one_process_group():
    """A one-process gloo group in this process, torn down after the test."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("names", [None, ("replicate", "shard")])
def test_the_sharded_calls_run_on_the_oldest_supported_torch_and_leave_the_random_state(
    one_process_group, monkeypatch, names
) -> None:
    """torch 2.10, the oldest the project supports, has no all_gather_single / reduce_scatter_single: the
    sharded calls use only the tensor forms (removed here as 2.10 lacks them), on a 1-D mesh and hybrid
    sharding's 2-D one (its shard dimension), and draw no random number the run would otherwise draw."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    monkeypatch.delattr(dist, "all_gather_single", raising=False)
    monkeypatch.delattr(dist, "reduce_scatter_single", raising=False)
    mesh = init_device_mesh("cpu", (1,) if names is None else (1, 1), mesh_dim_names=names)
    before = torch.get_rng_state()
    calls = sharded_calls(torch.device("cpu"), 4000, torch.float32, mesh, iterations=1)
    assert torch.equal(torch.get_rng_state(), before)
    assert calls.shard_group_size == 1
    assert calls.seconds_per_all_gather > 0 and calls.seconds_per_reduce_scatter > 0


def test_each_sharded_collective_reaches_the_record_under_its_own_key_and_a_call_noise_hid_is_left_out(
    one_process_group, monkeypatch
) -> None:
    """The all-gather and reduce-scatter of the message and of one element, timed here by a stand-in that
    gives each its own figure, reach the run's record (LinkRecord, as `measure_link` builds it) each under its
    own kind's key and read back the same; FSDP2's kept-unit call that noise hid (None) is absent, not null."""
    from dataclasses import asdict

    from torch.distributed.device_mesh import init_device_mesh

    import planner.link as link

    ran: list[tuple[str, int]] = []
    monkeypatch.setattr(
        link,
        "tensor_collectives",
        lambda: (
            lambda out, inp, group=None: ran.append(("all_gather", out.numel())),
            lambda out, inp, group=None: ran.append(("reduce_scatter", inp.numel())),
        ),
    )
    # 4000 bytes of float32 over one process: 1000 elements; the one-element calls move one per rank.
    figures = {("all_gather", 1000): 0.011, ("reduce_scatter", 1000): 0.013}
    figures |= {("all_gather", 1): 0.002, ("reduce_scatter", 1): 0.003}

    def timed(call, iterations, device) -> float:
        ran.clear()
        call()
        return figures[ran[-1]]

    monkeypatch.setattr(link, "_seconds_per_call", timed)
    monkeypatch.setattr(link, "_time_fsdp_units", lambda device, mesh: None)
    monkeypatch.setattr(link, "unit_call_costs", lambda timings: (0.004, None, 0.006))
    calls = sharded_calls(torch.device("cpu"), 4000, torch.float32, init_device_mesh("cpu", (1,)))
    record = LinkRecord("gloo", 2, 4000, "float32", 5, 0.01, 0.4, 0.4, 1e-4, **asdict(calls))
    written = record.to_dict()
    assert {k: written[k] for k in asdict(calls) if k in written} == {
        "shard_group_size": 1,
        "seconds_per_all_gather": 0.011,
        "seconds_per_reduce_scatter": 0.013,
        "all_gather_latency_s": 0.002,
        "reduce_scatter_latency_s": 0.003,
        "fsdp_all_gather_call_s": 0.004,
        "fsdp_reduce_scatter_call_s": 0.006,
    }
    assert "fsdp_kept_all_gather_call_s" not in written
    assert LinkRecord.from_dict(json.loads(json.dumps(written))) == record


def test_hybrid_shardings_toy_units_are_sharded_over_its_shard_dimension_alone(one_process_group, monkeypatch) -> None:
    """On hybrid sharding's 2-D mesh (replicate, shard) the FSDP2 unit calls are timed on the shard dimension
    alone: on the whole mesh the toy units would be hybrid-sharded and time the replica all-reduce too."""
    from torch.distributed.device_mesh import init_device_mesh

    import planner.link as link

    meshes = []
    monkeypatch.setattr(link, "_time_fsdp_units", lambda device, mesh: meshes.append(mesh))
    monkeypatch.setattr(link, "unit_call_costs", lambda timings: (None, None, None))
    mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("replicate", "shard"))
    sharded_calls(torch.device("cpu"), 4000, torch.float32, mesh, iterations=1)
    assert [(m.ndim, m.mesh_dim_names) for m in meshes] == [(1, ("shard",))]


def test_one_process_measures_no_link() -> None:
    assert measure_link(torch.device("cpu"), 1000, torch.float32) is None


def test_the_link_is_read_back_and_old_runs_have_none() -> None:
    link = LinkRecord("nccl", 2, DDP_BUCKET_BYTES, "float32", 5, 0.005, 5.24288, 5.24288)
    launch = LaunchRecord.from_dict({"link": link.to_dict(), "repeat": 2})
    assert launch.link == link and launch.repeat == 2
    assert LaunchRecord.from_dict({}).link is None and RunSummary.from_dict({}).repeat is None


@pytest.mark.multiprocess
def test_the_measure_command_prices_the_link_between_two_processes(machine_profile) -> None:
    """The session's profile (tests/conftest.py, `python -m planner measure` at its defaults): gloo between two
    processes, an all-reduce of the tiny model's gradients, and FSDP's own collectives."""
    from model import GPT2Config
    from model.shapes import parameter_shapes
    from planner.profile import read_profile

    link = read_profile(machine_profile).link_for(2)
    numel = sum(torch.Size(shape).numel() for shape in parameter_shapes(GPT2Config.from_preset("tiny")).values())
    assert link["backend"] == "gloo" and link["world_size"] == 2 and link["dtype"] == "float32"
    assert link["message_bytes"] == 4 * numel  # the tiny model's gradients are under a bucket
    assert math.isfinite(link["bus_gb_s"]) and link["bus_gb_s"] > 0
    assert link["bus_gb_s"] == pytest.approx(link["algorithm_gb_s"])  # 2(n-1)/n = 1 for two processes
    assert 0 < link["latency_s"] < link["seconds_per_all_reduce"]
    for kind in ("all_gather", "reduce_scatter"):
        assert 0 < link[f"{kind}_latency_s"] < link[f"seconds_per_{kind}"]  # one element against the message
        call = link.get(f"fsdp_{kind}_call_s")  # left out where noise made the difference meaningless
        assert call is None or (math.isfinite(call) and call > 0)


@pytest.mark.multiprocess
def test_a_run_measures_no_link_and_no_fsdp_call_at_start(shared_runs) -> None:
    """A default launch studies nothing before its first step: no link, no FSDP2 call in its records."""
    for name in ("ddp", "fsdp"):
        config = (shared_runs[name] / "config.json").read_text()
        summary = (shared_runs[name] / "summary.json").read_text()
        assert "link" not in json.loads(config)["launch"] and '"link"' not in summary
        for text in (config, summary):
            assert "_call_s" not in text and "all_gather" not in text and "all_reduce" not in text


@pytest.mark.multiprocess
def test_the_planner_prices_a_sharding_runs_collectives_from_the_profile(shared_runs, machine_profile) -> None:
    """`planner --run` on the session's FSDP run prices its all-gathers and reduce-scatters with the profile's
    figures, and the DDP run's all-reduce without them."""
    from planner.plan import compare_run, runs_text
    from planner.profile import read_profile

    link = read_profile(machine_profile).link_for(2)
    entry = compare_run(shared_runs["fsdp"], profile=machine_profile)
    t = entry["step_time"]
    assert t["predicted_s"] > 0 and str(machine_profile) in t["basis"]
    assert f"all-gather {t['all_gather_gb_s']:.3g} GB/s" in runs_text([entry])  # said beside the step time
    n, nbytes = link["world_size"], link["message_bytes"]
    gathered = (n - 1) / n * nbytes / (link["seconds_per_all_gather"] - link["all_gather_latency_s"]) / 1e9
    assert t["all_gather_gb_s"] == pytest.approx(gathered)
    assert t["all_gather_call_s"] == link.get("fsdp_all_gather_call_s")
    ddp = compare_run(shared_runs["ddp"], profile=machine_profile)["step_time"]
    assert ddp["predicted_s"] > 0 and ddp["all_gather_gb_s"] is None and ddp["all_gather_call_s"] is None
