"""The planner's step time against measured steps on this CPU: every strategy, 1, 2 and 4 micro-steps.

    python -m benchmarks.step_time [--presets tiny,mini] [--strategies single,ddp,fsdp,fsdp_zero2,fsdp_offload]
        [--micro_steps 1,2,4] [--steps 5] [--warmup 2] [--out runs/step_time] [--data CSV] [--reuse]

First it measures the two inputs of the planner's CPU step that no run records, with as many processes
computing at once as the runs have (1 for `single`, 2 for the others), each on one thread (what accelerate's
OMP_NUM_THREADS=1 gives each process): the MFU of the preset's forward and backward (one micro-batch, loss
included, against the one-process peak the runs divide by, training/hardware.py) and one core's rate over
AdamW's element-wise passes (benchmarks/offload_update.py, on the model's largest tensor), each the slowest
process's. Two processes computing at once each compute slower than one alone whenever they share cores
with other work: a compute rate measured alone would then predict every two-process step too fast. Then it launches each strategy (2 processes,
one for `single`) for `--steps` steps at each accumulation, the preset's micro-batch throughout, and prints
`python -m planner --run`'s predicted step (at that MFU, the run's measured peak and link) beside the
steady-state mean of the steps after `--warmup`, then, per accumulation, the pairs of strategies the
prediction orders wrongly beyond its uncertainty (planner.plan.misordered). A sharding row also shows what
its measured all-gathers and reduce-scatters (each kind's bandwidth and FSDP2's per-unit call, recorded by
the run, training/link.py) add to the prediction against pricing them at the all-reduce's alpha-beta. The
runs' own step times are never fed back into the prediction. `--reuse` keeps the runs and calibrations
already in `--out`, so a table can be measured in several sittings (`--strategies` and `--micro_steps` pick
each part) and printed whole at the end. A benchmark, not a test: it prints a table and asserts nothing (docs/planning.md keeps
the figures with the date and this command). Launch it alone on the machine: other work slows the runs.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from benchmarks.offload_update import DECAYED_BYTES_PER_ELEMENT, adamw_over, fastest_steps
from model import GPT2, GPT2Config
from model.shapes import flops_per_token, parameter_shapes
from planner.cost_model import step_time
from planner.plan import PER_CALL_FIELDS, Timed, compare_run, measured_link, misordered, run_workload
from tests.launch import CONFIGS, accelerate_command, run, write_news_csv
from training import registry
from training.cli import run_main
from training.hardware import cpu_peak_flops
from training.presets import preset_overrides

PROCESSES = 2
CALIBRATION_REPEATS = 7
CALIBRATION_TIMEOUT_S = 600


@dataclass(frozen=True)
class Calibration:
    """What `processes` processes, computing at once on this machine, each reach: the MFU of one micro-batch's
    forward and backward and one core's AdamW rate, both the slowest process's (a run's ranks wait for the
    slowest at every collective), against one process's peak FLOP/s (the one the runs divide by)."""

    processes: int
    mfu: float
    adamw_gb_s: float
    peak_flops: float


