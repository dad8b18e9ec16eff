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

from analysis.permutation import MONTE_CARLO_RESAMPLES
from analysis.plan_report import FLAG_PCT, PlanSection, plan_section
from analysis.plots import FigureFile, make_figures
from analysis.prediction import measured_lines
from analysis.runs import Run, number, recorded
from analysis.scaling import (
    SCALING_FACTS,
    ranked_throughput,
    scaling_efficiency,
    scaling_lines,
    table_columns,
    throughput_name,
)
from analysis.table import Table, build_table, to_csv, to_html, to_markdown
from analysis.uncertainty import (
    AVG_LOSS,
    FINAL_VAL_LOSS,
    HIGHER,
    LOWER,
    MIB,
    NEGLIGIBLE,
    NO_VERDICT,
    RESERVED,
    RESIDENT,
    SAME,
    SINGLE,
    STEP_BOOTSTRAP,
    STEP_PEAK,
    THROUGHPUT,
    TOO_CORRELATED,
    TOO_FEW,
    TRAIN_TIME,
    Comparison,
    Statistics,
    Summary,
    best_first,
    build_statistics,
)
from training import run_schema as schema
from training.durable import write_atomic

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


# ---------------------------------------------------------------------------------------------
# The reading


def fastest_reading(runs: list[Run], stats: Statistics | None = None) -> list[str]:
    """Throughput: the leader and every other strategy's ratio to it, with the verdict its interval allows."""
    stats = stats if stats is not None else build_statistics(runs)
    summaries = stats.figures.get(THROUGHPUT, {})
    if len(summaries) < 2:
        return ["Throughput: fewer than two strategies with a throughput; nothing to rank."]
    which = throughput_name(ranked_throughput(runs))
    order = best_first(summaries, schema.THROUGHPUT.better)
    best, rest = order[0], order[1:]
    against = {name: stats.comparison(THROUGHPUT, best, name) for name in rest}
    verdicts = {name: c.verdict if c is not None else TOO_FEW for name, c in against.items()}
    shown = f"{summaries[best].median:,.0f} tokens/s ({which}; {_interval_text(summaries[best], ',.0f')})"
    tied = [name for name in rest if verdicts[name] in (SAME, NEGLIGIBLE)]
    if all(v == HIGHER for v in verdicts.values()):
        lead = f"Throughput: **{best}** is fastest with {shown}"
    elif tied:
        lead = (
            f"Throughput: **{best}** and {_and([f'**{name}**' for name in tied])} are practically tied "
            f"(no detectable difference): {best} {shown}"
        )
    else:
        lead = f"Throughput: **{best}** has the highest figure, {shown}, but it cannot be ranked"
    parts = ", ".join(
        _ratio_text(against[name], name, f"{summaries[name].median:,.0f} tokens/s")
        for name in rest
        if against[name] is not None
    )
    lines = [f"{lead}: {parts}." if parts else f"{lead}."]
    if any(verdict == NO_VERDICT for verdict in verdicts.values()):
        lines.append(ONE_RUN_NOTE)
    elif any(summary.method in (STEP_BOOTSTRAP, TOO_CORRELATED) for summary in summaries.values()):
        blocks = ", ".join(
            f"{name} {'blocks of ' + str(s.block) + ' steps' if s.method == STEP_BOOTSTRAP else 'none: ' + s.method}"
            for name, s in summaries.items()
        )
        lines.append(f"{STEP_NOTE} Bootstrap per strategy: {blocks}.")
    lines += _per_device_line(runs, ranked_throughput(runs))
    return lines


STEP_NOTE = (
    "One run per strategy: the throughput intervals come from each run's own step times (warm-up steps "
    "excluded), a moving-block bootstrap whose blocks span the steps' measured autocorrelation (no interval "
    "where it spans a quarter of the run), so they see step-to-step noise but not drift between runs (another "
    "job on the machine, clocks, a different node); repeated runs (`--repeats`) see that too."
)
ONE_RUN_NOTE = (
    "One run per strategy: no throughput verdict. A run's step times see step-to-step noise, not drift between "
    "runs (another job on the machine, clocks, a different node), and an interval built from them calls "
    "identical strategies different far more often than 5% of the time (`python -m analysis.calibration`, "
    "docs/statistics.md); the repeats named above, at 5% run-to-run noise, would decide (`--repeats`)."
)


