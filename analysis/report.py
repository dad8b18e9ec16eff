"""The report: an automatic reading of the runs, the table and the figures, as markdown and HTML.

Every sentence of the reading is computed from the runs; nothing about which strategy wins is
written in advance.
"""

from __future__ import annotations

import base64
import html
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from analysis.plan_report import FLAG_PCT, PlanSection, plan_section
from analysis.plots import FigureFile, make_figures
from analysis.runs import Run, number
from analysis.scaling import (SCALING_FACTS, scaling_efficiency, scaling_lines, table_columns, throughput_key,
                              throughput_name)
from analysis.table import Table, build_table, to_csv, to_html, to_markdown
from training.rundir import write_atomic

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
# since a CPU peak is the best measurement seen so far and can rise between runs (training/hardware.py).
PEAK_FACTS = ("peak_flops_per_device", "peak_flops_measured_at")

# Two curves with independent noise of std sigma differ by sqrt(2)*sigma RMS; 2*sigma leaves room for
# that and still flags a systematic gap of the order of the noise.
AGREEMENT_FACTOR = 2.0
MIN_CURVE_POINTS = 3
TIE_RELATIVE = 0.01  # throughputs within 1% are called a tie: timing noise is at least that large


# ---------------------------------------------------------------------------------------------
# The reading


def fastest_reading(runs: list[Run]) -> list[str]:
    key = throughput_key(runs)
    ranked = _ranked(runs, lambda run: number(run.total.get(key)), highest_first=True)
    if len(ranked) < 2:
        return ["Throughput: fewer than two runs with a throughput; nothing to rank."]
    (best, best_value), rest = ranked[0], ranked[1:]
    which = throughput_name(key)
    if best_value <= rest[0][1] * (1 + TIE_RELATIVE):
        lead = (f"Throughput: **{best.label}** and **{rest[0][0].label}** are practically tied "
                f"(within {TIE_RELATIVE:.0%}): {best_value:,.0f} vs {rest[0][1]:,.0f} tokens/s ({which})")
    else:
        lead = f"Throughput: **{best.label}** is fastest with {best_value:,.0f} tokens/s ({which})"
    comparisons = ", ".join(
        f"{best_value / value:.2f}x {run.label} ({value:,.0f} tokens/s, +{best_value / value - 1:.0%})"
        for run, value in rest if value > 0
    )
    lines = [f"{lead}: {comparisons}." if comparisons else f"{lead}."]
    lines += _per_device_line(runs, key)
    return lines


def _per_device_line(runs: list[Run], key: str) -> list[str]:
    """Per-device throughput of each run against its comparable single run's (its scaling efficiency), from
    the same whole-job figure (`key`) that ranked the runs, so the two lines never mix warm-up in and out."""
    parts, baselines = [], {}
    for run in runs:
        result = scaling_efficiency(run, runs, key)
        if result.efficiency is not None and result.baseline is not None:
            parts.append(f"{run.label} {result.tokens_per_s / result.devices:,.0f} tokens/s per device = "
                         f"{result.efficiency:.0%} of {result.baseline.label}")
            baselines[result.baseline.label] = result.baseline_tokens_per_s
    shown = ", ".join(f"{label}: {value:,.0f} tokens/s" for label, value in baselines.items())
    return [f"Per device: {'; '.join(parts)} ({shown})."] if parts else []


def on_cpu(runs: list[Run]) -> bool:
    """On CPU both memory keys hold the process's peak resident set size (see training/hardware.py)."""
    return bool(runs) and all(run.fact("device_type") == "cpu" for run in runs)


def memory_reading(runs: list[Run]) -> list[str]:
    kinds = {"allocated": "Peak memory (resident set size, per process, max over processes)"} if on_cpu(runs) else {
        "allocated": "Peak memory (allocated, per device, max over devices)",
        "reserved": "Peak memory (reserved, per device, max over devices)",
    }
    lines = []
    for kind, title in kinds.items():
        key = f"peak_mem_{kind}_mib_max"
        ranked = _ranked(runs, lambda run, key=key: number(run.total.get(key)), highest_first=False)
        if len(ranked) < 2:
            continue
        (best, best_value), rest = ranked[0], ranked[1:]
        comparisons = ", ".join(
            f"{1 - best_value / value:.0%} less than {run.label} ({value:,.0f} MiB)" for run, value in rest if value > 0
        )
        lines.append(f"{title}: **{best.label}** uses least, "
                     f"{best_value:,.0f} MiB" + (f": {comparisons}." if comparisons else "."))
    return lines or ["Peak memory: fewer than two runs with memory figures; nothing to rank."]