def calibrate(preset: str, cache_dir: Path, processes: int) -> Calibration:
    """The calibration with `processes` processes at once, each on one thread (what accelerate's
    OMP_NUM_THREADS=1 gives a run's processes), each figure the fastest of CALIBRATION_REPEATS."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        peak = cpu_peak_flops(cache_dir, threads=1).flops_per_s
    finally:
        torch.set_num_threads(threads)
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no thread pool or state inherited
    barrier, results = context.Barrier(processes), context.Queue()
    workers = [context.Process(target=_calibration_worker, args=(preset, barrier, results)) for _ in range(processes)]
    for worker in workers:
        worker.start()
    timings = [results.get(timeout=CALIBRATION_TIMEOUT_S) for _ in workers]
    for worker in workers:
        worker.join()
    step_s = max(t[0] for t in timings)
    update_s = max(t[1] for t in timings)
    values = preset_overrides(preset)
    cfg = GPT2Config.from_preset(values["model_preset"])
    tokens = values["micro_batch_size"] * values["block_size"]
    largest = _largest_shape(cfg)
    return Calibration(
        processes,
        mfu=tokens * flops_per_token(cfg, values["block_size"]) / (step_s * peak),
        adamw_gb_s=DECAYED_BYTES_PER_ELEMENT * torch.Size(largest).numel() / update_s / 1e9,
        peak_flops=peak,
    )


def _largest_shape(cfg: GPT2Config) -> tuple[int, ...]:
    return max(parameter_shapes(cfg).values(), key=lambda shape: torch.Size(shape).numel())


def _calibration_worker(preset: str, barrier: Any, results: Any) -> None:
    """One calibrating process: its fastest forward and backward, then its fastest AdamW step, each started
    together with the other processes' (the barrier) so that they compute at the same time, as a run's do."""
    torch.set_num_threads(1)
    values = preset_overrides(preset)
    cfg = GPT2Config.from_preset(values["model_preset"])
    batch, block = values["micro_batch_size"], values["block_size"]
    model = GPT2(cfg)
    idx = torch.randint(0, cfg.vocab_size, (batch, block), generator=torch.Generator().manual_seed(0))
    optimizer = adamw_over([_largest_shape(cfg)])
    barrier.wait()
    best = float("inf")
    for _ in range(CALIBRATION_REPEATS + 1):  # the first pass allocates: it is timed but cannot win
        start = time.perf_counter()
        _, loss = model(idx, targets=idx)
        loss.backward()
        best = min(best, time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
    barrier.wait()
    (update_s,) = fastest_steps([optimizer], CALIBRATION_REPEATS)
    results.put((best, update_s))


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
    parser = argparse.ArgumentParser(prog="python -m benchmarks.step_time", description=__doc__.splitlines()[0])
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
    for preset in args.presets.split(","):
        strategies = args.strategies.split(",")
        counts = sorted({PROCESSES if registry.get(s).multi_process else 1 for s in strategies})
        calibrations = {n: _calibration(preset, n, args) for n in counts}
        for strategy in strategies:
            cal = calibrations[PROCESSES if registry.get(strategy).multi_process else 1]
            for micro_steps in (int(a) for a in args.micro_steps.split(",")):
                folder = args.out / f"{preset}-{strategy}-a{micro_steps}"
                if not (args.reuse and (folder / "summary.json").exists()):
                    launch(preset, strategy, micro_steps, args, args.out)
                t = compare_run(folder, cal.mfu, cal.adamw_gb_s)["step_time"]
                t["fsdp_terms_s"] = _fsdp_terms_s(folder, cal, t)
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


def _calibration(preset: str, processes: int, args: argparse.Namespace) -> Calibration:
    """Measured now, or with --reuse the one kept in OUT from an earlier sitting; printed either way."""
    path = args.out / f"calibration-{preset}-{processes}p.json"
    if args.reuse and path.exists():
        cal, when = Calibration(**json.loads(path.read_text(encoding="utf-8"))), "kept"
    else:
        cal, when = calibrate(preset, args.cache_dir, processes), "measured"
        path.write_text(json.dumps(asdict(cal)), encoding="utf-8")
    print(
        f"{preset}, {processes} process(es) at once ({when}): forward+backward at MFU {cal.mfu:.3f} of "
        f"{cal.peak_flops / 1e9:.1f} GFLOP/s, AdamW {cal.adamw_gb_s:.1f} GB/s",
        flush=True,
    )
    return cal


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


def _fsdp_terms_s(folder: Path, cal: Calibration, t: dict) -> float | None:
    """What pricing FSDP's collectives with the run's own measured all-gather and reduce-scatter (each kind's
    bandwidth, FSDP2's per-unit call) adds to the predicted step, against pricing them at the all-reduce's
    alpha-beta as the planner did before it measured them; None where the run measured none (one process, DDP)."""
    if t["predicted_s"] is None or t.get("all_gather_gb_s") is None:
        return None
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    w, strategy, _ = run_workload(config, summary)
    link = replace(measured_link(config, folder), host_update_gb_s=cal.adamw_gb_s)
    unmeasured = dict.fromkeys(("gather_gb_s", "scatter_gb_s", "sharded_span", *PER_CALL_FIELDS))
    bare = replace(link, **unmeasured)
    return t["predicted_s"] - step_time(w, strategy, summary["peak_flops_per_device"], cal.mfu, bare).step_s


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
