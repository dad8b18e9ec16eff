"""report.json beside the report: its shape, strict JSON, repeats grouped by strategy, and the new flags."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from analysis.compare import main

FIGURES = ("tokens_per_s", "step_peak_bytes", "train_time_s", "final_val_loss", "avg_loss")
STEPS, BATCH = 12, 1000
REPEATS = 4


def write_fake_run(folder: Path, strategy: str, seconds_per_step: float, peak_bytes: int, loss_end: float) -> Path:
    """A small CPU run folder: config.json, metrics.jsonl (train and eval lines), summary.json."""
    folder.mkdir(parents=True)
    times = [seconds_per_step * (1 + 0.02 * math.sin(i)) for i in range(STEPS)]
    elapsed = [sum(times[: i + 1]) for i in range(STEPS)]
    losses = [10.0 + (loss_end - 10.0) * (i + 1) / STEPS for i in range(STEPS)]
    lines = [
        {
            "kind": "train",
            "step": i + 1,
            "epoch": 1,
            "tokens": (i + 1) * BATCH,
            "loss": losses[i],
            "elapsed_s": elapsed[i],
        }
        for i in range(STEPS)
    ]
    lines += [
        {"kind": "eval", "step": s, "epoch": 1, "tokens": s * BATCH, "val_loss": losses[s - 1] + 0.1} for s in (6, 12)
    ]
    rate = STEPS * BATCH / elapsed[-1]
    summary = {
        "strategy": strategy,
        "world_size": 1,
        "device_type": "cpu",
        "precision": "fp32",
        "device_name": "cpu",
        "complete": True,
        "global_batch_tokens": BATCH,
        "tokens_trained": STEPS * BATCH,
        "steps": STEPS,
        "seed": 1,
        "memory": {"step_peak_bytes": [peak_bytes]},
        "step_times_s": times,
        "epochs": [
            {
                "epoch": 1,
                "partial": False,
                "steps": STEPS,
                "tokens": STEPS * BATCH,
                "loss_mean": 8.0,
                "time_s": elapsed[-1],
                "tokens_per_s": rate,
                "val_loss": losses[-1] + 0.1,
            }
        ],
        "total": {
            "train_time_s": elapsed[-1],
            "tokens_per_s": rate,
            "tokens_per_s_excl_warmup": rate,
            "loss_mean": sum(losses) / STEPS,
            "final_loss": losses[-1],
            "final_val_loss": losses[-1] + 0.1,
            "peak_mem_allocated_mib_max": 900.0,
        },
    }
    (folder / "config.json").write_text(json.dumps({"run": {"perf_warmup_steps": 2}}))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


@pytest.fixture(scope="module")
def report_json(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Four runs of each of two strategies (run folders runs/<strategy>/r<k>), compared with every flag."""
    root = tmp_path_factory.mktemp("repeats")
    dirs = [
        write_fake_run(root / "runs" / "single" / f"r{k}", "single", 0.50 + 0.01 * k, 300 * 2**20, 6.0)
        for k in range(REPEATS)
    ]
    dirs += [
        write_fake_run(root / "runs" / "fsdp" / f"r{k}", "fsdp", 0.60 + 0.01 * k, 200 * 2**20, 6.0)
        for k in range(REPEATS)
    ]
    argv = [*map(str, dirs), "--out", str(root / "out"), "--target_loss", "7.5", "--gpu_hour_price", "2", "--mlperf"]
    assert main(argv) == 0
    text = (root / "out" / "report.json").read_text()
    return json.loads(text, parse_constant=lambda name: pytest.fail(f"report.json holds {name}"))


