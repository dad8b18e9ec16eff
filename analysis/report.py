"""The report: an automatic reading of the runs, the table and the figures, as markdown and HTML.

Every sentence of the reading is computed from the runs; nothing about which strategy wins is
written in advance.
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from analysis.answer import answer_lines, answer_table, figure_line
from analysis.plan_report import FLAG_PCT, PlanSection, plan_section
from analysis.plots import FigureFile, make_figures
from analysis.prediction import measured_lines
from analysis.runs import Run, number, recorded
from analysis.scaling import (
    SCALING_FACTS,
    scaling_lines,
    table_columns,
)
from analysis.table import Table, build_table, to_csv, to_html, to_markdown
from analysis.uncertainty import (
    AVG_LOSS,
    FINAL_VAL_LOSS,
    RESERVED,
    RESIDENT,
    TARGET_SECONDS,
    THROUGHPUT,
    Statistics,
    build_statistics,
    group_by_strategy,
)
from training.durable import write_atomic
from training.records import schema as schema

# Facts that must be equal across runs for the comparison to be like for like, with their names.
FAIRNESS_FACTS = {
    "global_batch_tokens": "global batch (tokens)",
    "tokens_trained": "tokens trained",
    "seed": "seed",
    "data_key": "data (content key)",
    "precision": "precision",
    "preset": "preset",
    "n_params": "parameters",
    "device_name": "device",
}

# The peak MFU is divided by, and when it was measured: runs compared on MFU must share one measurement,
# since a CPU peak is the best measurement seen so far and can rise between runs (training/records/peaks.py).
PEAK_FACTS = ("peak_flops_per_device", "peak_flops_measured_at")

# Two curves with independent noise of std sigma differ by sqrt(2)*sigma RMS; 2*sigma leaves room for
# that and still flags a systematic gap of the order of the noise.
AGREEMENT_FACTOR = 2.0
MIN_CURVE_POINTS = 3


# ---------------------------------------------------------------------------------------------
# Notes below the answer


def units_line(runs: list[Run]) -> list[str]:
    """What a repeat is here: runs of one seed measure time and memory; only other seeds decide losses."""
    groups = group_by_strategy(runs)
    counts = ", ".join(f"{name} {len(members)}" for name, members in groups.items())
    seeds = {name: len({run.fact("seed") for run in members}) for name, members in groups.items()}
    seeded = ", ".join(f"{name} {n}" for name, n in seeds.items())
    return [
        f"Runs per strategy: {counts}; seeds per strategy: {seeded}. Repeats of a seed measure time and memory; "
        "losses are compared over seeds, each seed's repeats averaged first (`--seeds` adds seeds)."
    ]


def loss_lines(report: dict[str, Any]) -> list[str]:
    """The final validation and mean training loss, lowest first, with the status of each gap."""
    lines = [
        figure_line(report, figure, head, lambda v, _: f"{v:.4f} nats", ("**{}** lowest", "**{}** lowest"))
        for figure, head in ((FINAL_VAL_LOSS, "Final validation loss"), (AVG_LOSS, "Mean training loss"))
    ]
    return [line for line in lines if line]


def memory_beside_line(report: dict[str, Any], cpu: bool) -> list[str]:
    """The memory figure beside the step peak: the resident set on a CPU, the reserved peak on a GPU."""
    figure, head = (RESIDENT, "Resident set (per process)") if cpu else (RESERVED, "Reserved memory (per device)")
    line = figure_line(report, figure, head, lambda v, _: f"{v:,.0f} MiB", ("**{}** least", "**{}** least"))
    return [line] if line else []


def not_reached_line(report: dict[str, Any]) -> list[str]:
    """Strategies none of whose runs reached the target have no time to it; say so once."""
    if "target_loss" not in report:
        return []
    reached = report["figures"].get(TARGET_SECONDS, {}).get("strategies", {})
    never = [name for name in report["figures"].get(THROUGHPUT, {}).get("strategies", {}) if name not in reached]
    partly = [f"{name} ({s['missing']} of {s['runs']} runs)" for name, s in reached.items() if s["missing"]]
    said = [f"{_and(never)} never reached validation loss {report['target_loss']:g}"] if never else []
    said += [f"some runs never reached it: {_and(partly)}"] if partly else []
    return [f"Target: {'; '.join(said)}."] if said else []


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def on_cpu(runs: list[Run]) -> bool:
    """On CPU both memory keys hold the process's peak resident set size (see training/records/peaks.py)."""
    return bool(runs) and all(run.fact("device_type") == "cpu" for run in runs)