def _ratio_text(comparison: Comparison, name: str, value: str) -> str:
    """'1.20x fsdp (60,600 tokens/s; 95% interval 1.17-1.23x: higher)'."""
    if comparison.verdict == NO_VERDICT:
        needed = comparison.repeats_needed
        decide = f"{needed} runs per strategy would decide" if needed else "no practical number of runs decides"
        return f"{comparison.ratio:.2f}x {name} ({value}; {NO_VERDICT}: {decide})"
    if comparison.ci95 is None:
        return f"{comparison.ratio:.2f}x {name} ({value}; no interval: {comparison.verdict})"
    low, high = comparison.ci95
    return (
        f"{comparison.ratio:.2f}x {name} ({value}; 95% interval {low:.2f}-{high:.2f}x{_test_text(comparison)}: "
        f"{comparison.verdict})"
    )


def _test_text(comparison: Comparison) -> str:
    """'; p = 0.100, Holm-adjusted 0.300 (the smallest 3 and 3 runs allow: 4 runs each would decide)'."""
    if comparison.p_value is None or comparison.p_adjusted is None:
        return ""
    text = f", p = {comparison.p_value:.3f}"
    if comparison.p_adjusted != comparison.p_value:
        text += f", Holm-adjusted {comparison.p_adjusted:.3f}"
    if comparison.repeats_needed is not None and comparison.smallest_p is not None:
        text += (
            f" (no exact test can reach 5% at these runs: {comparison.repeats_needed} runs per strategy would allow a "
            "verdict)"
        )
    return text


def _interval_text(summary: Summary, spec: str) -> str:
    """'n = 3 runs, 95% interval 1-2' or 'n = 1 run, no interval'."""
    runs = f"n = {summary.n} run{'s' if summary.n != 1 else ''}"
    if summary.ci95 is None:
        return f"{runs}, no interval"
    low, high = summary.ci95
    return f"{runs}, 95% interval {low:{spec}}-{high:{spec}}" if low != high else f"{runs}, exact"


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _per_device_line(runs: list[Run], key: schema.Metric) -> list[str]:
    """Per-device throughput of each run against its comparable single run's (its scaling efficiency), from
    the same whole-job figure (`key`) that ranked the runs, so the two lines never mix warm-up in and out."""
    parts, baselines = [], {}
    for run in runs:
        result = scaling_efficiency(run, runs, key)
        if result.efficiency is not None and result.baseline is not None:
            parts.append(
                f"{run.label} {result.tokens_per_s / result.devices:,.0f} tokens/s per device = "
                f"{result.efficiency:.0%} of {result.baseline.label}"
            )
            baselines[result.baseline.label] = result.baseline_tokens_per_s
    shown = ", ".join(f"{label}: {value:,.0f} tokens/s" for label, value in baselines.items())
    return [f"Per device: {'; '.join(parts)} ({shown})."] if parts else []


def on_cpu(runs: list[Run]) -> bool:
    """On CPU both memory keys hold the process's peak resident set size (see training/hardware.py)."""
    return bool(runs) and all(run.fact("device_type") == "cpu" for run in runs)


def memory_reading(runs: list[Run], stats: Statistics | None = None) -> list[str]:
    """The live-tensor step peak is ranked by its comparisons; the figure beside it (resident set size on
    CPU, reserved on a GPU) is shown, and ranked only where repeats put a difference outside its noise."""
    stats = stats if stats is not None else build_statistics(runs)
    cpu = on_cpu(runs)
    lines = []
    peaks = stats.figures.get(STEP_PEAK, {})
    if len(peaks) >= 2:
        title = (
            "Peak memory (live tensors at the step peak, per process, max over processes)"
            if cpu
            else "Peak memory (allocated, per device, max over devices)"
        )
        lines.append(_least_memory(stats, peaks, title))
    beside = RESIDENT if cpu else RESERVED
    if len(stats.figures.get(beside, {})) >= 2:
        title = (
            "Peak memory (resident set size, per process, max over processes)"
            if cpu
            else "Peak memory (reserved, per device, max over devices)"
        )
        lines.append(_memory_beside(stats, beside, title))
    return lines or ["Peak memory: fewer than two strategies with memory figures; nothing to rank."]