def test_figures_give_each_strategy_its_runs_centre_range_and_interval(report_json: dict) -> None:
    figures = report_json["figures"]
    assert report_json["version"] == 2 and set(FIGURES) <= set(figures)
    for name in FIGURES:
        assert {"title", "unit", "higher_is_better", "margin", "unit_of_replication"} <= set(figures[name])
        strategies = figures[name]["strategies"]
        assert set(strategies) == {"single", "fsdp"}, name
        for entry in strategies.values():
            assert {"runs", "units", "centre", "min", "max", "ci95", "exact", "missing"} <= set(entry)
            assert entry["runs"] == REPEATS and entry["min"] <= entry["centre"] <= entry["max"]
            assert entry["ci95"] is None or (len(entry["ci95"]) == 2 and entry["ci95"][0] <= entry["ci95"][1])
    assert figures["step_peak_bytes"]["strategies"]["fsdp"]["ci95"] == [200 * 2**20, 200 * 2**20]
    assert (
        figures["avg_loss"]["unit_of_replication"] == "seed" and figures["avg_loss"]["strategies"]["fsdp"]["units"] == 1
    )


def test_comparisons_name_every_pair_and_figure_with_a_status(report_json: dict) -> None:
    comparisons = report_json["comparisons"]
    assert {c["figure"] for c in comparisons} >= set(FIGURES)
    for item in comparisons:
        assert {"figure", "a", "b", "ratio", "ci95", "status", "direction", "p_value", "p_adjusted"} <= set(item)
        assert (item["a"], item["b"]) == ("single", "fsdp")
        assert item["status"] in ("established", "equivalent", "not established")
    by_figure = {c["figure"]: c for c in comparisons}
    throughput = by_figure["tokens_per_s"]  # 0.50 s steps against 0.60 s, every single run above every fsdp one
    assert (throughput["status"], throughput["direction"]) == ("established", "higher")
    assert throughput["method"] == "Welch t-test of the mean logarithms" and throughput["p_value"] < 0.001
    assert report_json["figures"]["tokens_per_s"]["margin"] == 0.02
    assert by_figure["step_peak_bytes"]["direction"] == "higher" and by_figure["step_peak_bytes"]["ratio"] == 1.5
    assert by_figure["avg_loss"]["status"] == "equivalent"  # identical losses


def test_time_and_tokens_to_target_per_strategy(report_json: dict) -> None:
    assert report_json["target_loss"] == 7.5 and report_json["price_per_device_hour"] == 2
    seconds = report_json["figures"]["time_to_target_s"]["strategies"]["single"]
    tokens = report_json["figures"]["tokens_to_target"]["strategies"]["single"]
    assert seconds["runs"] == REPEATS and seconds["missing"] == 0 and seconds["min"] < seconds["max"]
    # val loss 10 - 4 x s / 12 + 0.1 reaches 7.5 at step 7.8: between the evaluations at 6 and 12.
    assert tokens["centre"] == pytest.approx(7800.0) and tokens["exact"]


def test_time_to_target_statuses_in_report_json_and_the_html(report_json: dict, tmp_path_factory) -> None:
    by_figure = {c["figure"]: c for c in report_json["comparisons"]}
    seconds, tokens = by_figure["time_to_target_s"], by_figure["tokens_to_target"]
    # single's 0.50-0.53 s steps reach the loss before fsdp's 0.60-0.63 s ones, four runs each.
    assert (seconds["status"], seconds["direction"]) == ("established", "lower")
    assert (tokens["status"], tokens["method"]) == ("equivalent", "exact values")  # the same tokens
    html = next(tmp_path_factory.getbasetemp().glob("repeats*/out/report.html")).read_text()
    assert "Time to loss 7.5: use <strong>single</strong>" in html
    cost = 2 * report_json["figures"]["time_to_target_s"]["strategies"]["single"]["centre"] / 3600
    assert f"cost {cost:,.4f}" in html


def test_mlperf_mean_drops_the_fastest_and_the_slowest(report_json: dict, tmp_path_factory) -> None:
    md = next(tmp_path_factory.getbasetemp().glob("repeats*/out/report.md")).read_text()
    (line,) = [line for line in md.splitlines() if line.startswith("- MLPerf-style training time")]
    assert "single " in line and "fsdp " in line and "n/a" not in line


def test_bad_target_loss_is_a_one_line_error(tmp_path: Path, capsys) -> None:
    run = write_fake_run(tmp_path / "single", "single", 0.5, 1, 6.0)
    with pytest.raises(SystemExit) as exit_info:
        main([str(run), "--out", str(tmp_path / "out"), "--target_loss", "-1"])
    assert exit_info.value.code == 2 and "--target_loss" in capsys.readouterr().err
