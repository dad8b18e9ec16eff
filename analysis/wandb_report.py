"""Build the W&B Report of one experiment: `python -m analysis.wandb_report --experiment GROUP`.

The report is specified as plain data first (`build_spec`): one runset (the experiment's W&B group,
grouped by arm: the strategy, or ddp#2 in an A/A experiment), line plots against tokens trained, bar
charts of the whole-run figures, and the local report's reading. `--dry_run` writes that specification as JSON and needs neither network nor
login; otherwise `to_wandb_report` turns it into wandb-workspaces objects and `save_report` sends it.

Panels are declared in the run schema (training/records/schema.py) by the metrics they plot and are
resolved through the names train.py logs to W&B (training/records/sinks.py), so a renamed metric fails here
instead of leaving a panel empty. Exit status: 0 when the report was saved (or written with
--dry_run); 2 on bad arguments, without a W&B login, or when W&B could not be asked.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from analysis.compare import load_comparison, target_loss
from analysis.report import Reading, build_reading, write_atomic
from analysis.table import to_markdown
from analysis.uncertainty import build_statistics
from training.cli import DefaultsHelpFormatter, OneLineParser, run_main
from training.config import RunConfig
from training.records.schema import BARS, CURVES, X_AXIS, X_TITLE
from training.records.sinks import WANDB_KEYS, wandb_logged_in, wandb_summary_key

EXIT_OK, EXIT_ERROR = 0, 2
PROG = "python -m analysis.wandb_report"
# wandb-workspaces writes the filter as a Python-like expression and parses it back: a quote or a
# backslash in the group name breaks that parse (checked with wandb-workspaces 0.4.13).
UNSAFE_GROUP_CHARACTERS = "'\"\\"
MAX_TITLE = 128  # the W&B report title limit enforced by wandb-workspaces
GRID_COLUMNS = 24  # W&B panel grids are 24 units wide


class ReportError(RuntimeError):
    """The report cannot be built or saved; the message is one line for the user."""


# ---------------------------------------------------------------------------------------------
# The panels: declared in the run schema (training/records/schema.py), laid out here


def wandb_metric(key: str) -> str:
    """The W&B history key train.py logs a metrics.jsonl key under."""
    try:
        return WANDB_KEYS[key]
    except KeyError:
        raise ReportError(
            f"panel metric {key!r} is not logged to W&B (not in training.records.sinks.WANDB_KEYS)"
        ) from None


# ---------------------------------------------------------------------------------------------
# The specification: plain data, written as JSON by --dry_run


@dataclass(frozen=True)
class PanelSpec:
    kind: str  # "line" (history against x) or "bar" (run summary values)
    title: str
    metrics: tuple[str, ...]  # W&B keys
    y_title: str
    x: str | None = None  # W&B key of the x-axis; line plots only
    x_title: str | None = None
    layout: tuple[int, int, int, int] = (0, 0, 8, 6)  # x, y, width, height in grid units
    # How a group of runs (one strategy's repeats) is drawn: W&B aggregates them natively, here as their
    # mean with a band (line plots) or range (bar charts) from their minimum to their maximum.
    group_agg: str = "mean"
    group_range: str = "minmax"


@dataclass(frozen=True)
class RunsetSpec:
    entity: str | None  # None: not known yet (dry run without --entity); the login's default entity
    project: str
    name: str
    filters: tuple[dict[str, str], ...]  # {"key", "op", "value"}: W&B run attributes
    group_by: tuple[str, ...]  # W&B run attributes


@dataclass(frozen=True)
class MarkdownSpec:
    text: str
    type: str = "markdown"


@dataclass(frozen=True)
class PanelGridSpec:
    panels: tuple[PanelSpec, ...]
    type: str = "panel_grid"


@dataclass(frozen=True)
class ReportSpec:
    entity: str | None
    project: str
    title: str
    description: str
    runset: RunsetSpec  # every panel grid shows this one runset
    blocks: tuple[MarkdownSpec | PanelGridSpec, ...] = field(default_factory=tuple)


def runset_spec(entity: str | None, project: str, group: str) -> RunsetSpec:
    # train.py sets the W&B group to --experiment and the job type to the run's arm (--arm, else the strategy
    # in effect): an A/A experiment's two arms of one strategy stay two groups.
    return RunsetSpec(
        entity, project, f"experiment {group}", ({"key": "Group", "op": "=", "value": group},), ("JobType",)
    )


def line_panels() -> tuple[PanelSpec, ...]:
    """Two per row, each half the grid wide."""
    width, height = GRID_COLUMNS // 2, 8
    return tuple(
        PanelSpec(
            "line",
            curve.title,
            tuple(wandb_metric(m.key) for m in curve.metrics),
            curve.y_title,
            x=wandb_metric(X_AXIS.key),
            x_title=X_TITLE,
            layout=((i % 2) * width, (i // 2) * height, width, height),
        )
        for i, curve in enumerate(CURVES)
    )


def bar_panels() -> tuple[PanelSpec, ...]:
    """Three per row, each a third of the grid wide."""
    width, height = GRID_COLUMNS // 3, 8
    return tuple(
        PanelSpec(
            "bar",
            bars.title,
            tuple(wandb_summary_key(m.key) for m in bars.metrics),
            bars.y_title,
            layout=((i % 3) * width, (i // 3) * height, width, height),
        )
        for i, bars in enumerate(BARS)
    )


def reading_markdown(reading: Reading | None, source: str) -> str:
    """The local report's reading, as markdown; `source` says which runs it was computed from."""
    out = ["## Answer", ""]
    if reading is None:
        return "\n".join(
            [
                *out,
                "Not computed in this specification: the reading is filled in from the runs when "
                f"the report is built online (`{PROG}` without `--dry_run`), or from local run "
                "directories given with `--runs`.",
            ]
        )
    out += [f"> {line}" for line in reading.warnings] + ([""] if reading.warnings else [])
    out += [f"- {line}" for line in reading.answer]
    out += ["", to_markdown(reading.table), "## Notes", "", *(f"- {line}" for line in reading.notes)]
    out += ["", "### Problems", "", *(f"- {line}" for line in reading.problems)] if reading.problems else []
    out += [
        "",
        f"Computed from {source} by the local report's code (analysis/report.py), so it reads the same as "
        "`report.md` of `python -m analysis.compare`.",
    ]
    return "\n".join(out)


