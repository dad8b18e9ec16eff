"""The answer first: the report's three lines and table (analysis/answer.py), on the sample's real runs repeated
and on report.json entries made by hand, case by case."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analysis.answer import answer_lines, answer_table
from analysis.compare import load_comparison, main
from analysis.uncertainty import STEP_PEAK, THROUGHPUT, build_statistics
from tests.analysis_fixtures import scaled_sample_runs


@pytest.fixture(scope="module")
def three_each(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """`python -m analysis.compare` over the sample's runs repeated 3 times each, and what it printed."""
    root = tmp_path_factory.mktemp("three_each")
    runs = scaled_sample_runs(root / "runs", 3)
    out = root / "report"
    return out, _compare([*runs, "--out", out, "--target_loss", "9.5"])


def _compare(argv: list[Any]) -> str:
    import contextlib
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main([str(a) for a in argv]) == 0
    return printed.getvalue()


def _answer(report_md: str) -> str:
    return report_md.split("## Answer\n", 1)[1].split("\n## ", 1)[0]


def test_three_runs_each_establish_the_speed_and_memory_answer_first(three_each: tuple[Path, str]) -> None:
    out, _ = three_each
    report = json.loads((out / "report.json").read_text())
    speed, memory, target = answer_lines(report)
    assert speed.startswith("Speed: use **ddp**, ") and speed.endswith("established.")
    assert re.search(r"1\.\d\dx single \(95% CI 1\.\d\d-1\.\d\d, 3 runs each\)", speed)
    assert re.search(r"1\.0\dx fsdp \(95% CI 1\.\d\d-1\.\d\d, 3 runs each\)", speed)
    single_fsdp = [c for c in report["comparisons"] if (c["figure"], c["a"], c["b"]) == (THROUGHPUT, "single", "fsdp")]
    assert [(c["status"], c["direction"]) for c in single_fsdp] == [("established", "lower")]
    assert memory.startswith("Memory: use **fsdp**, step peak 330.4 MiB; 0.94x ddp (exact, 3 runs each)")
    assert target.startswith("Time to loss 9.5: use **ddp**")
    text = (out / "report.md").read_text()
    lines = text.splitlines()
    assert lines[4] == "## Answer" and lines[6] == f"- {speed}"  # after the title and the command: the answer


def test_no_tie_and_no_cannot_decide_anywhere(three_each: tuple[Path, str]) -> None:
    out, _ = three_each
    text = (out / "report.md").read_text() + (out / "report.html").read_text()
    for phrase in ("tied", "no detectable difference", "not enough runs", "no verdict"):
        assert phrase not in text


def test_at_most_350_words_before_the_first_table_and_no_sentence_twice(three_each: tuple[Path, str]) -> None:
    out, _ = three_each
    text = (out / "report.md").read_text()
    before = text.split("\n|", 1)[0]
    assert len(before.split()) <= 350
    said = _answer(text) + text.split("## Notes\n", 1)[1].split("\n## ", 1)[0]
    sentences = [s.strip() for s in re.split(r"(?<=\.)\s", said) if len(s.split()) > 3 and not s.startswith("|")]
    assert len(sentences) == len(set(sentences))


def test_the_console_prints_the_answer_and_what_the_repeats_can_decide(three_each: tuple[Path, str]) -> None:
    _, printed = three_each
    first = printed.splitlines()
    assert first[0].startswith("Speed: use ddp, ") and first[1].startswith("Memory: use fsdp")
    assert "Repeats of a seed measure time and memory; losses are compared over seeds" in printed


def test_the_compact_table_has_one_row_per_strategy_the_fastest_first(three_each: tuple[Path, str]) -> None:
    out, _ = three_each
    table = answer_table(json.loads((out / "report.json").read_text()))
    assert table.headers[:5] == ["strategy", "runs", "throughput (tokens/s)", "x fastest", "step peak (MiB)"]
    assert [row[0] for row in table.rows] == ["ddp", "fsdp", "single"]
    assert [row[1] for row in table.rows] == [3, 3, 3]
    assert table.rows[0][3] == 1.0 and 0.5 < table.rows[2][3] < 0.6
    assert [row[-1] for row in table.rows] == ["fastest", "slower, established", "slower, established"]


@pytest.mark.parametrize("repeats", [1, 3, 6])
def test_fsdps_step_peak_is_decided_against_both_at_any_number_of_runs(tmp_path: Path, repeats: int) -> None:
    usable, _ = load_comparison(scaled_sample_runs(tmp_path, repeats, seed=repeats))
    statistics = build_statistics(usable)
    for other in ("single", "ddp"):
        c = statistics.comparison(STEP_PEAK, "fsdp", other)
        assert (c.status, c.direction) == ("established", "lower")
    assert answer_lines(statistics.to_dict())[1].endswith(": established.")


def test_two_runs_each_already_establish_a_1_8x_gap(tmp_path: Path) -> None:
    usable, _ = load_comparison(scaled_sample_runs(tmp_path, 2, seed=5))
    c = build_statistics(usable).comparison(THROUGHPUT, "ddp", "single")
    assert c.status == "established" and c.ratio > 1.7


