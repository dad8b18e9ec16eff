"""The planner's step time against measured steps on this CPU: every strategy, 1, 2 and 4 micro-steps.

    python -m lab.step_time [--presets tiny,mini] [--strategies single,ddp,fsdp,fsdp_zero2,fsdp_offload]
        [--micro_steps 1,2,4] [--steps 5] [--warmup 2] [--out runs/step_time] [--data CSV] [--reuse]

First it measures this machine's profile for the presets into OUT (planner/measure.py, what `python -m planner
measure` does: the MFU of one micro-batch's forward and backward and one core's AdamW rate with 1 and 2
processes computing at once, and the link between 2). Then it launches each strategy (2 processes, one for
`single`) for `--steps` steps at each accumulation, the preset's micro-batch throughout, and prints
`python -m planner --run`'s predicted step from that profile beside the steady-state mean of the steps after
`--warmup`, then, per accumulation, the pairs of strategies the prediction orders wrongly beyond its
uncertainty (planner.plan.misordered). A sharding row also shows what the measured all-gathers and
reduce-scatters (each kind's bandwidth and FSDP2's per-unit call) add to the prediction against pricing them at
the all-reduce's alpha-beta. The runs' own step times are never fed back into the prediction. `--reuse` keeps
the runs and the profile already in `--out`, so a table can be measured in several sittings and printed whole
at the end. A benchmark, not a test: it prints a table and asserts nothing (lab/results/planning_checks.md keeps
the figures with the date and this command). Launch it alone on the machine: other work slows the runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from lab.launch import CONFIGS, accelerate_command, run, write_news_csv
from planner.cost_model import step_time
from planner.measure import measure
from planner.plan import PER_CALL_FIELDS, Timed, compare_run, link_from_record, misordered, run_workload
from planner.profile import MachineProfile, read_profile, write_profile
from training.cli import run_main
from training.config import preset_overrides
from training.distributed import registry

PROCESSES = 2


def launch(preset: str, strategy: str, micro_steps: int, args: argparse.Namespace, out: Path) -> Path:
    """One run of `strategy` at `micro_steps` micro-batches per step; its folder."""
    entry = registry.get(strategy)
    values = preset_overrides(preset)
    processes = PROCESSES if entry.multi_process else 1
    tokens = values["micro_batch_size"] * values["block_size"] * micro_steps * processes
    folder = out / f"{preset}-{strategy}-a{micro_steps}"
    train_args = [
        *("--preset", preset, "--data", str(args.data), "--cache_dir", str(args.cache_dir)),
        *("--max_steps", str(args.steps), "--perf_warmup_steps", str(args.warmup), "--log_interval", "1"),
        *("--global_batch_tokens", str(tokens), "--val_fraction", "0.3", "--eval_blocks", "2"),
        *("--eval_interval", "1000000", "--wandb_mode", "disabled", "--no-export_hf", "--overwrite"),
        *("--output_dir", str(folder)),
    ]
    launch_args = ["--num_processes", str(processes)]
    run(accelerate_command(CONFIGS / entry.config_file, "train.py", train_args, launch_args=launch_args))
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.step_time", description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="tiny,mini")
    parser.add_argument("--strategies", default="single,ddp,fsdp,fsdp_zero2,fsdp_offload")
    parser.add_argument("--micro_steps", default="1,2,4", help="accumulation steps, each a run per strategy")
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps per run (default 5)")
    parser.add_argument("--warmup", type=int, default=2, help="steps left out of the measured mean (default 2)")
    parser.add_argument("--out", type=Path, default=Path("runs/step_time"))
    parser.add_argument("--data", type=Path, default=None, help="a corpus (default: a small synthetic one)")
    parser.add_argument("--cache_dir", type=Path, default=None, help="default: OUT/cache")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="keep the finished runs and calibrations already in OUT, launch and calibrate only what is missing "
        "(to measure a table in several shorter sittings, then print it whole)",
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    args.out.mkdir(parents=True, exist_ok=True)
    args.cache_dir = args.cache_dir or args.out / "cache"
    if args.data is None:
        args.data = args.out / "news.csv"
        if not (args.reuse and args.data.exists()):
            write_news_csv(args.data, articles=60, words=200)
    rows = []
    profile_path = _profile(args.presets.split(","), args)
    profile = read_profile(profile_path)
    for preset in args.presets.split(","):
        for strategy in args.strategies.split(","):
            for micro_steps in (int(a) for a in args.micro_steps.split(",")):
                folder = args.out / f"{preset}-{strategy}-a{micro_steps}"
                if not (args.reuse and (folder / "summary.json").exists()):
                    launch(preset, strategy, micro_steps, args, args.out)
                t = compare_run(folder, profile=profile_path)["step_time"]
                t["fsdp_terms_s"] = _fsdp_terms_s(folder, profile, t)
                rows.append((preset, strategy, micro_steps, t))
                print(_row(*rows[-1]), flush=True)
    errors = [abs(t["error_pct"]) for *_, t in rows if t["error_pct"] is not None]
    print(
        "\n| preset | strategy | processes | micro-steps | predicted s (range) | of which FSDP's measured calls s "
        "| measured s | error |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(_row(*row))
    if errors:
        print(
            f"\n|error|: median {statistics.median(errors):.1f}%, largest {max(errors):.1f}%, "
            f"{sum(e <= 20 for e in errors)} of {len(errors)} within 20%"
        )
    print()
    for line in _ordering_lines(rows):
        print(line)
    return 0


def _profile(presets: list[str], args: argparse.Namespace) -> Path:
    """This machine's profile (`python -m planner measure`) for the presets, in OUT; with --reuse the one kept."""
    path = args.out / "machine_profile.json"
    kept = read_profile(path) if args.reuse and path.exists() else None
    missing = [p for p in presets if kept is None or kept.compute_for(p, PROCESSES, 1) is None]
    if missing:  # added to what --reuse kept: a later sitting may measure other presets
        write_profile(path, measure(missing, [1, PROCESSES], 1, args.cache_dir))
    return path


