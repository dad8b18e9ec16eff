"""The planner's step time against measured steps on this CPU: every strategy, 1, 2 and 4 micro-steps.

    python -m benchmarks.step_time [--presets tiny,mini] [--strategies single,ddp,fsdp,fsdp_zero2,fsdp_offload]
        [--micro_steps 1,2,4] [--steps 5] [--warmup 2] [--out runs/step_time] [--data CSV]

First it measures, in this process on one thread (what accelerate's OMP_NUM_THREADS=1 gives each process), the
two inputs of the planner's CPU step that no run records: the MFU of the preset's forward and backward (one
micro-batch, loss included, against the peak the runs divide by, training/hardware.py) and one core's rate
over AdamW's element-wise passes (benchmarks/offload_update.py, on the model's largest tensor). Then it
launches each strategy (2 processes, one for `single`) for `--steps` steps at each accumulation, the
preset's micro-batch throughout, and prints `python -m planner --run`'s predicted step (at that MFU, the
run's measured peak and link) beside the steady-state mean of the steps after `--warmup`. The runs' own
step times are never fed back into the prediction. A benchmark, not a test: it prints a table and asserts
nothing (docs/planning.md keeps the figures with the date and this command). Launch it alone on the machine:
other work slows the runs, not the calibration.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.offload_update import DECAYED_BYTES_PER_ELEMENT, adamw_over, fastest_steps
from model import GPT2, GPT2Config
from model.shapes import flops_per_token, parameter_shapes
from planner.plan import compare_run
from tests.launch import CONFIGS, accelerate_command, run, write_news_csv
from training import registry
from training.cli import run_main
from training.hardware import cpu_peak_flops
from training.presets import preset_overrides

PROCESSES = 2
CALIBRATION_REPEATS = 7


def calibrate(preset: str, cache_dir: Path) -> tuple[float, float, float]:
    """(MFU of one micro-batch's forward and backward, one core's AdamW rate in GB/s, the peak FLOP/s) on one
    thread, the fastest of CALIBRATION_REPEATS each (other work only slows a measurement)."""
    values = preset_overrides(preset)
    cfg = GPT2Config.from_preset(values["model_preset"])
    batch, block = values["micro_batch_size"], values["block_size"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        peak = cpu_peak_flops(cache_dir, threads=1).flops_per_s
        model = GPT2(cfg)
        idx = torch.randint(0, cfg.vocab_size, (batch, block), generator=torch.Generator().manual_seed(0))
        best = float("inf")
        for _ in range(CALIBRATION_REPEATS + 1):  # the first pass allocates: it is timed but cannot win
            start = time.perf_counter()
            _, loss = model(idx, targets=idx)
            loss.backward()
            best = min(best, time.perf_counter() - start)
            model.zero_grad(set_to_none=True)
        mfu = batch * block * flops_per_token(cfg, block) / (best * peak)
        largest = max(parameter_shapes(cfg).values(), key=lambda shape: torch.Size(shape).numel())
        (seconds,) = fastest_steps([adamw_over([largest])], CALIBRATION_REPEATS)
        rate = DECAYED_BYTES_PER_ELEMENT * torch.Size(largest).numel() / seconds / 1e9
    finally:
        torch.set_num_threads(threads)
    return mfu, rate, peak


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
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    args.out.mkdir(parents=True, exist_ok=True)
    args.cache_dir = args.cache_dir or args.out / "cache"
    if args.data is None:
        args.data = args.out / "news.csv"
        write_news_csv(args.data, articles=60, words=200)
    rows = []
    for preset in args.presets.split(","):
        mfu, rate, peak = calibrate(preset, args.cache_dir)
        print(f"{preset}: forward+backward at MFU {mfu:.3f} of {peak / 1e9:.1f} GFLOP/s, AdamW {rate:.1f} GB/s")
        for strategy in args.strategies.split(","):
            for micro_steps in (int(a) for a in args.micro_steps.split(",")):
                t = compare_run(launch(preset, strategy, micro_steps, args, args.out), mfu, rate)["step_time"]
                rows.append((preset, strategy, micro_steps, t))
                print(_row(*rows[-1]), flush=True)
    errors = [abs(t["error_pct"]) for *_, t in rows if t["error_pct"] is not None]
    print("\n| preset | strategy | processes | micro-steps | predicted s (range) | measured s | error |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for row in rows:
        print(_row(*row))
    if errors:
        print(
            f"\n|error|: median {statistics.median(errors):.1f}%, largest {max(errors):.1f}%, "
            f"{sum(e <= 20 for e in errors)} of {len(errors)} within 20%"
        )
    return 0


def _row(preset: str, strategy: str, micro_steps: int, t: dict) -> str:
    processes = PROCESSES if registry.get(strategy).multi_process else 1
    low, high = t["range_s"] or (float("nan"), float("nan"))
    error = "n/a" if t["error_pct"] is None else f"{t['error_pct']:+.1f}%"
    return (
        f"| {preset} | {strategy} | {processes} | {micro_steps} | {t['predicted_s']:.3f} ({low:.3f}-{high:.3f}) "
        f"| {t['measured_s']:.3f} | {error} |"
    )


if __name__ == "__main__":
    run_main(main)