def _ranked(runs: list[Run], value: Any, highest_first: bool) -> list[tuple[Run, float]]:
    pairs = [(run, v) for run in runs if (v := value(run)) is not None and math.isfinite(v)]
    return sorted(pairs, key=lambda pair: -pair[1] if highest_first else pair[1])


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
        lines.append("Unequal global batches change the optimisation itself (steps, noise, learning rate per "
                     "token), so the loss and grad-norm comparison is not like for like.")
    return lines + peak_lines(check)


def peak_lines(check: Fairness) -> list[str]:
    """One line naming the runs whose MFU is divided by different peaks (figure or measurement time)."""
    if not check.peaks:
        return []
    shown = ", ".join(f"{label} {_peak_text(flops, at)}" for label, (flops, at) in check.peaks.items())
    return [f"**MFU is measured against different peaks** ({shown}): their MFU figures are not comparable "
            "with each other; throughput is."]


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
        tokens, loss = number(line.get("tokens")), number(line.get("loss"))
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
    if result.verdict == "undetermined":
        return [f"Loss curves: cannot judge agreement ({result.reason})."]
    details = "; ".join(
        f"{label}: RMS difference {rms:.4f} nats = {rms / result.sigma:.1f} sigma, max relative {result.max_relative[label]:.2%}"
        if result.sigma > 0 else f"{label}: RMS difference {rms:.4f} nats"
        for label, rms in result.rms.items()
    )
    verdict = ("agree within noise" if result.verdict == "agree"
               else f"**differ by more than noise** (more than {AGREEMENT_FACTOR:g} sigma)")
    line = (f"Loss curves {verdict} against {result.reference} at equal tokens "
            f"(sigma = {result.sigma:.4f} nats): {details}.")
    lines = [line]
    if "global_batch_tokens" in check.differing:
        lines.append("The global batches differ, so agreement or not says little about the strategies themselves.")
    return lines


def final_loss_line(runs: list[Run]) -> list[str]:
    parts = []
    for run in runs:
        train, val = number(run.total.get("final_loss")), number(run.total.get("final_val_loss"))
        if train is not None:
            parts.append(f"{run.label} {train:.4f}" + (f" (validation {val:.4f})" if val is not None else ""))
    return [f"Final training loss (nats): {', '.join(parts)}."] if len(parts) > 1 else []


# ---------------------------------------------------------------------------------------------
# Putting it together


@dataclass
class Reading:
    """What the report says in words: the local report and the W&B report both show this."""

    warnings: list[str]  # shown first: unfair comparison, runs left out
    lines: list[str]
    problems: list[str]  # "run: sentence", one per line
    method: list[str]  # how the figures and the reading are computed


@dataclass
class Report:
    """Everything the report says, rendered to markdown or HTML."""

    title: str
    command: str
    warnings: list[str]  # shown first: unfair comparison, runs left out
    reading: list[str]
    problems: list[str]  # "run: sentence", one per line
    table: Table
    scaling: list[str]  # scaling efficiency and cost: how each figure was computed, or why it is n/a
    plan: PlanSection
    figures: list[FigureFile]
    method: list[str]


def build_reading(runs: list[Run], excluded: list[Run]) -> Reading:
    """The reading of the usable `runs`; `excluded` are listed with their problems only."""
    check = fairness(runs)
    fair = fairness_lines(check, runs)
    agreed = fair[:1] if check.fair else []  # the "Fair comparison" line is a reading, the rest are warnings
    warnings = fair[len(agreed):]
    if excluded:
        warnings.append(f"**{len(excluded)} run(s) left out of the comparison**: "
                        + ", ".join(str(run.path) for run in excluded) + " (see Problems).")
    lines = [*fastest_reading(runs), *memory_reading(runs),
             *agreement_lines(loss_agreement(runs), check), *final_loss_line(runs)]
    lines += agreed
    problems = [f"{run.path}: {problem}" for run in [*runs, *excluded] for problem in run.problems]
    method = [
        "Throughput is tokens trained / training time of the optimizer steps (evaluation and checkpointing "
        "excluded); per-device figures are the whole-job figures divided by the world size, as stored.",
        ("Memory on CPU is each process's peak resident set size since it started (the operating system "
         "cannot reset it per epoch); 'device' means process. 'max over devices' is the worst process, "
         "'mean over devices' the average one." if on_cpu(runs) else
         "Memory is each device's peak since its epoch started; 'max over devices' is the worst device, "
         "'mean over devices' the average device."),
        "MFU is achieved FLOP/s per device / the device's peak FLOP/s, in percent.",
        CRITERION,
        f"Fairness: the runs are compared like for like when {', '.join(FAIRNESS_FACTS.values())} agree; "
        "their MFU when they were divided by the same peak (the same figure, measured at the same time).",
    ]
    return Reading(warnings, lines, problems, method)


def report_title(runs: list[Run]) -> str:
    experiments = sorted({str(run.fact("experiment")) for run in runs if run.fact("experiment")})
    return "Strategy comparison" + (f": {', '.join(experiments)}" if experiments else "")