def test_the_same_runs_under_other_names_and_orders_give_the_same_p_values_and_statuses(tmp_path: Path) -> None:
    runs = scaled_sample_runs(tmp_path / "runs", 9, seed=9, strategies=("single", "ddp"))

    def said(paths: list[Path]) -> dict[tuple[str, ...], tuple[Any, ...]]:
        usable, _ = load_comparison(paths)
        out = {}
        for c in build_statistics(usable).comparisons:
            key, flip = (c.figure, *sorted((c.a, c.b))), (c.a, c.b) != tuple(sorted((c.a, c.b)))
            out[key] = (
                c.p_value,
                c.p_adjusted,
                c.status,
                {"higher": "lower", "lower": "higher"}.get(c.direction, c.direction) if flip else c.direction,
            )
        return out

    reference = said(runs)
    rng = np.random.default_rng(20)
    for trial in range(20):
        renamed = []
        for i in rng.permutation(len(runs)):
            target = tmp_path / f"trial{trial}" / f"{rng.integers(1e9):x}"
            shutil.copytree(runs[i], target)
            renamed.append(target)
        assert said(renamed) == reference


# ---------------------------------------------------------------------------------------------
# The wording, from report.json entries made by hand


def _report(comparisons: list[dict[str, Any]], runs: int = 3, unit: str = "run") -> dict[str, Any]:
    figure = {
        "title": "throughput",
        "unit": "tokens/s",
        "higher_is_better": True,
        "margin": 0.02,
        "unit_of_replication": unit,
        "strategies": {
            name: {"runs": runs, "units": runs, "centre": centre, "missing": 0}
            for name, centre in (("ddp", 1900.0), ("fsdp", 1800.0), ("single", 1000.0))
        },
    }
    return {"figures": {THROUGHPUT: figure}, "comparisons": comparisons}


def _pair(b: str, ratio: float, status: str, **rest: Any) -> dict[str, Any]:
    entry = {"figure": THROUGHPUT, "a": "ddp", "b": b, "units_a": 3, "units_b": 3, "ratio": ratio, "ci95": None}
    entry.update(method="Welch t-test of the mean logarithms", status=status, direction=None, reason="")
    return {**entry, **rest}


def test_not_established_says_what_would_establish_it_and_never_reads_as_a_tie() -> None:
    report = _report(
        [
            _pair(
                "fsdp", 1.05, "not established", ci95=[0.97, 1.13], units_needed=7, spread=0.04, spread_measured=True
            ),
            _pair("single", 1.9, "established", ci95=[1.8, 2.0], direction="higher"),
        ]
    )
    (line,) = answer_lines(report)
    assert line == (
        "Speed: **ddp** leads, 1,900 tokens/s; 1.05x fsdp (95% CI 0.97-1.13, 3 runs each): not established: 7 runs "
        "each would establish it; 1.90x single (95% CI 1.80-2.00, 3 runs each): established (run-to-run spread "
        "4.0%, measured)."
    )


def test_equivalent_names_the_margin_and_an_assumed_spread_is_said_to_be_assumed() -> None:
    report = _report(
        [
            _pair("fsdp", 1.005, "equivalent", ci95=[0.995, 1.015]),
            _pair(
                "single",
                1.9,
                "not established",
                units_a=1,
                units_b=1,
                units_needed=3,
                spread=0.05,
                spread_measured=False,
            ),
        ],
        runs=1,
    )
    (line,) = answer_lines(report)
    assert "1.00x fsdp (95% CI 0.99-1.01, 3 runs each): equivalent within the 2% margin" in line
    assert "1.90x single (1 run each): not established: 3 runs each would establish it" in line
    assert line.endswith("(run-to-run spread 5.0%, assumed: no strategy has 2 runs to measure it).")


def test_one_status_for_every_pair_is_said_once() -> None:
    report = _report(
        [
            _pair("fsdp", 1.06, "established", ci95=[1.03, 1.09], direction="higher"),
            _pair("single", 1.9, "established", ci95=[1.8, 2.0], direction="higher"),
        ]
    )
    (line,) = answer_lines(report)
    assert line.count("established") == 1 and line.startswith("Speed: use **ddp**")


def test_a_target_only_one_strategy_reached_is_said_so() -> None:
    report = _report([])
    report["target_loss"] = 4.0
    report["figures"]["time_to_target_s"] = {
        **report["figures"][THROUGHPUT],
        "higher_is_better": False,
        "strategies": {"ddp": {"runs": 3, "units": 2, "centre": 12.5, "missing": 1}},
    }
    assert answer_lines(report)[-1] == "Time to loss 4: only **ddp** reached it (2 of 3 runs), 12.5 s."


def test_a_comparison_with_a_reason_says_it() -> None:
    report = _report([_pair("fsdp", 0.8, "not established", reason="2 of 3 runs of fsdp never reached it")])
    report["figures"][THROUGHPUT]["strategies"].pop("single")
    assert answer_lines(report) == [
        "Speed: **ddp** leads, 1,900 tokens/s; 0.80x fsdp (3 runs each): not established (2 of 3 runs of fsdp "
        "never reached it)."
    ]


def test_a_strategy_whose_runs_did_not_all_reach_the_target_ranks_last() -> None:
    report = _report([])
    report["target_loss"] = 4.0
    report["figures"]["time_to_target_s"] = {
        **report["figures"][THROUGHPUT],
        "higher_is_better": False,
        "strategies": {
            "ddp": {"runs": 3, "units": 1, "centre": 5.0, "missing": 2},
            "fsdp": {"runs": 3, "units": 3, "centre": 12.5, "missing": 0},
        },
    }
    report["comparisons"] = [
        {
            **_pair("fsdp", 10.0, "not established", reason="2 of 3 runs of ddp never reached it"),
            "figure": "time_to_target_s",
        }
    ]
    assert answer_lines(report)[-1].startswith("Time to loss 4: **fsdp** leads, 12.5 s; 0.10x ddp (3 runs each)")