def method_markdown(reading: Reading | None, command: str) -> str:
    out = [
        "## How the panels are built",
        "",
        "- Runs: the experiment's W&B group, grouped by arm (the run's job type: the strategy, or its "
        "label such as ddp#2 when an A/A experiment runs one strategy twice), so repeated runs of one arm form "
        "one group. W&B draws a group natively: line plots show the strategy's mean with a "
        "band from its runs' minimum to their maximum, bar charts its mean with that range. The band is the "
        "runs' range, not a 95% interval, and the mean is not the local report's geometric mean: the "
        "statuses (established, equivalent, not established) are the answer's above (docs/statistics.md).",
        f"- Line plots use {X_TITLE} as x-axis, so runs with different global batches line up at equal data "
        "seen. Memory is the peak per device since the epoch started, the maximum over the run's devices.",
        "- Bar charts show the whole-run figures train.py writes to the run summary (`total/...`, as in "
        "summary.json): training time counts optimizer steps only; throughput and MFU leave out the first "
        "`--perf_warmup_steps` steps; MFU is a fraction here (the local table shows percent).",
    ]
    out += [f"- {line}" for line in (reading.method if reading else [])]
    out += ["", f"Produced by `{command}`."]
    return "\n".join(out)


def build_spec(
    group: str,
    project: str,
    entity: str | None,
    title: str | None,
    command: str,
    reading: Reading | None,
    reading_source: str,
) -> ReportSpec:
    """The whole report as plain data; nothing here needs W&B."""
    runset = runset_spec(entity, project, group)
    blocks = (
        MarkdownSpec(reading_markdown(reading, reading_source)),
        MarkdownSpec("## Curves against tokens trained"),
        PanelGridSpec(line_panels()),
        MarkdownSpec("## Whole-run figures"),
        PanelGridSpec(bar_panels()),
        MarkdownSpec(method_markdown(reading, command)),
    )
    return ReportSpec(
        entity,
        project,
        title or f"Strategy comparison: {group}",
        f"The strategies of experiment {group} side by side (W&B group {group}, project {project}).",
        runset,
        blocks,
    )


def spec_json(spec: ReportSpec) -> str:
    return json.dumps(asdict(spec), indent=2) + "\n"


# ---------------------------------------------------------------------------------------------
# wandb-workspaces objects (constructing them needs no network) and saving (the only live step)


