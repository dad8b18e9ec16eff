"""What train.py's bookkeeping costs: its step time against a bare loop of the same model, batch and step.

    python -m lab.bookkeeping [--preset mini] [--steps 20] [--repeats 2] [--threads N] [--wandb_mode auto]

train.py runs in this process at the preset's settings (W&B at its default: offline without a login),
so its step times include what it does besides computing: the data loader, the per-micro-batch loss
bookkeeping, the metrics lines, the W&B and metrics.jsonl writes at each log interval, the progress
line. The bare loop trains the same model with the same micro-batches, accumulation, grad-norm and
clipping and AdamW, on random tokens, and nothing else. The phases alternate, bare first and last
(bare, train.py, bare, ... `--repeats` train.py runs), so drifting machine load hits both sides alike;
the ratio is of median step times, which a busy machine's spikes move least. Step times leave out
the first `--warmup` steps of each phase; validation and checkpointing are not step time in train.py
either.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from training.cli import run_main


def bare_step_times(preset: str, steps: int, seed: int = 0) -> list[float]:
    """Seconds per optimizer step of a loop with nothing but the training step, train.py's batch geometry."""
    from torch.nn.utils import clip_grads_with_norm_

    from model import GPT2, GPT2Config
    from training.config import OptimConfig, preset_overrides
    from training.step import global_grad_norm, make_optimizer

    values = preset_overrides(preset)
    block, micro = values["block_size"], values["micro_batch_size"]
    accum = values["global_batch_tokens"] // (block * micro)
    torch.manual_seed(seed)
    model = GPT2(GPT2Config.from_preset(values["model_preset"])).train()
    optimizer = make_optimizer(model, OptimConfig(lr=values["lr"]))
    generator = torch.Generator().manual_seed(seed)
    times = []
    for _ in range(steps):
        micro_batches = [
            torch.randint(0, model.config.vocab_size, (micro, block + 1), generator=generator) for _ in range(accum)
        ]
        start = time.perf_counter()
        for tokens in micro_batches:
            _, loss = model(tokens[:, :-1], tokens[:, 1:])
            (loss / accum).backward()
        params = [p for p in model.parameters() if p.grad is not None]
        clip_grads_with_norm_(params, 1.0, global_grad_norm(params).float())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return times


def train_py_step_times(preset: str, steps: int, wandb_mode: str, out: Path) -> list[float]:
    """train.py's own step times (summary.json's step_times_s) for a run of `steps` steps."""
    from training.cli import parse_config
    from training.loop import run_training

    cfg = parse_config(
        [
            "--preset",
            preset,
            "--max_steps",
            str(steps),
            "--output_dir",
            str(out),
            "--overwrite",
            "--no-export_hf",
            "--wandb_mode",
            wandb_mode,
            "--perf_warmup_steps",
            "0",
        ]
    )
    return list(run_training(cfg)["step_times_s"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.bookkeeping", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="mini", help="train.py preset (default: mini)")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per phase (default: 20)")
    parser.add_argument("--warmup", type=int, default=3, help="first steps of each phase left out (default: 3)")
    parser.add_argument("--repeats", type=int, default=2, help="train.py runs, each between bare phases (default: 2)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's); 1 is steadier on a busy machine")
    parser.add_argument("--wandb_mode", default="auto", help="train.py's --wandb_mode (default: auto, as users run it)")
    args = parser.parse_args(argv)
    if args.steps <= args.warmup or args.repeats < 1:
        parser.error("--steps must exceed --warmup, and --repeats be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)

    print(
        f"bookkeeping: preset {args.preset}, {args.steps} steps per phase, first {args.warmup} left out, "
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)",
        flush=True,
    )
    bare: list[float] = []
    train: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            bare_phase = bare_step_times(args.preset, args.steps)[args.warmup :]
            train_phase = train_py_step_times(args.preset, args.steps, args.wandb_mode, Path(tmp) / f"run{repeat}")
            bare += bare_phase
            train += train_phase[args.warmup :]
            print(
                f"phase {repeat + 1}: bare loop median {statistics.median(bare_phase):.4f} s/step, train.py "
                f"median {statistics.median(train_phase[args.warmup :]):.4f} s/step",
                flush=True,
            )
        last = bare_step_times(args.preset, args.steps)[args.warmup :]
        bare += last
        print(f"last bare phase: median {statistics.median(last):.4f} s/step", flush=True)
    ratio = statistics.median(train) / statistics.median(bare)
    print(
        f"train.py {statistics.median(train):.4f} s/step (mean {statistics.fmean(train):.4f}), bare loop "
        f"{statistics.median(bare):.4f} s/step (mean {statistics.fmean(bare):.4f}), medians over "
        f"{len(train)} and {len(bare)} steps"
    )
    print(f"train.py / bare loop step time: {ratio:.3f} (bookkeeping {ratio - 1:+.1%} of step time)")
    return 0


if __name__ == "__main__":
    run_main(main)