@dataclass
class Fairness:
    """Which of FAIRNESS_FACTS differ between runs, with each run's value."""

    differing: dict[str, dict[str, Any]] = field(default_factory=dict)
    agreed: dict[str, Any] = field(default_factory=dict)
    # label -> (peak FLOP/s, measured at), only when the runs' peaks differ in figure or measurement time
    peaks: dict[str, tuple[Any, ...]] = field(default_factory=dict)

    @property
    def fair(self) -> bool:
        return not self.differing


def fairness(runs: list[Run]) -> Fairness:
    result = Fairness()
    for key in FAIRNESS_FACTS:
        values = {run.label: run.fact(key) for run in runs}
        if len({repr(v) for v in values.values()}) > 1:
            result.differing[key] = values
        elif values:
            result.agreed[key] = next(iter(values.values()))
    peaks = {run.label: tuple(run.fact(key) for key in PEAK_FACTS) for run in runs}
    if len({repr(peak) for peak in peaks.values()}) > 1:
        result.peaks = peaks
    return result


def fairness_lines(check: Fairness, runs: list[Run]) -> list[str]:
    if len(runs) < 2:
        return []
    if check.fair:
        agreed = ", ".join(f"{FAIRNESS_FACTS[k]} {_show(k, v)}" for k, v in check.agreed.items())
        return [f"Fair comparison: all {len(runs)} runs share {agreed}.", *peak_lines(check)]
    lines = []
    for key, values in check.differing.items():
        shown = ", ".join(f"{label} {_show(key, value)}" for label, value in values.items())
        lines.append(f"**Unfair comparison: {FAIRNESS_FACTS[key]} differs** ({shown}).")
    if "global_batch_tokens" in check.differing:
        lines.append(
            "Unequal global batches change the optimisation itself (steps, noise, learning rate per "
            "token), so the loss and grad-norm comparison is not like for like."
        )
    return lines + peak_lines(check)


def peak_lines(check: Fairness) -> list[str]:
    """One line naming the runs whose MFU is divided by different peaks (figure or measurement time)."""
    if not check.peaks:
        return []
    shown = ", ".join(f"{label} {_peak_text(flops, at)}" for label, (flops, at) in check.peaks.items())
    return [
        f"**MFU is measured against different peaks** ({shown}): their MFU figures are not comparable "
        "with each other; throughput is."
    ]


def _peak_text(flops: Any, measured_at: Any) -> str:
    if not isinstance(flops, (int, float)) or isinstance(flops, bool) or not math.isfinite(flops):
        return "peak not recorded"
    figure = f"{flops / 1e12:,.1f} TFLOP/s" if flops >= 1e12 else f"{flops / 1e9:,.1f} GFLOP/s"
    return f"{figure} measured {measured_at}" if measured_at else f"{figure} (no measurement time)"


COUNTS = {"global_batch_tokens", "tokens_trained", "n_params"}  # shown with thousands separators


def _show(key: str, value: Any) -> str:
    if value is None:
        return "not recorded"
    if key in COUNTS and isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if key == "data_key":
        return str(value)[:12]
    return str(value)


@dataclass
class LossAgreement:
    """Whether the training-loss curves agree within noise (see `CRITERION`)."""

    verdict: str  # "agree", "differ" or "undetermined"
    reference: str = ""
    sigma: float = math.nan  # step-to-step noise of the loss (nats)
    rms: dict[str, float] = field(default_factory=dict)  # label -> RMS difference from the reference
    max_relative: dict[str, float] = field(default_factory=dict)  # label -> max |diff| / reference loss
    reason: str = ""