def to_wandb_report(spec: ReportSpec) -> Any:
    """The specification as a `wandb_workspaces.reports.v2.Report`, not yet saved."""
    import wandb_workspaces.reports.v2 as wr  # imported here: only this step needs it

    blocks = [
        wr.MarkdownBlock(text=block.text)
        if isinstance(block, MarkdownSpec)
        else wr.PanelGrid(runsets=[_runset(spec.runset)], panels=[_panel(p) for p in block.panels])
        for block in spec.blocks
    ]
    # An explicit entity, even empty: the library's default asks the W&B server for the login's entity.
    return wr.Report(
        entity=spec.entity or "",
        project=spec.project,
        title=spec.title,
        description=spec.description,
        blocks=blocks,
        width="fluid",
    )


def _runset(runset: RunsetSpec) -> Any:
    import wandb_workspaces.reports.v2 as wr
    from wandb_workspaces import expr

    filters = []
    for item in runset.filters:
        if item["op"] != "=":
            raise ReportError(f"runset filter operator {item['op']!r} is not supported")
        filters.append(expr.Metric(item["key"]) == item["value"])
    return wr.Runset(
        entity=runset.entity or "",
        project=runset.project,
        name=runset.name,
        filters=filters,
        groupby=list(runset.group_by),
    )


def _panel(panel: PanelSpec) -> Any:
    import wandb_workspaces.reports.v2 as wr

    layout = wr.Layout(*panel.layout)
    if panel.kind == "line":
        return wr.LinePlot(
            title=panel.title,
            x=panel.x,
            y=list(panel.metrics),
            title_x=panel.x_title,
            title_y=panel.y_title,
            layout=layout,
            groupby_aggfunc=panel.group_agg,
            groupby_rangefunc=panel.group_range,
        )
    if panel.kind == "bar":
        return wr.BarPlot(
            title=panel.title,
            metrics=list(panel.metrics),
            orientation="v",
            title_y=panel.y_title,
            layout=layout,
            groupby_aggfunc=panel.group_agg,
            groupby_rangefunc=panel.group_range,
        )
    raise ReportError(f"unknown panel kind {panel.kind!r}")


def save_report(report: Any) -> str:
    """Send the report to W&B; its URL. Raises ReportError with W&B's reason in one line."""
    try:
        report.save()
        return str(report.url)
    except Exception as err:  # noqa: BLE001 - network, permissions, unknown project: all "cannot save"
        where = f"{report.entity}/{report.project}"
        raise ReportError(f"cannot save the W&B report to {where}: {_first_line(err)}") from err


def report_entity(flag: str | None, run_dirs: Sequence[Path]) -> str | None:
    """The entity the report goes to, short of asking W&B: --entity, else the entity the runs were logged
    to (their config.json's run.wandb_entity), else WANDB_ENTITY; None leaves it to the login's default.

    The typed flag wins because it is the one choice made for this command; the runs' own entity comes
    next so that a team's runs get a team report even when the login's default entity is personal.
    """
    if flag:
        return flag
    recorded = wandb_target(run_dirs).entity if run_dirs else None
    return recorded or os.environ.get("WANDB_ENTITY") or None


def default_entity() -> str:
    """The logged-in user's default W&B entity (asks the server)."""
    import wandb

    try:
        entity = wandb.Api().default_entity
    except Exception as err:  # noqa: BLE001
        raise ReportError(f"cannot ask W&B for your default entity ({_first_line(err)}); pass --entity") from err
    if not entity:
        raise ReportError("W&B reports no default entity for this login; pass --entity")
    return str(entity)


def _first_line(err: BaseException) -> str:
    line = (str(err).strip().splitlines() or [type(err).__name__])[0]
    # wandb-core passes the server's GraphQL error on as "input: <message>" (the Go GraphQL client's
    # format); the server's message is what the user needs.
    return line.removeprefix("input: ") or line


# ---------------------------------------------------------------------------------------------
# The reading: from local run directories, or from the group's runs fetched from W&B