def _least_memory(stats: Statistics, peaks: dict[str, Summary], title: str) -> str:
    order = best_first(peaks, schema.PEAK_ALLOCATED.better)  # the step peak is one step's allocated peak
    best, rest = order[0], order[1:]
    against = {name: stats.comparison(STEP_PEAK, best, name) for name in rest}
    verdicts = [c.verdict if c is not None else TOO_FEW for c in against.values()]
    value = f"{peaks[best].median / MIB:,.0f} MiB"
    if all(v == LOWER for v in verdicts):
        lead = f"{title}: **{best}** uses least, {value}"
    else:
        lead = f"{title}: **{best}** has the lowest figure, {value}, but it cannot be ranked"
    parts = ", ".join(
        f"{1 - c.ratio:.0%} less than {name} ({peaks[name].median / MIB:,.0f} MiB; {_verdict_text(c)})"
        for name, c in against.items()
        if c is not None
    )
    return f"{lead}: {parts}." if parts else f"{lead}."


def _memory_beside(stats: Statistics, figure: str, title: str) -> str:
    summaries = stats.figures[figure]
    values = ", ".join(
        f"{name} {s.median:,.0f} MiB" + (f" (n = {s.n})" if s.n > 1 else "") for name, s in summaries.items()
    )
    ranked = [c for c in stats.comparisons if c.figure == figure and c.verdict in (HIGHER, LOWER)]
    if ranked:
        outside = "; ".join(f"{c.a} / {c.b} = {c.ratio:.2f} ({_verdict_text(c)})" for c in ranked)
        return f"{title}, shown beside: {values}; outside its noise: {outside}."
    why = (
        "one run per strategy gives it no interval"
        if all(s.n == 1 for s in summaries.values())
        else "no pair's 95% interval excludes 1"
    )
    return f"{title}, shown beside and not ranked ({why}): {values}."


def _verdict_text(comparison: Comparison) -> str:
    if comparison.ci95 is None:
        return comparison.verdict
    low, high = comparison.ci95
    if low != high:
        return f"95% interval {low:.3f}-{high:.3f}{_test_text(comparison)}: {comparison.verdict}"
    # A point interval: identical single runs, a count, or repeats without spread.
    how = "identical values" if comparison.method == SINGLE else f"ratio {comparison.ratio:.3f}, exact"
    return f"{how}: {comparison.verdict}"


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
    if result.verdict == "undetermined":
        return [f"Loss curves: cannot judge agreement ({result.reason})."]
    details = "; ".join(
        f"{label}: RMS difference {rms:.4f} nats = {rms / result.sigma:.1f} sigma, max relative {result.max_relative[label]:.2%}"
        if result.sigma > 0
        else f"{label}: RMS difference {rms:.4f} nats"
        for label, rms in result.rms.items()
    )
    verdict = (
        "agree within noise"
        if result.verdict == "agree"
        else f"**differ by more than noise** (more than {AGREEMENT_FACTOR:g} sigma)"
    )
    line = (
        f"Loss curves {verdict} against {result.reference} at equal tokens "
        f"(sigma = {result.sigma:.4f} nats): {details}."
    )
    lines = [line]
    if "global_batch_tokens" in check.differing:
        lines.append("The global batches differ, so agreement or not says little about the strategies themselves.")
    return lines


def final_loss_line(runs: list[Run]) -> list[str]:
    parts = []
    for run in runs:
        train, val = recorded(run.total, schema.FINAL_LOSS), recorded(run.total, schema.FINAL_VAL_LOSS)
        if train is not None:
            parts.append(f"{run.label} {train:.4f}" + (f" (validation {val:.4f})" if val is not None else ""))
    return [f"Final training loss (nats): {', '.join(parts)}."] if len(parts) > 1 else []


LOSS_FIGURES = (FINAL_VAL_LOSS, AVG_LOSS)


def loss_verdict_lines(stats: Statistics) -> list[str]:
    """Each loss figure of every strategy against the first: a verdict only outside the noise between runs."""
    lines = []
    for figure in LOSS_FIGURES:
        summaries = stats.figures.get(figure, {})
        if len(summaries) < 2:
            continue
        first, *others = summaries
        values = ", ".join(f"{name} {s.median:.4f} ({_interval_text(s, '.4f')})" for name, s in summaries.items())
        verdicts = "; ".join(
            f"{name}: {_verdict_text(c)}" for name in others if (c := stats.comparison(figure, name, first)) is not None
        )
        lines.append(f"{stats.titles[figure].capitalize()} (nats): {values}. Against {first}: {verdicts}.")
    return lines


def repeats_line(stats: Statistics) -> list[str]:
    """How many runs each strategy has: the runs of one strategy are its repeats."""
    counts = {name: s.n for name, s in next(iter(stats.figures.values()), {}).items()}
    if not counts:
        return []
    shown = ", ".join(f"{name} {n}" for name, n in counts.items())
    return [
        f"Runs per strategy (repeats, grouped by strategy): {shown}. A verdict (higher, lower) is stated "
        "only where the ratio's 95% interval excludes 1, the test's p-value, Holm-adjusted over the pairs of the "
        "figure, is below 5%, and the ratio lies outside the figure's practical margin."
    ]


