"""The report's plan beside measurement, scaling efficiency and cost per million tokens.

Run directories are the sample report's real CPU runs (tiny preset: single with 2 accumulation
micro-steps, ddp and fsdp on 2 processes), copied, with a summary.json "memory" record of known numbers
(those a real run of the same shape measured) and, where a test needs them, known throughputs.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from analysis.compare import load_comparison, main
from analysis.plan_report import NOT_MEASURED, plan_section
from analysis.runs import Run
from analysis.scaling import COST_HEADER, SCALING_HEADER, scaling_lines, table_columns
from analysis.table import build_table
from model import GPT2Config
from planner.cost_model import Workload, model_state, step_memory

SAMPLE = Path(__file__).resolve().parents[1] / "docs" / "sample_report" / "runs"
MIB = 2**20
N_PARAMS = 3_332_928  # the tiny preset's parameters, as the sample runs' summary.json records them

# What a real tiny-preset run of each strategy measured on CPU (training/records/memory.py), rank by rank.
STATE = {"parameters": 13_331_712, "gradients": 13_331_712, "optimizer": 26_663_536}
SHARD_0 = {"parameters": 6_665_984, "gradients": 6_665_984, "optimizer": 13_332_080}
SHARD_1 = {"parameters": 6_665_728, "gradients": 6_665_728, "optimizer": 13_331_568}
SOURCE = "torch.distributed._tools.MemTracker, step 2"
MEMORY = {
    "single": {
        "probe_step": 2,
        "step_peak_source": SOURCE,
        "model_state_bytes": [STATE],
        "step_peak_bytes": [366_599_824],
    },
    # 280,000,000 bytes is far below what the plan predicts for ddp: its error is flagged.
    "ddp": {
        "probe_step": 2,
        "step_peak_source": SOURCE,
        "model_state_bytes": [STATE, STATE],
        "step_peak_bytes": [280_000_000, 280_000_000],
    },
    "fsdp": {
        "probe_step": 2,
        "step_peak_source": SOURCE,
        "model_state_bytes": [SHARD_0, SHARD_1],
        "step_peak_bytes": [346_398_848, 346_398_336],
    },
}


def copy_run(
    root: Path,
    name: str,
    source: str | None = None,
    memory: dict[str, Any] | None = None,
    total: dict[str, Any] | None = None,
    **facts: Any,
) -> Path:
    """A copy of the sample run `source` (default `name`) with summary.json's memory, totals and facts changed."""
    path = root / name
    shutil.copytree(SAMPLE / (source or name), path)
    summary = json.loads((path / "summary.json").read_text())
    summary.pop("memory", None)
    if memory is not None:
        summary["memory"] = memory
    summary["total"].update(total or {})
    summary.update(facts)
    (path / "summary.json").write_text(json.dumps(summary))
    return path


def measured_runs(root: Path) -> list[Path]:
    return [copy_run(root, name, memory=MEMORY[name]) for name in ("single", "ddp", "fsdp")]


def loaded(paths: list[Path]) -> list[Run]:
    usable, excluded = load_comparison(paths)
    assert not excluded
    return usable


def row(table, label: str) -> dict[str, str]:
    return dict(zip(table.headers, table.shown[table.column("run").index(label)]))


# ---------------------------------------------------------------------------------------------
# Plan beside measurement


# The sample runs' shapes, written out from their config.json and summary.json: the tiny preset on CPU,
# fp32, micro-batches of 8 sequences of 64 tokens; single accumulates 2 micro-batches, ddp and fsdp run 2 ranks.
WORKLOADS = {
    "single": Workload(GPT2Config.from_preset("tiny"), 8, 64, "fp32", 1, 2, device="cpu"),
    "ddp": Workload(GPT2Config.from_preset("tiny"), 8, 64, "fp32", 2, 1, device="cpu"),
    "fsdp": Workload(GPT2Config.from_preset("tiny"), 8, 64, "fp32", 2, 1, device="cpu"),
}
# A whole replica's model state, by hand: fp32 parameters and gradients (4 bytes each), AdamW's two fp32
# moments (8 bytes) and its fp32 step counter for each of the tiny model's 28 parameter tensors (4 bytes).
WHOLE_STATE = {"parameters": 4 * N_PARAMS, "gradients": 4 * N_PARAMS, "optimizer": 8 * N_PARAMS + 4 * 28}


