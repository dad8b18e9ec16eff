"""The report's figures, rendered to PNG bytes.

Figures are built with `matplotlib.figure.Figure` and the Agg canvas directly rather than pyplot:
no global backend switch, no figure registry that leaks memory across many reports.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter, FuncFormatter, MaxNLocator

from analysis.runs import Run, number
from training import registry

# One colour and marker per strategy in every figure (each registry entry's), so a reader learns them once;
# repeats of a strategy and runs under names no entry has get spare colours and the fallback marker.
SPARE_COLOURS = ("#d62728", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
FALLBACK_MARKER = "D"
# DDP and FSDP can train bit-identical curves: drawn one over the other, the first vanished. Each
# later line is thinner and broken, so a curve underneath still shows at its edges and in the gaps.
LINE_STYLES = (("-", 2.6), ("--", 1.9), (":", 1.6), ("-.", 1.3))

DPI = 120
DODGE = 0.07  # epochs
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
    """Colour by label: a strategy's first run gets the strategy's colour, repeats get spare ones."""
    colours: dict[str, str] = {}
    spare = iter(SPARE_COLOURS * (1 + len(runs) // len(SPARE_COLOURS)))
    taken: set[str] = set()
    for run in runs:
        entry = registry.find(run.strategy)
        colour = entry.colour if entry is not None else None
        if colour is None or colour in taken:
            colour = next(c for c in spare if c not in taken)
        colours[run.label] = colour
        taken.add(colour)
    return colours


def make_figures(runs: list[Run]) -> list[FigureFile]:
    """All figures of the report, in reading order."""
    colours = assign_colours(runs)
    return [
        _epoch_figure(runs, colours, "throughput_per_epoch.png", "Throughput per epoch",
                      [("whole job", "tokens_per_s"), ("per device", "tokens_per_s_per_device")],
                      "throughput (tokens/s)",
                      "Tokens trained in the epoch / training time of the epoch (steps only)."),
        _epoch_figure(runs, colours, "grad_norm_per_epoch.png", "Gradient norm per epoch",
                      [("", "grad_norm_mean")], "mean global grad L2 norm (before clipping)",
                      "Mean over the epoch's steps of the global gradient L2 norm, before clipping."),
        _epoch_figure(runs, colours, "training_time_per_epoch.png", "Training time per epoch",
                      [("", "time_s")], "training time (s)",
                      "Wall time of the epoch's optimizer steps; evaluation and checkpointing excluded."),
        _memory_figure(runs, colours),
        _loss_per_epoch(runs, colours),
        _loss_vs_tokens(runs, colours),
        _step_time_distribution(runs, colours),
    ]


def _memory_figure(runs: list[Run], colours: dict[str, str]) -> FigureFile:
    # On CPU both memory keys hold the process's peak resident set size: one panel, named for what it is.
    if all((run.summary or {}).get("device_type") == "cpu" for run in runs):
        return _epoch_figure(runs, colours, "peak_memory_per_epoch.png", "Peak memory per epoch",
                             [("CPU: peak resident set size of the process, max over processes",
                               "peak_mem_allocated_mib_max")],
                             "peak resident memory per process (MiB)",
                             "Highest peak resident set size over the processes of one run. On CPU the "
                             "operating system cannot reset the peak, so each epoch shows the peak since "
                             "the process started.")
    return _epoch_figure(runs, colours, "peak_memory_per_epoch.png", "Peak memory per epoch",
                         [("allocated, max over devices", "peak_mem_allocated_mib_max"),
                          ("reserved, max over devices", "peak_mem_reserved_mib_max")],
                         "peak memory per device (MiB)",
                         "Highest peak over the devices of one run (torch.cuda max allocated / max reserved, "
                         "reset at each epoch start).")


def _new_figure(panels: int) -> tuple[Figure, list[Axes]]:
    figure = Figure(figsize=(6.4 * panels if panels > 1 else 7.2, 4.6), dpi=DPI, layout="constrained")
    axes = figure.subplots(1, panels, squeeze=False)[0]
    return figure, list(axes)


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    FigureCanvasAgg(figure)
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _epoch_series(run: Run, key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for epoch in run.epochs:
        value = number(epoch.get(key))
        if value is not None and isinstance(epoch.get("epoch"), int):
            xs.append(epoch["epoch"])
            ys.append(value)
    return xs, ys


def _dodge(runs: list[Run], run: Run, xs: list[int]) -> list[float]:
    """Shift each run's markers a little sideways so equal values (DDP = single) do not hide each other."""
    offset = DODGE * (runs.index(run) - (len(runs) - 1) / 2)
    return [x + offset for x in xs]


def _style(run: Run, colours: dict[str, str]) -> dict[str, Any]:
    entry = registry.find(run.strategy)
    return {"color": colours[run.label], "marker": entry.marker if entry is not None else FALLBACK_MARKER,
            "markersize": 7}


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


