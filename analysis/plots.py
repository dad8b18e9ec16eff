"""The report's figures, rendered to PNG bytes.

Figures are built with `matplotlib.figure.Figure` and the Agg canvas directly rather than pyplot:
no global backend switch, no figure registry that leaks memory across many reports.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter, FuncFormatter, MaxNLocator

from analysis.runs import Run, recorded
from analysis.uncertainty import group_by_strategy, warmup_steps
from training.distributed import registry
from training.records import schema as schema

# One colour and marker per strategy in every figure (each registry entry's), so a reader learns them once;
# strategies no entry has get spare colours and the fallback marker. The runs of one strategy are its
# repeats: one line (their median) with a band or error bars from their minimum to their maximum.
SPARE_COLOURS = ("#d62728", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
FALLBACK_MARKER = "D"
# DDP and FSDP can train bit-identical curves: drawn one over the other, the first vanished. Each
# later line is thinner and broken, so a curve underneath still shows at its edges and in the gaps; points
# stay at their true x (no sideways offset, which made equal curves look as if one lagged).
LINE_STYLES = (("-", 2.6), ("--", 1.9), (":", 1.6), ("-.", 1.3))
MARKER_SIZES = (9, 7, 5.5, 4)  # later strategies' markers smaller, so equal points show as rings
BAND_ALPHA = 0.18
PARTIAL_NOTE = "A ring around a point: a partial epoch (the step budget ended inside it)."

DPI = 120
MAX_EPOCH_TICKS = 12  # up to this many epochs every one gets a tick
# 72,000 rather than 72000, yet 2.5 stays 2.5: a fixed "{x:,.0f}" turned 2.5 s ticks into "2".
THOUSANDS = FuncFormatter(lambda x, _: f"{x:,.0f}" if abs(x) >= 1000 else f"{x:g}")


@dataclass(frozen=True)
class FigureFile:
    """A rendered figure: file name in the report folder, title, caption and the PNG itself."""

    filename: str
    title: str
    caption: str
    png: bytes


def assign_colours(runs: list[Run]) -> dict[str, str]:
    """Colour by strategy: the registry entry's, or a spare one for a strategy no entry has."""
    colours: dict[str, str] = {}
    spare = iter(SPARE_COLOURS * (1 + len(runs) // len(SPARE_COLOURS)))
    for strategy in group_by_strategy(runs):
        entry = registry.find(strategy)
        colour = entry.colour if entry is not None else None
        if colour is None or colour in colours.values():
            colour = next(c for c in spare if c not in colours.values())
        colours[strategy] = colour
    return colours


def make_figures(runs: list[Run]) -> list[FigureFile]:
    """All figures of the report, in reading order."""
    colours = assign_colours(runs)
    return [
        _epoch_figure(
            runs,
            colours,
            "throughput_per_epoch.png",
            "Throughput per epoch",
            [("whole job", schema.EPOCH_THROUGHPUT), ("per device", schema.EPOCH_THROUGHPUT_PER_DEVICE)],
            "throughput (tokens/s)",
            "Tokens trained in the epoch / training time of the epoch (steps only).",
        ),
        _epoch_figure(
            runs,
            colours,
            "grad_norm_per_epoch.png",
            "Gradient norm per epoch",
            [("", schema.EPOCH_GRAD_NORM)],
            "mean global grad L2 norm (before clipping)",
            "Mean over the epoch's steps of the global gradient L2 norm, before clipping.",
        ),
        _epoch_figure(
            runs,
            colours,
            "training_time_per_epoch.png",
            "Training time per epoch",
            [("", schema.EPOCH_TIME)],
            "training time (s)",
            "Wall time of the epoch's optimizer steps; evaluation and checkpointing excluded.",
        ),
        _memory_figure(runs, colours),
        _loss_per_epoch(runs, colours),
        _loss_vs_tokens(runs, colours),
        _step_time_distribution(runs, colours),
    ]


def _memory_figure(runs: list[Run], colours: dict[str, str]) -> FigureFile:
    # On CPU both memory keys hold the process's peak resident set size: one panel, named for what it is.
    if all((run.summary or {}).get("device_type") == "cpu" for run in runs):
        return _epoch_figure(
            runs,
            colours,
            "peak_memory_per_epoch.png",
            "Peak memory per epoch",
            [("CPU: peak resident set size of the process, max over processes", schema.EPOCH_PEAK_ALLOCATED)],
            "peak resident memory per process (MiB)",
            "Highest peak resident set size over the processes of one run. On CPU the "
            "operating system cannot reset the peak, so each epoch shows the peak since "
            "the process started.",
        )
    return _epoch_figure(
        runs,
        colours,
        "peak_memory_per_epoch.png",
        "Peak memory per epoch",
        [
            ("allocated, max over devices", schema.EPOCH_PEAK_ALLOCATED),
            ("reserved, max over devices", schema.EPOCH_PEAK_RESERVED),
        ],
        "peak memory per device (MiB)",
        "Highest peak over the devices of one run (torch.cuda max allocated / max reserved, "
        "reset at each epoch start).",
    )


def _new_figure(panels: int) -> tuple[Figure, list[Axes]]:
    figure = Figure(figsize=(6.4 * panels if panels > 1 else 7.2, 4.6), dpi=DPI, layout="constrained")
    axes = figure.subplots(1, panels, squeeze=False)[0]
    return figure, list(axes)


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    FigureCanvasAgg(figure)
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _style(strategy: str, index: int, colours: dict[str, str]) -> dict[str, Any]:
    """The strategy's colour and marker; its line style and marker size by its place in the figure."""
    entry = registry.find(strategy)
    linestyle, linewidth = LINE_STYLES[index % len(LINE_STYLES)]
    return {
        "color": colours[strategy],
        "marker": entry.marker if entry is not None else FALLBACK_MARKER,
        "markersize": MARKER_SIZES[index % len(MARKER_SIZES)],
        "linestyle": linestyle,
        "linewidth": linewidth,
    }


@dataclass(frozen=True)
class Series:
    """One strategy's figure per epoch over its runs: median, min and max, and which epochs were partial."""

    epochs: list[int]
    median: list[float]
    low: list[float]
    high: list[float]
    partial: list[bool]
    runs: int


def _epoch_values(run: Run, metric: schema.Metric) -> dict[int, tuple[float, bool]]:
    out = {}
    for epoch in run.epochs:
        value = recorded(epoch, metric)
        if value is not None and isinstance(epoch.epoch, int):
            out[epoch.epoch] = (value, epoch.partial is True)
    return out


def epoch_series(runs: list[Run], metric: schema.Metric) -> Series:
    """Median, min and max over `runs` at each epoch any of them recorded; partial if any run's was."""
    per_run = [_epoch_values(run, metric) for run in runs]
    epochs = sorted({e for values in per_run for e in values})
    at = [[values[e] for values in per_run if e in values] for e in epochs]
    return Series(
        epochs,
        [float(np.median([v for v, _ in points])) for points in at],
        [min(v for v, _ in points) for points in at],
        [max(v for v, _ in points) for points in at],
        [any(p for _, p in points) for points in at],
        len(runs),
    )


def _plot_series(axes: Axes, series: Series, label: str, style: dict[str, Any], **extra: Any) -> None:
    """The median line; error bars from min to max when there are repeats; partial epochs hollow."""
    if not series.epochs:
        return
    axes.plot(
        series.epochs,
        series.median,
        label=label + (f" (median of {series.runs})" if series.runs > 1 else ""),
        **{**style, **extra},
    )
    if series.runs > 1:
        errors = [
            [m - lo for m, lo in zip(series.median, series.low)],
            [hi - m for m, hi in zip(series.median, series.high)],
        ]
        axes.errorbar(
            series.epochs, series.median, yerr=errors, fmt="none", ecolor=style["color"], capsize=4, elinewidth=1.2
        )
    partial = [(e, m) for e, m, p in zip(series.epochs, series.median, series.partial) if p]
    if partial:
        xs, ys = zip(*partial)
        axes.plot(
            xs,
            ys,
            linestyle="none",
            marker=style["marker"],
            markersize=style["markersize"] + 3,
            markerfacecolor="white",
            markeredgecolor=style["color"],
            markeredgewidth=1.8,
        )


def _epoch_axis(axes: Axes, runs: list[Run]) -> None:
    # Whole epochs only, and half an epoch of room each side, so one-epoch runs still read as points.
    last = max(max((len(run.epochs) for run in runs), default=1), 1)
    if last <= MAX_EPOCH_TICKS:
        axes.set_xticks(range(1, last + 1))
    else:
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlim(0.5, last + 0.5)
    axes.set_xlabel("epoch")
    axes.grid(True, alpha=0.3)


def _legend(figure: Figure, axes: Axes) -> None:
    # One legend per figure, outside the axes: inside, it covered the highest line's last marker.
    handles, labels = axes.get_legend_handles_labels()
    if handles:
        figure.legend(handles, labels, title="strategy", loc="outside right upper")


def _epoch_figure(
    runs: list[Run],
    colours: dict[str, str],
    filename: str,
    title: str,
    panels: list[tuple[str, schema.Metric]],
    ylabel: str,
    caption: str,
) -> FigureFile:
    figure, axes_list = _new_figure(len(panels))
    groups = group_by_strategy(runs)
    for axes, (panel_title, metric) in zip(axes_list, panels):
        for index, (strategy, members) in enumerate(groups.items()):
            _plot_series(axes, epoch_series(members, metric), strategy, _style(strategy, index, colours))
        _epoch_axis(axes, runs)
        axes.set_ylabel(ylabel)
        # Costs and rates (a better direction) start at zero so that a bar-sized difference looks
        # bar-sized; a grad norm (none) need not.
        if metric.better is not None:
            axes.set_ylim(bottom=0)
            axes.yaxis.set_major_formatter(THOUSANDS)
        if panel_title:
            axes.set_title(panel_title)
    _legend(figure, axes_list[0])
    figure.suptitle(title)
    return FigureFile(filename, title, f"{caption} {_repeats_caption(groups)}", _png(figure))


def _repeats_caption(groups: dict[str, list[Run]]) -> str:
    """What a line and its bars are, and the partial-epoch mark."""
    spread = (
        "Lines: the median over a strategy's runs; error bars: their minimum to maximum. "
        if any(len(members) > 1 for members in groups.values())
        else ""
    )
    return spread + PARTIAL_NOTE


def _loss_per_epoch(runs: list[Run], colours: dict[str, str]) -> FigureFile:
    figure, (axes,) = _new_figure(1)
    groups = group_by_strategy(runs)
    for index, (strategy, members) in enumerate(groups.items()):
        style = _style(strategy, index, colours)
        _plot_series(axes, epoch_series(members, schema.EPOCH_LOSS), f"{strategy} train", style)
        _plot_series(
            axes,
            epoch_series(members, schema.EPOCH_VAL_LOSS),
            f"{strategy} validation",
            style,
            linestyle="--",
            markerfacecolor="white",
        )
    _epoch_axis(axes, runs)
    axes.set_ylabel("cross-entropy loss (nats)")
    _legend(figure, axes)
    title = "Loss per epoch"
    figure.suptitle(title)
    caption = (
        "Filled markers: mean training loss of the epoch's steps. Dashed, open markers: validation loss at "
        f"the epoch end. {_repeats_caption(groups)}"
    )
    return FigureFile("loss_per_epoch.png", title, caption, _png(figure))


def loss_band(runs: list[Run], metric: schema.Metric) -> tuple[list[float], list[float], list[float], list[float]]:
    """Tokens, median, min and max of a train or eval line `metric` over `runs` at the token counts every run
    logged; a resumed run's repeated step keeps its later line."""
    per_run = [
        {
            tokens: value
            for line in (run.train if schema.Scope.TRAIN in metric.scopes else run.evals)
            if (tokens := recorded(line, schema.LINE_TOKENS)) is not None
            and (value := recorded(line, metric)) is not None
        }
        for run in runs
    ]
    common = sorted(set.intersection(*(set(values) for values in per_run))) if per_run else []
    values = [[float(v[t]) for v in per_run] for t in common]
    return (
        [float(t) for t in common],
        [float(np.median(v)) for v in values],
        [min(v) for v in values],
        [max(v) for v in values],
    )


def _loss_vs_tokens(runs: list[Run], colours: dict[str, str]) -> FigureFile:
    figure, (axes,) = _new_figure(1)
    groups = group_by_strategy(runs)
    for index, (strategy, members) in enumerate(groups.items()):
        style = _style(strategy, index, colours)
        tokens, median, low, high = loss_band(members, schema.LINE_LOSS)
        if tokens:
            axes.plot(
                tokens,
                median,
                color=style["color"],
                linestyle=style["linestyle"],
                linewidth=style["linewidth"],
                label=f"{strategy} train",
            )
            if len(members) > 1:
                axes.fill_between(tokens, low, high, color=style["color"], alpha=BAND_ALPHA, linewidth=0)
        tokens, median, low, high = loss_band(members, schema.VAL_LOSS)
        if tokens:
            axes.errorbar(
                tokens,
                median,
                yerr=[np.subtract(median, low), np.subtract(high, median)],
                linestyle="none",
                color=style["color"],
                marker=style["marker"],
                markersize=style["markersize"],
                markerfacecolor="white",
                markeredgewidth=1.5,
                capsize=3,
                label=f"{strategy} validation",
            )
    axes.xaxis.set_major_formatter(EngFormatter(sep=""))
    axes.set_xlabel("tokens trained (whole job)")
    axes.set_ylabel("cross-entropy loss (nats)")
    axes.grid(True, alpha=0.3)
    _legend(figure, axes)
    title = "Loss against tokens trained"
    figure.suptitle(title)
    spread = (
        "With repeats: lines are the median over a strategy's runs, bands and bars their minimum to maximum. "
        if any(len(m) > 1 for m in groups.values())
        else ""
    )
    caption = (
        "Lines: training loss of each logged step (metrics.jsonl); open markers: validation loss. "
        "Tokens, not steps or epochs, are the fair x-axis when batches differ. A line seen only at its "
        f"edges lies under another: the two curves are the same. {spread}"
    ).strip()
    return FigureFile("loss_vs_tokens.png", title, caption, _png(figure))


def _step_time_distribution(runs: list[Run], colours: dict[str, str]) -> FigureFile:
    figure, (axes,) = _new_figure(1)
    groups = group_by_strategy(runs)
    # Warm-up steps left out, as the throughput's interval leaves them out; a strategy's runs pooled.
    pooled = {
        strategy: [t for run in members for t in run.step_times_s[warmup_steps(run) :]]
        for strategy, members in groups.items()
    }
    pooled = {strategy: times for strategy, times in pooled.items() if times}
    if pooled:
        boxes = axes.boxplot(
            list(pooled.values()),
            patch_artist=True,
            widths=0.5,
            medianprops={"color": "black"},
            flierprops={"markersize": 4},
        )
        for patch, strategy in zip(boxes["boxes"], pooled):
            patch.set_facecolor(colours[strategy])
            patch.set_alpha(0.75)
        axes.set_xticks(
            range(1, len(pooled) + 1), [f"{s} ({len(groups[s])} runs)" if len(groups[s]) > 1 else s for s in pooled]
        )
    axes.set_xlabel("strategy")
    axes.set_ylabel("optimizer step time (s)")
    axes.grid(True, axis="y", alpha=0.3)
    title = "Step time distribution"
    figure.suptitle(title)
    caption = (
        "Wall time of every optimizer step after the warm-up steps (summary.json step_times_s), all runs of "
        "a strategy together: box = quartiles, line = median, whiskers = 1.5 IQR, dots = outliers."
    )
    return FigureFile("step_time_distribution.png", title, caption, _png(figure))