CRITERION = (
    "Loss agreement: other runs' logged training losses are linearly interpolated onto the reference "
    "run's logged token counts (the first run in the table), over the token range every run covers. "
    f"The curves agree within noise when each run's RMS difference from the reference is at most "
    f"{AGREEMENT_FACTOR:g} sigma, where sigma is the step-to-step noise of the loss: estimated from the "
    "second differences of each run's logged losses (median absolute deviation x 1.4826 / sqrt(6), which "
    "cancels the downward trend and ignores rare spikes), median over the runs. Two curves that differ "
    "only by independent noise of size sigma are sqrt(2) sigma apart (RMS)."
)


def _loss_curve(run: Run) -> tuple[np.ndarray, np.ndarray]:
    by_tokens: dict[float, float] = {}
    for line in run.train:
        tokens, loss = number(line.tokens), number(line.loss)
        if tokens is not None and loss is not None and math.isfinite(loss):
            by_tokens[tokens] = loss  # a resumed run may log a step twice: the later line wins
    tokens_sorted = sorted(by_tokens)
    return np.array(tokens_sorted, dtype=float), np.array([by_tokens[t] for t in tokens_sorted], dtype=float)


def step_noise(loss: np.ndarray) -> float:
    """Step-to-step noise of a loss curve (nats), robust to its trend and to loss spikes.

    Second differences l[i+1] - 2 l[i] + l[i-1] cancel any locally linear trend and leave noise of
    variance 6 sigma^2; their median absolute deviation (x 1.4826 for a normal) ignores rare spikes.
    """
    if loss.size < MIN_CURVE_POINTS:
        return math.nan
    second = np.diff(loss, n=2)
    return float(1.4826 * np.median(np.abs(second - np.median(second))) / math.sqrt(6))


def loss_agreement(runs: list[Run], factor: float = AGREEMENT_FACTOR) -> LossAgreement:
    curves = {run.label: _loss_curve(run) for run in runs}
    curves = {label: curve for label, curve in curves.items() if curve[0].size >= MIN_CURVE_POINTS}
    if len(curves) < 2:
        return LossAgreement("undetermined", reason=f"fewer than two runs with {MIN_CURVE_POINTS}+ logged losses")
    labels = list(curves)
    reference = labels[0]
    start = max(curve[0][0] for curve in curves.values())
    stop = min(curve[0][-1] for curve in curves.values())
    ref_tokens, ref_loss = curves[reference]
    inside = (ref_tokens >= start) & (ref_tokens <= stop)
    if inside.sum() < MIN_CURVE_POINTS:
        return LossAgreement("undetermined", reference, reason="the runs' token ranges barely overlap")
    grid, ref_values = ref_tokens[inside], ref_loss[inside]
    sigma = float(np.median([step_noise(loss) for _, loss in curves.values()]))
    result = LossAgreement("agree", reference, sigma)
    for label in labels[1:]:
        diff = np.interp(grid, *curves[label]) - ref_values
        result.rms[label] = float(np.sqrt(np.mean(diff**2)))
        result.max_relative[label] = float(np.max(np.abs(diff) / np.abs(ref_values)))
        if result.rms[label] > factor * sigma:
            result.verdict = "differ"
    return result


def agreement_lines(result: LossAgreement, check: Fairness) -> list[str]:
    """One line: the largest gap from the reference when every curve agrees, each run beyond noise otherwise."""
    if result.verdict == "undetermined":
        return [f"Loss curves: cannot judge agreement ({result.reason})."]

    def gap(label: str) -> str:
        rms = result.rms[label]
        sigmas = f" = {rms / result.sigma:.1f} sigma" if result.sigma > 0 else ""
        return f"{label} {rms:.4f} nats{sigmas}, max relative {result.max_relative[label]:.2%}"

    if result.verdict == "agree":
        widest = max(result.rms, key=result.rms.__getitem__)
        line = (
            f"Loss curves agree within noise against {result.reference} at equal tokens (sigma = {result.sigma:.4f} "
            f"nats); the largest RMS difference: {gap(widest)}."
        )
    else:
        beyond = [label for label, rms in result.rms.items() if rms > AGREEMENT_FACTOR * result.sigma]
        line = (
            f"Loss curves **differ by more than noise** (more than {AGREEMENT_FACTOR:g} sigma) against "
            f"{result.reference} at equal tokens (sigma = {result.sigma:.4f} nats): {'; '.join(gap(x) for x in beyond)}."
        )
    lines = [line]
    if "global_batch_tokens" in check.differing:
        lines.append("The global batches differ, so agreement or not says little about the strategies themselves.")
    return lines


