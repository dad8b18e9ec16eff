"""Compare run directories: `python -m analysis.compare RUN_DIR... --out DIR`.

Writes table.md, table.csv, the figures, report.md and a self-contained report.html into DIR;
`--gpu_hour_price PRICE` (one device for one hour, any currency) adds each run's cost per million tokens;
`--target_loss L` adds each strategy's training time, tokens and (with a price) cost to the first validation
loss at or below L; `--mlperf` adds MLPerf's mean of the runs less the fastest and the slowest. Runs of one
strategy are its repeats: every figure gets a 95% interval and every pair a verdict (report.json).
Exit status: 0 when a report was written, 2 when an argument is bad, a run directory does not exist, no
run is usable, or W&B could not be asked. Problems with single runs go to stderr, one line each.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from pathlib import Path

from analysis.prediction import experiment_wall_s, read_prediction
from analysis.report import build_report, units_line, write_report
from analysis.runs import Run, assign_labels, load_run, sort_runs
from analysis.scaling import gpu_hour_price
from analysis.wandb_fetch import APPROXIMATION_NOTE, FetchError, fetch_wandb_runs
from training.cli import EXIT_BAD_INPUT, OneLineParser, run_main

EXIT_OK = 0
EXIT_UNUSABLE = EXIT_BAD_INPUT


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser(prog="python -m analysis.compare", description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="*", type=Path, metavar="RUN_DIR", help="run directories to compare")
    parser.add_argument("--out", type=Path, required=True, help="report folder (created; files in it replaced)")
    parser.add_argument("--from_wandb", metavar="ENTITY/PROJECT", help="also fetch the runs of --group from W&B")
    parser.add_argument("--group", help="W&B group (the experiment name) to fetch with --from_wandb")
    parser.add_argument(
        "--gpu_hour_price",
        type=gpu_hour_price,
        metavar="PRICE",
        help="price of one device for one hour, any currency: adds cost per million tokens",
    )
    parser.add_argument(
        "--target_loss",
        type=target_loss,
        metavar="L",
        help="validation loss to reach: adds time, tokens and cost to first reach it",
    )
    parser.add_argument(
        "--mlperf",
        action="store_true",
        help="also give the MLPerf-style mean of the runs less the fastest and the slowest",
    )
    args = parser.parse_args(argv)
    if not args.run_dirs and not args.from_wandb:
        parser.error("give at least one RUN_DIR or --from_wandb ENTITY/PROJECT --group NAME")
    if bool(args.from_wandb) != bool(args.group):
        parser.error("--from_wandb and --group go together")
    return args


def target_loss(text: str) -> float:
    """A validation loss to reach: a positive finite number of nats."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of nats, got {text!r}")
    return value


def load_comparison(run_dirs: list[Path]) -> tuple[list[Run], list[Run]]:
    """The usable runs of `run_dirs`, labelled and in table order, and the ones left out."""
    runs = [load_run(path) for path in _unique(run_dirs)]
    usable = [run for run in runs if run.usable]
    assign_labels(usable)
    return sort_runs(usable), [run for run in runs if not run.usable]


def compare(
    run_dirs: list[Path],
    out_dir: Path,
    command: str,
    notes: list[str] | None = None,
    gpu_hour_price: float | None = None,
    target_loss: float | None = None,
    mlperf: bool = False,
) -> int:
    """Load `run_dirs`, report problems on stderr, write the report of the usable runs into `out_dir`;
    `gpu_hour_price` (per device-hour) prices the runs, `target_loss` and `mlperf` as the flags say."""
    usable, excluded = load_comparison(run_dirs)
    for run in [*usable, *excluded]:
        for problem in run.problems:
            print(f"warning: {run.path}: {problem}", file=sys.stderr)
    if not usable:
        print(
            f"error: none of the {len(excluded)} run directories has a usable summary.json; no report written",
            file=sys.stderr,
        )
        return EXIT_UNUSABLE
    # An experiment's folder holds the wall time predicted before it launched: set against the runs.
    prediction, wall_s = read_prediction(out_dir), experiment_wall_s(out_dir)
    report = build_report(usable, excluded, command, notes, gpu_hour_price, target_loss, mlperf, prediction, wall_s)
    written = write_report(report, out_dir)
    # The answer first, where the user is looking: the experiment driver and the notebook print this too.
    print("\n".join(line.replace("**", "") for line in [*report.reading.answer, *units_line(usable)]))
    print(f"wrote {len(written)} files to {out_dir} (open {out_dir / 'report.html'})")
    return EXIT_OK


def _unique(paths: list[Path]) -> list[Path]:
    seen: dict[Path, Path] = {}
    for path in paths:
        seen.setdefault(path.resolve(), path)
    return list(seen.values())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    missing = [path for path in args.run_dirs if not path.is_dir()]
    if missing:
        print(f"error: not a run directory: {', '.join(str(p) for p in missing)}", file=sys.stderr)
        return EXIT_UNUSABLE
    run_dirs = list(args.run_dirs)
    notes = []
    if args.from_wandb:
        try:
            fetched = fetch_wandb_runs(args.from_wandb, args.group, args.out / "wandb_runs")
        except FetchError as err:
            print(f"error: {err}", file=sys.stderr)
            return EXIT_UNUSABLE
        run_dirs += fetched
        notes += [f"{path}: {APPROXIMATION_NOTE}" for path in fetched]
    command = shlex.join(["python", "-m", "analysis.compare", *argv])
    return compare(run_dirs, args.out, command, notes, args.gpu_hour_price, args.target_loss, args.mlperf)


if __name__ == "__main__":
    run_main(main)