def _epoch_figure(runs: list[Run], colours: dict[str, str], filename: str, title: str,
                  panels: list[tuple[str, str]], ylabel: str, caption: str) -> FigureFile:
    figure, axes_list = _new_figure(len(panels))
    for axes, (panel_title, key) in zip(axes_list, panels):
        for run in runs:
            xs, ys = _epoch_series(run, key)
            if xs:
                axes.plot(_dodge(runs, run, xs), ys, label=run.label, **_style(run, colours))
        _epoch_axis(axes, runs)
        axes.set_ylabel(ylabel)
        # Costs start at zero so that a bar-sized difference looks bar-sized; a grad norm need not.
        if key != "grad_norm_mean":
            axes.set_ylim(bottom=0)
            axes.yaxis.set_major_formatter(THOUSANDS)
        if panel_title:
            axes.set_title(panel_title)
    _legend(figure, axes_list[0])
    figure.suptitle(title)
    return FigureFile(filename, title, caption, _png(figure))


def _loss_per_epoch(runs: list[Run], colours: dict[str, str]) -> FigureFile:
    figure, (axes,) = _new_figure(1)
    for run in runs:
        xs, ys = _epoch_series(run, "loss_mean")
        if xs:
            axes.plot(_dodge(runs, run, xs), ys, label=f"{run.label} train", **_style(run, colours))
        xs, ys = _epoch_series(run, "val_loss")
        if xs:
            axes.plot(_dodge(runs, run, xs), ys, label=f"{run.label} validation", linestyle="--",
                      markerfacecolor="white", **_style(run, colours))
    _epoch_axis(axes, runs)
    axes.set_ylabel("cross-entropy loss (nats)")
    _legend(figure, axes)
    title = "Loss per epoch"
    figure.suptitle(title)
    caption = "Solid: mean training loss of the epoch's steps. Dashed, open markers: validation loss at the epoch end."
    return FigureFile("loss_per_epoch.png", title, caption, _png(figure))


def _loss_vs_tokens(runs: list[Run], colours: dict[str, str]) -> FigureFile:
    figure, (axes,) = _new_figure(1)
    for run in runs:
        points = [(line["tokens"], line["loss"]) for line in run.train if _has_numbers(line, "tokens", "loss")]
        if points:
            xs, ys = zip(*points)
            linestyle, linewidth = LINE_STYLES[runs.index(run) % len(LINE_STYLES)]
            axes.plot(xs, ys, color=colours[run.label], linestyle=linestyle, linewidth=linewidth,
                      label=f"{run.label} train")
        points = [(line["tokens"], line["val_loss"]) for line in run.evals if _has_numbers(line, "tokens", "val_loss")]
        if points:
            xs, ys = zip(*points)
            axes.plot(xs, ys, linestyle="none", markerfacecolor="white", markeredgewidth=1.5,
                      label=f"{run.label} validation", **_style(run, colours))
    axes.xaxis.set_major_formatter(EngFormatter(sep=""))
    axes.set_xlabel("tokens trained (whole job)")
    axes.set_ylabel("cross-entropy loss (nats)")
    axes.grid(True, alpha=0.3)
    _legend(figure, axes)
    title = "Loss against tokens trained"
    figure.suptitle(title)
    caption = ("Lines: training loss of each logged step (metrics.jsonl); open markers: validation loss. "
               "Tokens, not steps or epochs, are the fair x-axis when batches differ. A line seen only at its "
               "edges lies under another: the two curves are the same.")
    return FigureFile("loss_vs_tokens.png", title, caption, _png(figure))


def _step_time_distribution(runs: list[Run], colours: dict[str, str]) -> FigureFile:
    figure, (axes,) = _new_figure(1)
    with_times = [run for run in runs if run.step_times_s]
    if with_times:
        boxes = axes.boxplot([run.step_times_s for run in with_times], patch_artist=True, widths=0.5,
                             medianprops={"color": "black"}, flierprops={"markersize": 4})
        for patch, run in zip(boxes["boxes"], with_times):
            patch.set_facecolor(colours[run.label])
            patch.set_alpha(0.75)
        axes.set_xticks(range(1, len(with_times) + 1), [run.label for run in with_times])
    axes.set_xlabel("strategy")
    axes.set_ylabel("optimizer step time (s)")
    axes.grid(True, axis="y", alpha=0.3)
    title = "Step time distribution"
    figure.suptitle(title)
    caption = ("Wall time of every optimizer step (summary.json step_times_s), warm-up steps included: "
               "box = quartiles, line = median, whiskers = 1.5 IQR, dots = outliers.")
    return FigureFile("step_time_distribution.png", title, caption, _png(figure))


def _has_numbers(line: dict[str, Any], *keys: str) -> bool:
    return all(number(line.get(k)) is not None for k in keys)