def _ordering_lines(rows: list[tuple[str, str, int, dict]]) -> list[str]:
    """Per preset and accumulation, the pairs of strategies whose measured speeds differ beyond the planner's
    uncertainty between two strategies, yet which the prediction orders the other way."""
    lines = []
    for preset, micro_steps in dict.fromkeys((p, a) for p, _, a, _ in rows):
        group = [
            Timed(strategy, _tokens_per_step(preset, strategy, a), t["predicted_s"], t["measured_s"])
            for p, strategy, a, t in rows
            if (p, a) == (preset, micro_steps) and t["predicted_s"] and t["measured_s"]
        ]
        wrong = misordered(group)
        fastest = max(group, key=lambda g: g.tokens / g.measured_s).name if group else "none"
        predicted = max(group, key=lambda g: g.tokens / g.predicted_s).name if group else "none"
        pairs = ", ".join(f"{a} measured faster than {b}" for a, b in wrong) or "none"
        lines.append(
            f"{preset} at {micro_steps} micro-step(s): predicted fastest {predicted}, measured fastest {fastest}; "
            f"pairs ordered wrongly beyond the uncertainty: {pairs}"
        )
    return lines


def _fsdp_terms_s(folder: Path, profile: MachineProfile, t: dict) -> float | None:
    """What pricing FSDP's collectives with the measured all-gather and reduce-scatter (each kind's bandwidth,
    FSDP2's per-unit call, from the machine profile) adds to the predicted step, against pricing them at the
    all-reduce's alpha-beta; None where none was used (one process, DDP)."""
    if t["predicted_s"] is None or t.get("all_gather_gb_s") is None:
        return None
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    w, strategy, _ = run_workload(config, summary)
    # The link the prediction used: the run's own (a folder kept from before the profile), else the profile's.
    recorded = (config.get("launch") or {}).get("link")
    record = recorded if isinstance(recorded, dict) else profile.link_for(w.world_size)
    link = replace(link_from_record(record), host_update_gb_s=t["host_update_gb_s"])
    unmeasured = dict.fromkeys(("gather_gb_s", "scatter_gb_s", "sharded_span", *PER_CALL_FIELDS))
    bare = replace(link, **unmeasured)
    return t["predicted_s"] - step_time(w, strategy, t["peak_flops"], t["mfu_given"], bare).step_s


def _tokens_per_step(preset: str, strategy: str, micro_steps: int) -> int:
    values = preset_overrides(preset)
    processes = PROCESSES if registry.get(strategy).multi_process else 1
    return values["micro_batch_size"] * values["block_size"] * micro_steps * processes


def _row(preset: str, strategy: str, micro_steps: int, t: dict) -> str:
    processes = PROCESSES if registry.get(strategy).multi_process else 1
    low, high = t["range_s"] or (float("nan"), float("nan"))
    error = "n/a" if t["error_pct"] is None else f"{t['error_pct']:+.1f}%"
    terms = "" if t.get("fsdp_terms_s") is None else f"{t['fsdp_terms_s']:+.3f}"
    return (
        f"| {preset} | {strategy} | {processes} | {micro_steps} | {t['predicted_s']:.3f} ({low:.3f}-{high:.3f}) "
        f"| {terms} | {t['measured_s']:.3f} | {error} |"
    )


if __name__ == "__main__":
    run_main(main)
