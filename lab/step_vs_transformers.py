"""Our training step against transformers' GPT2LMHeadModel: same config, batch, optimizer and step, one process.

    python -m lab.step_vs_transformers [--device cpu|cuda] [--sizes tiny,mid,124m]
        [--precision fp32,bf16] [--compile] [--rounds 3] [--round_s 3 | --steps N]

Both models get the same weights (ours converted with model/hf.py), the same AdamW (decay on matrices,
fused where training/distributed/speed_levers.py would choose it), and go through the same step function: forward under
autocast, the loss in fp32 from the logits, backward (scaled in fp16), the float64 global grad norm
and clipping of training/step.py, the optimizer step. Only the model differs. The two are timed
alternately, the same number of steps each per round (about `--round_s` seconds' worth, or `--steps`),
after `--warmup` steps each; tokens/s is the median over rounds, and each round swaps who goes first.
MFU divides by the peak that train.py uses (training/records/peaks.py). With `--compile` each size
is measured eager and then compiled, both models' blocks compiled the way train.py compiles them.

A benchmark, not a test: it prints one line per measurement and a table; lab/results/step_benchmarks.md keeps the
figures with the command that printed them.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from training.cli import run_main

# name -> (model overrides of GPT-2 124M, block size, micro-batch) per device type
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"model": {"n_layer": 2, "n_embd": 64, "n_head": 2}, "cpu": (64, 8), "cuda": (256, 32)},
    "mid": {"model": {"n_layer": 6, "n_embd": 384, "n_head": 6}, "cpu": (256, 8), "cuda": (1024, 16)},
    "124m": {"model": {}, "cpu": (256, 2), "cuda": (1024, 16)},
}
PRECISIONS = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Case:
    size: str
    precision: str
    compiled: bool
    block_size: int
    batch: int


@dataclass
class Result:
    case: Case
    ours_tokens_per_s: float
    hf_tokens_per_s: float
    mfu_ours: float
    mfu_hf: float
    loss_ours: float
    loss_hf: float

    @property
    def ratio(self) -> float:
        return self.ours_tokens_per_s / self.hf_tokens_per_s


class HFAdapter(nn.Module):
    """GPT2LMHeadModel called like ours: (input_ids, targets) -> (logits, loss), the loss computed as ours does."""

    def __init__(self, hf_model: nn.Module) -> None:
        super().__init__()
        self.hf = hf_model

    def forward(self, input_ids: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.hf(input_ids=input_ids, use_cache=False).logits
        B, T, V = logits.shape
        return logits, F.cross_entropy(logits.float().view(B * T, V), targets.reshape(B * T))


def adamw(model: nn.Module, fused: bool) -> torch.optim.AdamW:
    from training.config import OptimConfig
    from training.step import make_optimizer

    return make_optimizer(model, OptimConfig(), fused=fused)


class Stepper:
    """One training step of a model: what train.py's step does, without accelerate's wrapping."""

    def __init__(self, model: nn.Module, device: torch.device, precision: str, fused: bool) -> None:
        self.model, self.device = model.to(device).train(), device
        self.optimizer = adamw(self.model, fused)
        self.dtype = PRECISIONS[precision]
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        from torch.nn.utils import clip_grads_with_norm_

        from training.step import global_grad_norm

        with torch.autocast(self.device.type, dtype=self.dtype or torch.float32, enabled=self.dtype is not None):
            _, loss = self.model(tokens[:, :-1], tokens[:, 1:])
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        params = [p for p in self.model.parameters() if p.grad is not None]
        clip_grads_with_norm_(params, 1.0, global_grad_norm(params).float())
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()


def build_pair(
    size: str, block_size: int, device: torch.device, precision: str, compiled: bool, fused: bool
) -> tuple[Stepper, Stepper, float]:
    """(ours, transformers', training FLOPs per token) with identical weights."""
    from model import GPT2, GPT2Config
    from model.hf import to_hf
    from training.distributed.speed_levers import compile_blocks

    torch.manual_seed(0)
    ours = GPT2(GPT2Config(**SIZES[size]["model"]))
    hf = HFAdapter(to_hf(ours))
    flops_per_token = ours.flops_per_token(block_size)
    if compiled:
        compile_blocks(ours.transformer.h)
        compile_blocks(hf.hf.transformer.h)
    return Stepper(ours, device, precision, fused), Stepper(hf, device, precision, fused), flops_per_token


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(
    step: Callable[[torch.Tensor], torch.Tensor], batches: list[torch.Tensor], device: torch.device
) -> tuple[float, float]:
    """(seconds for all batches, the last loss), synchronized before and after."""
    synchronize(device)
    start = time.perf_counter()
    loss = torch.zeros(())
    for tokens in batches:
        loss = step(tokens)
    synchronize(device)
    return time.perf_counter() - start, float(loss)


def measure(
    case: Case,
    device: torch.device,
    rounds: int,
    steps: int | None,
    round_s: float,
    warmup: int,
    peak: float,
    fused: bool,
    log: Callable[[str], None],
) -> Result:
    ours, hf, flops_per_token = build_pair(case.size, case.block_size, device, case.precision, case.compiled, fused)
    generator = torch.Generator().manual_seed(1)
    first = torch.randint(0, 50257, (case.batch, case.block_size + 1), generator=generator).to(device)
    for stepper in (ours, hf):  # warm-up: allocator, kernels, and with --compile the compilation
        time_steps(stepper, [first] * warmup, device)
    if steps is None:  # as many steps as take about round_s seconds, the same number for both models
        # Both take the sizing step, so both have trained equally often (their losses are printed side by side).
        steps = max(1, round(round_s / time_steps(ours, [first], device)[0]))
        time_steps(hf, [first], device)
    batches = [first] + [
        torch.randint(0, 50257, (case.batch, case.block_size + 1), generator=generator).to(device)
        for _ in range(steps - 1)
    ]
    tokens = steps * case.batch * case.block_size
    rates: dict[str, list[float]] = {"ours": [], "hf": []}
    losses = {"ours": 0.0, "hf": 0.0}
    for r in range(rounds):
        # Alternate, and swap who goes first each round, so drifting machine load hits both alike.
        order = (("ours", ours), ("hf", hf)) if r % 2 == 0 else (("hf", hf), ("ours", ours))
        for name, stepper in order:
            seconds, losses[name] = time_steps(stepper, batches, device)
            rates[name].append(tokens / seconds)
        log(
            f"  round {r + 1}/{rounds}, {steps} step(s) each: ours {rates['ours'][-1]:,.0f} tok/s, "
            f"transformers {rates['hf'][-1]:,.0f} tok/s"
        )
    ours_rate, hf_rate = statistics.median(rates["ours"]), statistics.median(rates["hf"])
    return Result(
        case,
        ours_rate,
        hf_rate,
        ours_rate * flops_per_token / peak,
        hf_rate * flops_per_token / peak,
        losses["ours"],
        losses["hf"],
    )


def table(results: list[Result]) -> str:
    lines = [
        "| size | precision | mode | block x batch | ours tok/s | transformers tok/s | ratio | MFU ours "
        "| MFU transformers |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        c = r.case
        lines.append(
            f"| {c.size} | {c.precision} | {'compiled' if c.compiled else 'eager'} | {c.block_size} x "
            f"{c.batch} | {r.ours_tokens_per_s:,.0f} | {r.hf_tokens_per_s:,.0f} | {r.ratio:.3f} | "
            f"{r.mfu_ours:.1%} | {r.mfu_hf:.1%} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m lab.step_vs_transformers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--sizes", help="comma-separated: tiny, mid (6 x 384), 124m (default: cpu all three, cuda 124m)"
    )
    parser.add_argument("--precision", help="comma-separated: fp32, fp16, bf16 (default: cpu fp32, cuda bf16,fp16)")
    parser.add_argument("--compile", action="store_true", help="also measure both models compiled")
    parser.add_argument("--block_size", type=int, help="tokens per sequence (default: per size and device)")
    parser.add_argument("--batch", type=int, help="sequences per step (default: per size and device)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's); 1 is steadier on a busy CPU")
    parser.add_argument("--rounds", type=int, default=3, help="alternations; tokens/s is the median (default: 3)")
    parser.add_argument(
        "--steps",
        type=int,
        help="timed steps per model and round (default: as many as take --round_s seconds, measured after the warm-up)",
    )
    parser.add_argument(
        "--round_s", type=float, default=3.0, help="seconds per model and round when --steps is not given (default: 3)"
    )
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per model first (default: 2)")
    args = parser.parse_args(argv)
    args.sizes = (args.sizes or ("tiny,mid,124m" if args.device == "cpu" else "124m")).split(",")
    args.precision = (args.precision or ("fp32" if args.device == "cpu" else "bf16,fp16")).split(",")
    for size in args.sizes:
        if size not in SIZES:
            parser.error(f"unknown size {size!r}; choose from {', '.join(SIZES)}")
    for precision in args.precision:
        if precision not in PRECISIONS:
            parser.error(f"unknown precision {precision!r}; choose from {', '.join(PRECISIONS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible")
    if args.rounds < 1 or (args.steps is not None and args.steps < 1) or args.warmup < 0 or args.round_s <= 0:
        parser.error("--rounds and --steps must be >= 1, --warmup >= 0, --round_s > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    from training.distributed.speed_levers import DeviceInfo, apply_tf32, decide_fused_adamw, decide_tf32
    from training.records.peaks import peak_flops

    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    info = DeviceInfo.of(device)
    fused, _ = decide_fused_adamw("auto", info)
    tf32, _ = decide_tf32("auto", info)
    apply_tf32(tf32)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        f"benchmark: {name}, torch {torch.__version__}, {torch.get_num_threads()} thread(s), fused AdamW "
        f"{'on' if fused else 'off'}, TF32 {'on' if tf32 else 'off'}",
        flush=True,
    )
    results = []
    for size in args.sizes:
        default_block, default_batch = SIZES[size][device.type]
        for precision in args.precision:
            peak = peak_flops(device, precision)
            for compiled in (False, True) if args.compile else (False,):
                case = Case(size, precision, compiled, args.block_size or default_block, args.batch or default_batch)
                print(
                    f"{case.size} {case.precision} {'compiled' if compiled else 'eager'}, {case.block_size} x "
                    f"{case.batch} tokens per step; MFU peak: {peak.source}",
                    flush=True,
                )
                result = measure(
                    case,
                    device,
                    args.rounds,
                    args.steps,
                    args.round_s,
                    args.warmup,
                    peak.flops_per_s,
                    fused,
                    lambda line: print(line, flush=True),
                )
                print(
                    f"  ours {result.ours_tokens_per_s:,.0f} tok/s, transformers {result.hf_tokens_per_s:,.0f} "
                    f"tok/s, ratio {result.ratio:.3f}, MFU {result.mfu_ours:.1%} vs {result.mfu_hf:.1%} "
                    f"(last losses {result.loss_ours:.4f} vs {result.loss_hf:.4f})",
                    flush=True,
                )
                results.append(result)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    print(table(results))
    return 0


if __name__ == "__main__":
    run_main(main)