SECTION_METHOD = [
    "Scaling efficiency (%) = tokens/s of a run on N devices / (N x tokens/s of the single run of the comparison "
    f"with the same {', '.join(SCALING_FACTS.values())}; on CPU also the same measured peak and threads per "
    "process) x 100; 100% is perfect scaling. n/a when there is no such single run.",
    "Cost per million tokens = price per device-hour (--gpu_hour_price, in its currency) x devices / 3600 / "
    "tokens/s x 10^6.",
    "Plan beside measurement: rank 0's bytes as analysis/plan_model.py predicts them (`python -m analysis.plan "
    "--run`) beside summary.json's `memory`; model state = parameters + gradients + AdamW state after an "
    f"optimizer step; error = (predicted - measured) / measured, flagged above {FLAG_PCT:g}%; MiB = 2^20 bytes. "
    "The predicted peak phase is the moment of the step the plan puts the peak at: loss (start of backward: "
    "saved activations and the loss's tensors), embedding (end of backward: the token embedding's gradients "
    "summed) or optimizer (the AdamW update).",
]


def build_report(runs: list[Run], excluded: list[Run], command: str, notes: list[str] | None = None,
                 gpu_hour_price: float | None = None) -> Report:
    """The report of the usable `runs`; `excluded` are listed with their problems only; `gpu_hour_price`
    (per device-hour) prices the runs."""
    reading = build_reading(runs, excluded)
    return Report(report_title(runs), command, reading.warnings, reading.lines, [*reading.problems, *(notes or [])],
                  build_table(runs, table_columns(runs, gpu_hour_price)), scaling_lines(runs, gpu_hour_price),
                  plan_section(runs), make_figures(runs), [*reading.method, *SECTION_METHOD])


def render_markdown(report: Report) -> str:
    out = [f"# {report.title}", "", f"Produced by `{report.command}`.", ""]
    out += [f"> {line}" for line in report.warnings] + ([""] if report.warnings else [])
    out += ["## Reading", "", *(f"- {line}" for line in report.reading), ""]
    if report.problems:
        out += ["## Problems", "", *(f"- {line}" for line in report.problems), ""]
    out += ["## Table", "", to_markdown(report.table), "Full precision in `table.csv`.", ""]
    out += ["## Scaling efficiency and cost", "", *(f"- {line}" for line in report.scaling), ""]
    out += ["## Plan beside measurement", ""]
    out += [to_markdown(report.plan.table)] if report.plan.table is not None else []
    out += [*(f"- {line}" for line in report.plan.lines), ""]
    out += ["## Figures", ""]
    for figure in report.figures:
        out += [f"### {figure.title}", "", f"![{figure.title}]({figure.filename})", "", figure.caption, ""]
    out += ["## How the figures and the reading are computed", "", *(f"- {line}" for line in report.method), ""]
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

    parts = [f"<h1>{html.escape(report.title)}</h1>",
             f"<p>Produced by <code>{html.escape(report.command)}</code>.</p>"]
    parts += [f'<div class="warning">{_inline(line)}</div>' for line in report.warnings]
    parts += ["<h2>Reading</h2>", items(report.reading)]
    if report.problems:
        parts += ["<h2>Problems</h2>", items(report.problems)]
    parts += ["<h2>Table</h2>", to_html(report.table)]
    parts += ["<h2>Scaling efficiency and cost</h2>", items(report.scaling), "<h2>Plan beside measurement</h2>"]
    parts += [to_html(report.plan.table)] if report.plan.table is not None else []
    parts += [items(report.plan.lines)] if report.plan.lines else []
    parts += ["<h2>Figures</h2>"]
    for figure in report.figures:
        # Embedded as a data URI so the one file can be mailed or archived without its folder.
        data = base64.b64encode(figure.png).decode("ascii")
        parts.append(f'<figure><img alt="{html.escape(figure.title)}" src="data:image/png;base64,{data}">'
                     f"<figcaption>{html.escape(figure.caption)}</figcaption></figure>")
    parts += ["<h2>How the figures and the reading are computed</h2>", items(report.method)]
    body = "\n".join(parts)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f"<title>{html.escape(report.title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n")


def write_report(report: Report, out_dir: Path) -> list[Path]:
    """Write table.md, table.csv, the PNGs, report.md and report.html into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files: dict[str, bytes] = {
        "table.md": to_markdown(report.table).encode(),
        "table.csv": to_csv(report.table).encode(),
        **{figure.filename: figure.png for figure in report.figures},
        "report.md": render_markdown(report).encode(),
        "report.html": render_html(report).encode(),
    }
    for name, data in files.items():
        write_atomic(out_dir / name, data)
    return [out_dir / name for name in files]