def target_lines(stats: Statistics) -> list[str]:
    """Time, tokens and cost to the first validation loss at or below --target_loss, per strategy, as
    Kaplan-Meier medians (runs that never reached it count as not before their last evaluation), and the
    log-rank verdict of each pair."""
    if not stats.time_to_target:
        return []
    target = next(iter(stats.time_to_target.values()))["target_loss"]
    parts = [_target_text(name, entry) for name, entry in stats.time_to_target.items()]
    lines = [
        f"Time to validation loss {target:g} (training time, linear between evaluations; Kaplan-Meier median, "
        f"a run that never reached it counted as not before its last evaluation): {'; '.join(parts)}."
    ]
    verdicts = [
        f"{c['a']} against {c['b']} in {c['figure']}: {c['verdict']}{_target_test_text(c)}"
        for c in stats.target_comparisons
    ]
    if verdicts:
        lines.append(
            f"Time to validation loss {target:g}, log-rank statistic, exact over every relabelling of the runs where "
            f"they are few, Holm-adjusted over the pairs, at 5%: {'; '.join(verdicts)}."
        )
    return lines


def _target_test_text(pair: dict[str, Any]) -> str:
    """' (p = 0.100, Holm-adjusted 0.300; 3 and 3 runs cannot reach 5%: 5 runs each would allow a verdict)'."""
    if pair["p_value"] is None:
        return " (nothing to test: no run reached it)"
    text = f" (p = {pair['p_value']:.3f}"
    if pair["p_adjusted"] != pair["p_value"]:
        text += f", Holm-adjusted {pair['p_adjusted']:.3f}"
    if pair.get("repeats_needed") is not None:
        text += (
            f"; no exact test of {pair['runs_a']} and {pair['runs_b']} runs can reach 5% (the smallest p they allow "
            f"is {pair['smallest_p']:.3f}): {pair['repeats_needed']} runs each would allow a verdict"
        )
    return text + ")"


def _target_text(name: str, entry: dict[str, Any]) -> str:
    """'ddp 12.3 s, 8,000 tokens, cost 0.0100 (reached in 2 of 3 runs; not before 20.0 s in the other)'."""
    reached = f"reached in {entry['reached']} of {entry['runs']} run{'s' if entry['runs'] != 1 else ''}"
    censored = entry.get("not_reached_before") or []
    if censored:
        reached += "; not before " + ", ".join(f"{c['seconds']:,.1f} s" for c in censored) + " in the others"
    if entry["seconds"] is None:
        return f"{name} not reached (fewer than half of its runs; {reached})"
    spread = entry["spread"]["seconds"]
    seconds = f"{entry['seconds']:,.1f} s" + (
        f" (reached min-max {spread['min']:,.1f}-{spread['max']:,.1f} s)" if spread and spread["n"] > 1 else ""
    )
    tokens = f"{entry['tokens']:,.0f} tokens" if entry["tokens"] is not None else "tokens not reached"
    cost = f", cost {entry['cost']:,.4f}" if entry["cost"] is not None else ""
    return f"{name} {seconds}, {tokens}{cost} ({reached})"


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
    statistics: Statistics | None = None  # written as report.json beside the report