def reading_of(run_dirs: Sequence[Path], group: str, target: float | None = None) -> Reading:
    """The local report's reading of `run_dirs`, which must all belong to `group`; with a `target` validation
    loss, also the time and tokens to it and the verdicts on them."""
    usable, excluded = load_comparison(list(run_dirs))
    if not usable:
        raise ReportError(f"none of the {len(excluded)} run directories has a usable summary.json")
    foreign = [run for run in usable if run.fact("experiment") not in (None, group)]
    if foreign:
        run = foreign[0]
        raise ReportError(f"{run.path} belongs to experiment {run.fact('experiment')!r}, not {group!r}")
    return build_reading(usable, excluded, build_statistics(usable, target))


def fetched_reading(entity: str, project: str, group: str, target: float | None = None) -> Reading:
    from analysis.wandb_fetch import FetchError, fetch_wandb_runs  # the W&B client is only needed online

    with tempfile.TemporaryDirectory(prefix="wandb_report_") as folder:
        try:
            paths = fetch_wandb_runs(f"{entity}/{project}", group, Path(folder))
        except FetchError as err:
            raise ReportError(str(err)) from err
        return reading_of(paths, group, target)


# ---------------------------------------------------------------------------------------------
# At the end of analysis.experiment --wandb_report


@dataclass(frozen=True)
class WandbTarget:
    """Where the runs of an experiment were logged, as their config.json records it."""

    project: str
    entity: str | None
    modes: frozenset[str]  # the W&B modes in effect ("online", "offline", "disabled"); empty if unrecorded


def wandb_target(run_dirs: Sequence[Path]) -> WandbTarget:
    project, entity, modes = default_project(), None, set()
    for run_dir in run_dirs:
        try:
            config = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        run_config, launch = config.get("run") or {}, config.get("launch") or {}
        project = run_config.get("wandb_project") or project
        entity = run_config.get("wandb_entity") or entity
        if launch.get("wandb_mode"):
            modes.add(str(launch["wandb_mode"]))
    return WandbTarget(project, entity, frozenset(modes))


def later_command(
    group: str, target: WandbTarget, run_dirs: Sequence[Path], login: bool, loss: float | None = None
) -> str:
    """How to build the report by hand: log in, upload offline runs, then this module on the run directories."""
    steps = ["wandb login"] if login else []
    if "online" not in target.modes or "offline" in target.modes:
        # The pattern stays unquoted so the shell expands it; the directory part is quoted.
        steps.append("wandb sync " + " ".join(f"{shlex.quote(str(d))}/wandb/offline-run-*" for d in run_dirs))
    build = [*PROG.split(), "--experiment", group, "--project", target.project]
    build += ["--entity", target.entity] if target.entity else []
    build += ["--target_loss", f"{loss:g}"] if loss is not None else []
    steps.append(shlex.join([*build, "--runs", *map(str, run_dirs)]))
    return " && ".join(steps)


def report_after_experiment(group: str, run_dirs: Sequence[Path], loss: float | None = None) -> bool:
    """Build the experiment's W&B report from its run directories when its runs are on W&B (with the time
    to the validation `loss`, when given); otherwise print in one line how to build it later. True when the
    report was built."""
    run_dirs = [d for d in run_dirs if (d / "summary.json").is_file()]
    if not run_dirs:
        print("W&B report not built: no strategy finished with a summary.json", file=sys.stderr)
        return False
    problem = group_problem(group)
    if problem:
        print(f"W&B report not built: {problem}", file=sys.stderr)
        return False
    target = wandb_target(run_dirs)
    if target.modes == {"disabled"}:
        print("W&B report not built: the runs were not logged to W&B (--wandb_mode disabled)", file=sys.stderr)
        return False
    logged_in = wandb_logged_in()
    later = later_command(group, target, run_dirs, not logged_in, loss)
    if not logged_in or target.modes - {"online"}:
        why = "not logged in to W&B" if not logged_in else "not every run was logged online"
        print(f"W&B report not built ({why}); build it later with: {later}")
        return False
    build = ["--experiment", group, "--project", target.project, "--runs", *map(str, run_dirs)]
    build += ["--entity", target.entity] if target.entity else []
    build += ["--target_loss", f"{loss:g}"] if loss is not None else []
    try:
        url = publish(parse_args(build), shlex.join([*PROG.split(), *build]))
    except ReportError as err:
        print(f"warning: W&B report not built ({err}); build it later with: {later}", file=sys.stderr)
        return False
    print(f"W&B report: {url}")
    return True


# ---------------------------------------------------------------------------------------------
# Command line