# ---------------------------------------------------------------------------------------------
# Putting it together


@dataclass
class Reading:
    """What the report says in words: the local report and the W&B report both show this."""

    warnings: list[str]  # shown first: unfair comparison, runs left out
    answer: list[str]  # at most three lines: the strategy for speed, memory and the target
    table: Table  # the compact table under the answer
    notes: list[str]  # every caveat, once
    problems: list[str]  # "run: sentence", one per line
    method: list[str]  # how the figures and the reading are computed


@dataclass
class Report:
    """Everything the report says, rendered to markdown or HTML."""

    title: str
    command: str
    reading: Reading
    table: Table
    scaling: list[str]  # scaling efficiency and cost: how each figure was computed, or why it is n/a
    plan: PlanSection
    figures: list[FigureFile]
    statistics: Statistics | None = None  # written as report.json beside the report


def build_reading(
    runs: list[Run], excluded: list[Run], stats: Statistics | None = None, extra: list[str] | None = None
) -> Reading:
    """The reading of the usable `runs`; `excluded` are listed with their problems only; `stats` (default:
    computed here, without a target) holds every figure and verdict; `extra` notes go after the others."""
    stats = stats if stats is not None else build_statistics(runs)
    report = stats.to_dict()
    check = fairness(runs)
    fair = fairness_lines(check, runs)
    agreed = fair[:1] if check.fair else []  # the "Fair comparison" line is a note, the rest are warnings
    warnings = fair[len(agreed) :]
    if excluded:
        warnings.append(
            f"**{len(excluded)} run(s) left out of the comparison**: "
            + ", ".join(str(run.path) for run in excluded)
            + " (see Problems)."
        )
    notes = [
        *units_line(runs),
        *not_reached_line(report),
        *memory_beside_line(report, on_cpu(runs)),
        *loss_lines(report),
        *agreement_lines(loss_agreement(runs), check),
        *agreed,
        *(extra or []),
    ]
    problems = [f"{run.path}: {problem}" for run in [*runs, *excluded] for problem in run.problems]
    method = [
        "Throughput is tokens trained / training time of the optimizer steps (evaluation and checkpointing "
        "excluded); per-device figures are the whole-job figures divided by the world size, as stored.",
        (
            "Memory on CPU: the step peak is the live tensors at the probe step's peak (summary.json "
            "memory.step_peak_bytes, max over processes), the quantity torch.cuda.max_memory_allocated gives on a "
            "GPU; the resident set is the process's peak since it started. 'device' means process."
            if on_cpu(runs)
            else "Memory is each device's peak since its epoch started, the worst device; the allocated step peak "
            "is a count that repeats exactly."
        ),
        "MFU is achieved FLOP/s per device / the device's peak FLOP/s, in percent.",
        CRITERION,
        f"Fairness: the runs are compared like for like when {', '.join(FAIRNESS_FACTS.values())} agree; "
        "their MFU when they were divided by the same peak (the same figure, measured at the same time).",
        STATISTICS_METHOD,
    ]
    return Reading(warnings, answer_lines(report), answer_table(report), notes, problems, method)


STATISTICS_METHOD = (
    "Statuses: a count that every run of each strategy repeats (the step peak's bytes; on a CPU in fp32 the "
    "losses and tokens to a target) is compared on its values at any number of runs. Other figures with two "
    "runs or more each (seeds, for losses) take Welch's t-test of the mean logarithms, Holm-adjusted over the "
    "figure's pairs: established when the adjusted p is below 5% and the ratio of geometric means lies outside "
    "the practical margin (2% for times and throughput, 1% for memory, 0.5% for losses); equivalent when the "
    "whole 95% interval lies inside it; otherwise not established, with the runs per strategy that give 80% "
    "power at the spread measured here. One run each establishes nothing but exact counts. Rules and their "
    "measured false-verdict rates: lab/results/aa_calibration.md; every figure and comparison: report.json."
)