def planned(name: str) -> dict[str, Any]:
    """Rank 0's plan for the sample run `name`, from the planner's model on the workload written out above
    (not from the run reader that fills the report's table)."""
    w = WORKLOADS[name]
    state = model_state(w, name, 0)
    peak = step_memory(w, name, 0, host_is_device=True)
    predicted = {
        "parameters": state.parameters,
        "gradients": state.gradients,
        "optimizer": state.optimizer,
        "step_peak": peak.total,
    }
    if name != "fsdp":  # an unsharded replica: the hand count holds
        assert {k: predicted[k] for k in WHOLE_STATE} == WHOLE_STATE
    return {"predicted": predicted, "peak_phase": peak.peak_phase, "predicted_peak": peak.to_dict()}


def test_the_hand_written_workloads_are_the_sample_runs() -> None:
    for name, w in WORKLOADS.items():
        summary = json.loads((SAMPLE / name / "summary.json").read_text())
        assert (w.micro_batch_size, w.block_size, w.precision, w.world_size, w.grad_accum_steps) == (
            summary["micro_batch_size"],
            summary["block_size"],
            summary["precision"],
            summary["world_size"],
            summary["grad_accum_steps"],
        )
        assert summary["n_params"] == N_PARAMS and summary["device_type"] == "cpu"


@pytest.fixture
def section(tmp_path: Path):
    paths = measured_runs(tmp_path)
    return plan_section(loaded(paths)), {path.name: planned(path.name) for path in paths}


def test_table_puts_rank_0_prediction_beside_measurement(section) -> None:
    result, plans = section
    for name in ("single", "ddp", "fsdp"):
        cells, predicted = row(result.table, name), plans[name]["predicted"]
        state = sum(MEMORY[name]["model_state_bytes"][0].values())
        planned_state = predicted["parameters"] + predicted["gradients"] + predicted["optimizer"]
        assert cells["model state, predicted (MiB)"] == f"{planned_state / MIB:,.1f}"
        assert cells["model state, measured (MiB)"] == f"{state / MIB:,.1f}"
        peak = MEMORY[name]["step_peak_bytes"][0]  # rank 0's, not the other rank's
        assert cells["step peak, predicted (MiB)"] == f"{predicted['step_peak'] / MIB:,.1f}"
        assert cells["step peak, measured (MiB)"] == f"{peak / MIB:,.1f}"
        assert cells["step peak error (%)"].startswith(f"{(predicted['step_peak'] - peak) / peak * 100:+.1f}")
        assert cells["predicted peak phase"] == plans[name]["peak_phase"]
    assert row(result.table, "fsdp")["model state, measured (MiB)"] == "25.4"  # half of single's 50.9
    assert row(result.table, "single")["model state, measured (MiB)"] == "50.9"


def test_errors_above_15_percent_are_flagged(section) -> None:
    result, plans = section
    error = (plans["ddp"]["predicted"]["step_peak"] - 280_000_000) / 280_000_000 * 100
    assert error > 15
    assert row(result.table, "ddp")["step peak error (%)"] == f"{error:+.1f} (over 15%)"
    assert "(over" not in row(result.table, "single")["step peak error (%)"]
    (flags,) = [line for line in result.lines if line.startswith("Errors above 15%")]
    assert f"ddp step peak {error:+.1f}%" in flags and "single" not in flags and "fsdp" not in flags