def build_reading(runs: list[Run], excluded: list[Run], stats: Statistics | None = None) -> Reading:
    """The reading of the usable `runs`; `excluded` are listed with their problems only; `stats` (default:
    computed here, without a target) holds the intervals and verdicts."""
    stats = stats if stats is not None else build_statistics(runs)
    check = fairness(runs)
    fair = fairness_lines(check, runs)
    agreed = fair[:1] if check.fair else []  # the "Fair comparison" line is a reading, the rest are warnings
    warnings = fair[len(agreed) :]
    if excluded:
        warnings.append(
            f"**{len(excluded)} run(s) left out of the comparison**: "
            + ", ".join(str(run.path) for run in excluded)
            + " (see Problems)."
        )
    lines = [
        *repeats_line(stats),
        *fastest_reading(runs, stats),
        *memory_reading(runs, stats),
        *target_lines(stats),
        *agreement_lines(loss_agreement(runs), check),
        *final_loss_line(runs),
        *loss_verdict_lines(stats),
    ]
    lines += agreed
    problems = [f"{run.path}: {problem}" for run in [*runs, *excluded] for problem in run.problems]
    method = [
        "Throughput is tokens trained / training time of the optimizer steps (evaluation and checkpointing "
        "excluded); per-device figures are the whole-job figures divided by the world size, as stored.",
        (
            "Memory on CPU: the reading ranks the live-tensor peak of the probe step (summary.json "
            "memory.step_peak_bytes, max over processes), the same quantity as torch.cuda.max_memory_allocated on "
            "a GPU; the process's peak resident set size (since it started: the operating system cannot reset it "
            "per epoch) is shown beside it and ranked only outside its noise. 'device' means process; 'max over "
            "devices' is the worst process, 'mean over devices' the average one."
            if on_cpu(runs)
            else "Memory is each device's peak since its epoch started; 'max over devices' is the worst device, "
            "'mean over devices' the average device. The allocated peak is a count that repeats exactly and is "
            "ranked; the reserved peak is shown beside it and ranked only outside its noise."
        ),
        "MFU is achieved FLOP/s per device / the device's peak FLOP/s, in percent.",
        CRITERION,
        f"Fairness: the runs are compared like for like when {', '.join(FAIRNESS_FACTS.values())} agree; "
        "their MFU when they were divided by the same peak (the same figure, measured at the same time).",
        *STATISTICS_METHOD,
    ]
    return Reading(warnings, lines, problems, method)


STATISTICS_METHOD = [
    "Runs of one strategy are its repeats. Each figure of a strategy: n, median, min-max and a 95% interval: "
    "Student's t-interval of the mean logarithm over the runs (the geometric mean's, so never below zero); "
    "with one run, the throughput's interval is a moving-block bootstrap "
    "(2,000 resamples, fixed seed, blocks as long as the steps' measured autocorrelation) of the median step "
    "time after warm-up, placed around the recorded figure, "
    "and other figures have none, except the live-tensor step peak, a count that repeats exactly.",
    "Comparisons: the ratio a / b of geometric means with Welch's 95% t-interval on the log scale, and a test of "
    "no difference: exact over every relabelling of the runs where they are few (5,000 at most), otherwise a "
    f"Monte Carlo permutation test of Welch's t over {MONTE_CARLO_RESAMPLES:,} relabellings drawn from a fixed seed, Holm-adjusted over the pairs of each figure. Verdict: higher (lower) when the adjusted p is below "
    "5%, the interval lies above (below) 1 and the ratio outside the figure's practical margin (2% for times and "
    "throughput, 1% for memory, 0.5% for losses); no meaningful difference when the whole interval lies inside "
    "the margin; otherwise no detectable difference; with "
    "one run and no interval, equal values are no detectable difference and different ones not enough runs; "
    "one throughput run each gets no verdict, with the runs per strategy that would decide (Welch's interval "
    "excluding 1 in 80% of experiments at 5% run-to-run noise). The method's false-verdict rate and power are "
    "measured on synthetic runs (`python -m analysis.calibration`). Rules and sources: docs/statistics.md; "
    "every figure and comparison is in report.json.",
]


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
    stats = build_statistics(runs, target_loss, gpu_hour_price, mlperf)
    reading = build_reading(runs, excluded, stats)
    planned = measured_lines(prediction, training_seconds(runs), wall_s) if prediction else []
    return Report(
        report_title(runs),
        command,
        reading.warnings,
        [*reading.lines, *mlperf_lines(stats), *planned],
        [*reading.problems, *(notes or [])],
        build_table(runs, table_columns(runs, gpu_hour_price)),
        scaling_lines(runs, gpu_hour_price),
        plan_section(runs),
        make_figures(runs),
        [*reading.method, *SECTION_METHOD],
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


def mlperf_lines(stats: Statistics) -> list[str]:
    """MLPerf Training's summary of times: the mean of the runs after dropping the fastest and the slowest."""
    if stats.mlperf is None:
        return []
    parts = [
        f"{name} {value:,.1f} s" if value is not None else f"{name} n/a (fewer than 3 runs)"
        for name, value in stats.mlperf.get(TRAIN_TIME, {}).items()
    ]
    return [f"MLPerf-style training time (mean of the runs less the fastest and the slowest): {', '.join(parts)}."]


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

    parts = [f"<h1>{html.escape(report.title)}</h1>", f"<p>Produced by <code>{html.escape(report.command)}</code>.</p>"]
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
        parts.append(
            f'<figure><img alt="{html.escape(figure.title)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(figure.caption)}</figcaption></figure>"
        )
    parts += ["<h2>How the figures and the reading are computed</h2>", items(report.method)]
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