def report_title(runs: list[Run]) -> str:
    experiments = sorted({str(run.fact("experiment")) for run in runs if run.fact("experiment")})
    return "Strategy comparison" + (f": {', '.join(experiments)}" if experiments else "")


SECTION_METHOD = [
    "Scaling efficiency (%) = tokens/s of a run on N devices / (N x tokens/s of the single run of the comparison "
    f"with the same {', '.join(SCALING_FACTS.values())}; on CPU also the same measured peak and threads per "
    "process) x 100; 100% is perfect scaling. n/a when there is no such single run.",
    "Cost per million tokens = price per device-hour (--gpu_hour_price, in its currency) x devices / 3600 / "
    "tokens/s x 10^6.",
    "Plan beside measurement: rank 0's bytes as planner/cost_model.py predicts them (`python -m planner "
    "--run`) beside summary.json's `memory`; model state = parameters + gradients + AdamW state after an "
    f"optimizer step; error = (predicted - measured) / measured, flagged above {FLAG_PCT:g}%; MiB = 2^20 bytes. "
    "The predicted peak phase is the moment of the step the plan puts the peak at: loss (start of backward: "
    "saved activations and the loss's tensors), embedding (end of backward: the token embedding's gradients "
    "summed) or optimizer (the AdamW update).",
]


def build_report(
    runs: list[Run],
    excluded: list[Run],
    command: str,
    notes: list[str] | None = None,
    gpu_hour_price: float | None = None,
    target_loss: float | None = None,
    mlperf: bool = False,
    prediction: dict[str, Any] | None = None,
    wall_s: float | None = None,
) -> Report:
    """The report of the usable `runs`; `excluded` are listed with their problems only; `gpu_hour_price`
    (per device-hour) prices the runs; `target_loss` adds the time to that validation loss; `mlperf` adds
    MLPerf's mean of the runs less the fastest and the slowest; `prediction` (an experiment's prediction.json)
    is set against the runs' training times and their wall time `wall_s`."""
    stats = build_statistics(runs, target_loss, gpu_hour_price)
    planned = measured_lines(prediction, training_seconds(runs), wall_s) if prediction else []
    extra = [*(mlperf_lines(runs) if mlperf else []), *planned]
    reading = build_reading(runs, excluded, stats, extra)
    reading.problems += notes or []
    reading.method += SECTION_METHOD
    return Report(
        report_title(runs),
        command,
        reading,
        build_table(runs, table_columns(runs, gpu_hour_price)),
        scaling_lines(runs, gpu_hour_price),
        plan_section(runs),
        make_figures(runs),
        stats,
    )


def training_seconds(runs: list[Run]) -> dict[str, float]:
    """Each strategy's training time (summary.json total.train_time_s) summed over its runs."""
    out: dict[str, float] = {}
    for run in runs:
        seconds = recorded(run.total, schema.TRAIN_TIME)
        if seconds is not None and math.isfinite(seconds):
            out[run.strategy] = out.get(run.strategy, 0.0) + seconds
    return out


def mlperf_lines(runs: list[Run]) -> list[str]:
    """MLPerf Training's summary of times: the mean of the runs after dropping the fastest and the slowest."""
    parts = []
    for name, members in group_by_strategy(runs).items():
        times = sorted(t for run in members if (t := recorded(run.total, schema.TRAIN_TIME)) is not None)
        mean = math.fsum(times[1:-1]) / (len(times) - 2) if len(times) >= 3 else None
        parts.append(f"{name} {mean:,.1f} s" if mean is not None else f"{name} n/a (fewer than 3 runs)")
    return [f"MLPerf-style training time (mean of the runs less the fastest and the slowest): {', '.join(parts)}."]