def test_ddp_gap_is_explained_by_its_buckets_and_single_s_accumulation(section) -> None:
    result, _ = section
    (line,) = [line for line in result.lines if line.startswith("ddp's step peak")]
    below = (366_599_824 - 280_000_000) / MIB
    assert line.startswith(f"ddp's step peak is {below:,.1f} MiB below single's")
    # One fp32 copy of the gradients: 4 bytes x the run's parameters, 12.7 MiB.
    assert (
        f"+{4 * N_PARAMS / MIB:.1f} MiB DDP's gradient buckets, one fp32 copy of the gradients "
        f"(4 bytes x {N_PARAMS:,} parameters)" in line
    )
    # single accumulates 2 micro-batches, so at its peak it holds the first one's gradients; ddp does not.
    assert f"-{4 * N_PARAMS / MIB:.1f} MiB gradients held from earlier micro-batches (single accumulates 2" in line


def test_fsdp_holds_half_the_model_state_but_its_peak_falls_less(section) -> None:
    result, plans = section
    (line,) = [line for line in result.lines if line.startswith("fsdp holds")]
    single_state, fsdp_state = sum(STATE.values()), sum(SHARD_0.values())
    fall = 366_599_824 - 346_398_848
    assert fall < single_state - fsdp_state
    assert line.startswith(
        f"fsdp holds {fsdp_state / single_state:.0%} of single's model state per rank "
        f"({fsdp_state / MIB:.1f} vs {single_state / MIB:.1f} MiB measured; "
        f"1,666,496 of {N_PARAMS:,} parameters on rank 0), but its step peak falls only by "
        f"{fall / MIB:.1f} MiB"
    )
    peak = plans["fsdp"]["predicted_peak"]
    share = (peak["activations"] + peak["logits"]) / peak["total"]
    assert f"which sharding does not divide, are {share:.0%} of it." in line and share > 0.5


def test_runs_without_memory_or_unreadable_get_one_line_each(tmp_path: Path) -> None:
    old = copy_run(tmp_path, "fsdp")  # recorded before memory measurement
    broken = copy_run(tmp_path, "ddp", memory=MEMORY["ddp"])
    config = json.loads((broken / "config.json").read_text())
    del config["launch"]
    (broken / "config.json").write_text(json.dumps(config))
    odd = copy_run(tmp_path, "odd", source="single", memory={**MEMORY["single"], "model_state_bytes": ["x"]})
    result = plan_section(loaded([old, broken, odd]))
    assert result.table is None
    lines = {line.split(":", 1)[0]: line for line in result.lines}
    assert lines["fsdp"] == f"fsdp: {NOT_MEASURED}."
    assert lines["ddp"].startswith("ddp: no plan: ") and "not a run this planner can read" in lines["ddp"]
    assert lines["single"].startswith("single: no plan: ")
    assert all("\n" not in line for line in result.lines) and len(result.lines) == 3


# ---------------------------------------------------------------------------------------------
# Scaling efficiency and cost


def timed_runs(root: Path, **changes: dict[str, Any]) -> list[Run]:
    """single 1,000, ddp 1,800 and fsdp 1,500 tokens/s (warm-up excluded, the reading's figure)."""
    rates = {"single": 1000.0, "ddp": 1800.0, "fsdp": 1500.0}
    return loaded(
        [
            copy_run(root, name, total={"tokens_per_s_excl_warmup": rate}, **changes.get(name, {}))
            for name, rate in rates.items()
        ]
    )


def cells(runs: list[Run], price: float | None, header: str) -> dict[str, Any]:
    table = build_table(runs, table_columns(runs, price))
    return dict(zip(table.column("run"), table.column(header)))


def test_scaling_efficiency_is_n_device_throughput_over_n_single_throughputs(tmp_path: Path) -> None:
    runs = timed_runs(tmp_path)
    assert cells(runs, None, SCALING_HEADER) == {
        "single": None,
        "ddp": pytest.approx(90.0),
        "fsdp": pytest.approx(75.0),
    }
    lines = scaling_lines(runs, None)
    assert "Scaling efficiency of ddp: 1,800 tokens/s / (2 x 1,000 tokens/s of single) = 90.0%." in lines


