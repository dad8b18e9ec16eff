"""report.json beside the report: its shape, strict JSON, repeats grouped by strategy, and the new flags."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from analysis.compare import main

FIGURES = ("tokens_per_s", "step_peak_bytes", "train_time_s", "final_val_loss", "avg_loss")
STEPS, BATCH = 12, 1000
REPEATS = 4  # the fewest runs each at which an exact test of one pair can reach 5% (2 / C(8, 4) = 0.029)


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


def test_figures_give_each_strategy_n_median_min_max_and_interval(report_json: dict) -> None:
    figures = report_json["figures"]
    assert set(FIGURES) <= set(figures)
    for name in FIGURES:
        assert set(figures[name]) == {"single", "fsdp"}, name
        for entry in figures[name].values():
            assert {"n", "median", "min", "max", "ci95", "mlperf_mean"} <= set(entry)
            assert entry["n"] == REPEATS and entry["min"] <= entry["median"] <= entry["max"]
            assert entry["ci95"] is None or (len(entry["ci95"]) == 2 and entry["ci95"][0] <= entry["ci95"][1])
    assert figures["step_peak_bytes"]["fsdp"]["ci95"] == [200 * 2**20, 200 * 2**20]


def test_comparisons_name_every_pair_and_figure_with_a_verdict(report_json: dict) -> None:
    comparisons = report_json["comparisons"]
    assert {c["figure"] for c in comparisons} >= set(FIGURES)
    for item in comparisons:
        assert {"figure", "a", "b", "ratio", "ci95", "verdict"} <= set(item)
        assert (item["a"], item["b"]) == ("single", "fsdp")
        assert item["verdict"] in (
            "higher",
            "lower",
            "no detectable difference",
            "no meaningful difference",
            "not enough runs",
        )
    by_figure = {c["figure"]: c for c in comparisons}
    throughput = by_figure["tokens_per_s"]  # 0.50 s steps against 0.60 s, every single run above every fsdp one
    assert throughput["verdict"] == "higher" and throughput["test"].startswith("exact permutation test")
    assert throughput["p_value"] == pytest.approx(2 / 70) == throughput["p_adjusted"] and throughput["margin"] == 0.02
    assert by_figure["step_peak_bytes"]["verdict"] == "higher" and by_figure["step_peak_bytes"]["ratio"] == 1.5
    assert by_figure["avg_loss"]["verdict"] == "no meaningful difference"  # identical losses


def test_time_to_target_per_strategy(report_json: dict) -> None:
    entry = report_json["time_to_target"]["single"]
    assert {"target_loss", "seconds", "tokens", "cost", "reached", "runs", "spread"} <= set(entry)
    assert entry["target_loss"] == 7.5 and entry["reached"] == entry["runs"] == REPEATS
    # val loss 10 - 4 x s / 12 + 0.1 reaches 7.5 at step 7.8: between the evaluations at 6 and 12.
    assert entry["tokens"] == pytest.approx(7800.0)
    assert entry["cost"] == pytest.approx(2 * entry["seconds"] / 3600)
    assert entry["spread"]["seconds"]["min"] < entry["spread"]["seconds"]["max"]


def test_time_to_target_verdicts_in_report_json_and_the_html(report_json: dict, tmp_path_factory) -> None:
    pairs = report_json["time_to_target_comparisons"]
    assert [(c["figure"], c["a"], c["b"]) for c in pairs] == [
        ("seconds", "single", "fsdp"),
        ("tokens", "single", "fsdp"),
    ]
    seconds, tokens = pairs
    # single's 0.50-0.53 s steps reach the loss before fsdp's 0.60-0.63 s ones, four runs each: the most extreme
    # of C(8, 4) = 70 relabellings, p = 2 / 70.
    assert seconds["median_a"] == pytest.approx(report_json["time_to_target"]["single"]["seconds"])
    assert seconds["verdict"] == "sooner" and seconds["p_value"] == pytest.approx(2 / 70) == seconds["p_adjusted"]
    assert seconds["test"].startswith("exact permutation test of the log-rank statistic")
    assert "log-rank" in seconds["method"]
    assert tokens["verdict"] == "no detectable difference" and tokens["p_value"] == 1.0  # the same tokens
    html = next(tmp_path_factory.getbasetemp().glob("repeats*/out/report.html")).read_text()
    assert "Kaplan-Meier median" in html and "at 5%: single against fsdp in seconds: sooner (p = 0.029)" in html


def test_bad_target_loss_is_a_one_line_error(tmp_path: Path, capsys) -> None:
    run = write_fake_run(tmp_path / "single", "single", 0.5, 1, 6.0)
    with pytest.raises(SystemExit) as exit_info:
        main([str(run), "--out", str(tmp_path / "out"), "--target_loss", "-1"])
    assert exit_info.value.code == 2 and "--target_loss" in capsys.readouterr().err