def render_markdown(report: Report) -> str:
    reading = report.reading
    out = [f"# {report.title}", "", f"Produced by `{report.command}`.", ""]
    out += [f"> {line}" for line in reading.warnings] + ([""] if reading.warnings else [])
    out += ["## Answer", "", *(f"- {line}" for line in reading.answer), "", to_markdown(reading.table)]
    out += ["## Notes", "", *(f"- {line}" for line in reading.notes), ""]
    if reading.problems:
        out += ["## Problems", "", *(f"- {line}" for line in reading.problems), ""]
    out += ["## Every run", "", to_markdown(report.table), "Full precision in `table.csv`.", ""]
    out += ["## Scaling efficiency and cost", "", *(f"- {line}" for line in report.scaling), ""]
    out += ["## Plan beside measurement", ""]
    out += [to_markdown(report.plan.table)] if report.plan.table is not None else []
    out += [*(f"- {line}" for line in report.plan.lines), ""]
    out += ["## Figures", ""]
    for figure in report.figures:
        out += [f"### {figure.title}", "", f"![{figure.title}]({figure.filename})", "", figure.caption, ""]
    out += ["## How the figures and the reading are computed", "", *(f"- {line}" for line in reading.method), ""]
    return "\n".join(out)


CSS = """
body { font-family: system-ui, sans-serif; max-width: 1200px; margin: 2em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; font-size: 0.85em; display: block; overflow-x: auto; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.5em; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.warning { background: #fff3cd; border-left: 5px solid #d39e00; padding: 0.6em 1em; margin: 1em 0; }
figure { margin: 1.5em 0; } figure img { max-width: 100%; } figcaption { color: #555; font-size: 0.9em; }
code { background: #f3f3f3; padding: 0 0.2em; }
"""


def _inline(text: str) -> str:
    """The two markdown marks the report uses (**bold**, `code`) as HTML, everything else escaped."""
    escaped = html.escape(text)
    escaped = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", escaped)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", escaped)


def render_html(report: Report) -> str:
    def items(lines: list[str]) -> str:
        return "<ul>\n" + "\n".join(f"<li>{_inline(line)}</li>" for line in lines) + "\n</ul>"

    reading = report.reading
    parts = [f"<h1>{html.escape(report.title)}</h1>", f"<p>Produced by <code>{html.escape(report.command)}</code>.</p>"]
    parts += [f'<div class="warning">{_inline(line)}</div>' for line in reading.warnings]
    parts += ["<h2>Answer</h2>", items(reading.answer), to_html(reading.table), "<h2>Notes</h2>", items(reading.notes)]
    if reading.problems:
        parts += ["<h2>Problems</h2>", items(reading.problems)]
    parts += ["<h2>Every run</h2>", to_html(report.table)]
    parts += ["<h2>Scaling efficiency and cost</h2>", items(report.scaling), "<h2>Plan beside measurement</h2>"]
    parts += [to_html(report.plan.table)] if report.plan.table is not None else []
    parts += [items(report.plan.lines)] if report.plan.lines else []
    parts += ["<h2>Figures</h2>"]
    for figure in report.figures:
        # Embedded as a data URI so the one file can be mailed or archived without its folder.
        data = base64.b64encode(figure.png).decode("ascii")
        parts.append(
            f'<figure><img alt="{html.escape(figure.title)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(figure.caption)}</figcaption></figure>"
        )
    parts += ["<h2>How the figures and the reading are computed</h2>", items(reading.method)]
    body = "\n".join(parts)
    return (
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(report.title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


def write_report(report: Report, out_dir: Path) -> list[Path]:
    """Write table.md, table.csv, the PNGs, report.md, report.html and report.json into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files: dict[str, bytes] = {
        "table.md": to_markdown(report.table).encode(),
        "table.csv": to_csv(report.table).encode(),
        **{figure.filename: figure.png for figure in report.figures},
        "report.md": render_markdown(report).encode(),
        "report.html": render_html(report).encode(),
    }
    if report.statistics is not None:
        files["report.json"] = (json.dumps(report.statistics.to_dict(), indent=2, allow_nan=False) + "\n").encode()
    for name, data in files.items():
        write_atomic(out_dir / name, data)
    return [out_dir / name for name in files]