def group_problem(group: str) -> str | None:
    """Why `group` cannot be the report's filter, or None."""
    if not group.strip():
        return "--experiment is empty"
    bad = sorted({c for c in group if c in UNSAFE_GROUP_CHARACTERS})
    if bad:
        return (
            f"--experiment {group!r} holds {' '.join(bad)}, which a W&B report filter cannot express "
            "(wandb-workspaces parses it as an expression); rename the runs' group in W&B"
        )
    return None


def default_project() -> str:
    """train.py's --wandb_project default, so both sides agree without repeating it."""
    return next(f.default for f in fields(RunConfig) if f.name == "wandb_project")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0], formatter_class=DefaultsHelpFormatter)
    parser.add_argument("--experiment", required=True, metavar="GROUP", help="the experiment name = W&B group")
    parser.add_argument(
        "--project", default=default_project(), help="W&B project of the runs (train.py --wandb_project)"
    )
    parser.add_argument(
        "--entity",
        help="W&B entity of the project (default: the entity the --runs were logged "
        "to, else WANDB_ENTITY, else your login's default entity)",
    )
    parser.add_argument("--title", help="report title (default: 'Strategy comparison: GROUP', like the local report)")
    parser.add_argument(
        "--runs",
        nargs="+",
        type=Path,
        default=[],
        metavar="RUN_DIR",
        help="local run directories to compute the reading from (default: the group's runs "
        "fetched from W&B; with --dry_run: no reading)",
    )
    parser.add_argument(
        "--target_loss",
        type=target_loss,
        metavar="L",
        help="validation loss to reach: adds the time and tokens to reach it, and the verdicts on them",
    )
    parser.add_argument(
        "--dry_run",
        action="store_true",
        help="write the report specification as JSON and send nothing (no network, no login)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="also write the specification as JSON to this file (with --dry_run: instead of standard output)",
    )
    args = parser.parse_args(argv)
    problem = group_problem(args.experiment)
    if problem:
        parser.error(problem)
    if args.title is not None and not 0 < len(args.title) <= MAX_TITLE:
        parser.error(f"--title must be 1 to {MAX_TITLE} characters (a W&B limit), got {len(args.title)}")
    missing = [str(path) for path in args.runs if not path.is_dir()]
    if missing:
        parser.error(f"not a run directory: {', '.join(missing)}")
    return args


def dry_run_spec(args: argparse.Namespace, command: str) -> ReportSpec:
    """The specification without W&B: the reading only from --runs, the entity as report_entity says."""
    reading = reading_of(args.runs, args.experiment, args.target_loss) if args.runs else None
    entity = report_entity(args.entity, args.runs)
    spec = build_spec(args.experiment, args.project, entity, args.title, command, reading, _source(args.runs))
    to_wandb_report(spec)  # constructing the objects checks the spec against the library, offline
    return spec


def publish(args: argparse.Namespace, command: str) -> str:
    """Build the report on W&B; its URL. Raises ReportError."""
    if not wandb_logged_in():
        raise ReportError(
            "not logged in to W&B: run `wandb login` (or set WANDB_API_KEY), "
            "or pass --dry_run to write the report specification without W&B"
        )
    entity = report_entity(args.entity, args.runs) or default_entity()
    if args.runs:
        reading, source = reading_of(args.runs, args.experiment, args.target_loss), _source(args.runs)
    else:
        reading = fetched_reading(entity, args.project, args.experiment, args.target_loss)
        source = f"the runs of group {args.experiment} fetched from W&B ({entity}/{args.project})"
    spec = build_spec(args.experiment, args.project, entity, args.title, command, reading, source)
    if args.out:
        _write(args.out, spec_json(spec))
    return save_report(to_wandb_report(spec))


def _source(run_dirs: Sequence[Path]) -> str:
    return "the local run directories " + ", ".join(f"`{path}`" for path in run_dirs)


def _write(path: Path, text: str) -> None:
    try:
        write_atomic(path, text.encode())
    except OSError as err:
        raise ReportError(f"cannot write {path}: {err.strerror or err}") from err


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    command = shlex.join([*PROG.split(), *argv])
    try:
        if not args.dry_run:
            print(publish(args, command))
        elif args.out:
            _write(args.out, spec_json(dry_run_spec(args, command)))
            print(f"wrote the report specification to {args.out}")
        else:
            print(spec_json(dry_run_spec(args, command)), end="")
    except ReportError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


if __name__ == "__main__":
    run_main(main)