def test_cost_per_million_tokens(tmp_path: Path) -> None:
    runs = timed_runs(tmp_path)
    # 2.5 per device-hour: single 2.5 / 3600 / 1,000 x 10^6; ddp twice the devices at 1,800 tokens/s.
    assert cells(runs, 2.5, COST_HEADER) == {
        "single": pytest.approx(2.5 / 3.6),
        "ddp": pytest.approx(5 / 6.48),
        "fsdp": pytest.approx(5 / 5.4),
    }
    assert (
        "Cost per million tokens at 2.5 per device-hour (the currency of --gpu_hour_price): single 0.6944, "
        "ddp 0.7716, fsdp 0.9259." in scaling_lines(runs, 2.5)
    )
    assert set(cells(runs, None, COST_HEADER).values()) == {None}
    assert any("pass `--gpu_hour_price PRICE`" in line for line in scaling_lines(runs, None))


def test_scaling_is_n_a_without_a_comparable_single_run(tmp_path: Path) -> None:
    runs = timed_runs(tmp_path / "block", ddp={"block_size": 128})
    assert cells(runs, None, SCALING_HEADER) == {"single": None, "ddp": None, "fsdp": pytest.approx(75.0)}
    assert (
        "Scaling efficiency of ddp: n/a, no comparable single run (single differs: block size 128 vs 64)."
        in scaling_lines(runs, None)
    )
    alone = [run for run in timed_runs(tmp_path / "alone") if run.strategy != "single"]
    assert cells(alone, None, SCALING_HEADER) == {"ddp": None, "fsdp": None}
    assert "Scaling efficiency of fsdp: n/a, no single run in this comparison." in scaling_lines(alone, None)


def test_cpu_runs_of_another_machine_or_thread_count_do_not_scale_against_each_other(tmp_path: Path) -> None:
    # Every CPU is named "cpu": the measured peak and the threads per process tell machines apart.
    runs = timed_runs(tmp_path / "other", ddp={"peak_flops_per_device": 1.5e11})
    assert cells(runs, None, SCALING_HEADER)["ddp"] is None
    assert any("measured CPU peak FLOP/s" in line for line in scaling_lines(runs, None))
    threads = timed_runs(tmp_path / "threads", ddp={"threads_per_process": 2})
    assert cells(threads, None, SCALING_HEADER)["ddp"] is None


# ---------------------------------------------------------------------------------------------
# The command line and the report files


@pytest.mark.parametrize("price", ["0", "abc", "-3", "inf"])
def test_a_bad_price_is_a_one_line_error_and_exit_2(tmp_path: Path, price: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([str(SAMPLE / "single"), "--out", str(tmp_path / "out"), "--gpu_hour_price", price])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: argument --gpu_hour_price: ") and repr(price) in err[0]
    assert not (tmp_path / "out").exists()


def test_report_has_the_plan_section_scaling_and_cost(tmp_path: Path) -> None:
    paths = [*measured_runs(tmp_path / "runs"), copy_run(tmp_path / "runs", "old", source="fsdp")]
    out = tmp_path / "out"
    assert main([*map(str, paths), "--out", str(out), "--gpu_hour_price", "2.5"]) == 0
    markdown = (out / "report.md").read_text()
    plan = markdown.split("\n## Plan beside measurement\n", 1)[1].split("\n## ", 1)[0]
    assert "| run | strategy | model state, predicted (MiB) |" in plan
    assert f"- fsdp (old): {NOT_MEASURED}." in plan and "DDP's gradient buckets" in plan
    assert "## Scaling efficiency and cost" in markdown and "--gpu_hour_price 2.5" in markdown
    page = (out / "report.html").read_text()
    assert "<h2>Plan beside measurement</h2>" in page and "DDP&#x27;s gradient buckets" in page
    rows = {r["run"]: r for r in csv.DictReader(io.StringIO((out / "table.csv").read_text()))}
    single = json.loads((paths[0] / "summary.json").read_text())["total"]["tokens_per_s_excl_warmup"]
    ddp = json.loads((paths[1] / "summary.json").read_text())["total"]["tokens_per_s_excl_warmup"]
    assert float(rows["single"][COST_HEADER]) == pytest.approx(2.5 / 3600 / single * 1e6)
    assert float(rows["ddp"][SCALING_HEADER]) == pytest.approx(100 * ddp / (2 * single))
    assert rows["single"][SCALING_HEADER] == ""
