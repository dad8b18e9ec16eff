"""Synthetic run directories for the analysis tests, written as docs/run_directory.md specifies."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# The runs' --perf_warmup_steps: the fixtures' means leave these steps out, as train.py's do.
WARMUP_STEPS = 3


def _mean_after_warmup(losses_by_step: dict[int, float]) -> float:
    """The expected loss mean, written out rather than asked of training/records/steady_mean.py (the code under test):
    the plain average of the losses at steps WARMUP_STEPS + 1 onwards. Every fixture loss is finite and
    every fixture range reaches past the warm-up, so nothing else of the steady mean applies here."""
    kept = [loss for step, loss in losses_by_step.items() if step > WARMUP_STEPS]
    assert kept, "a fixture range that lies inside the warm-up has no expected mean here"
    return math.fsum(kept) / len(kept)


@dataclass
class FakeRun:
    """Known figures of one run; `write_run` turns them into config.json, metrics.jsonl, summary.json."""

    strategy: str = "single"
    world_size: int = 1
    epochs: int = 3
    steps_per_epoch: int = 20
    global_batch_tokens: int = 8192
    tokens_per_s: float = 40_000.0  # whole job
    peak_alloc_mib: float = 3000.0  # max over devices
    peak_alloc_mean_mib: float | None = None  # mean over devices; default: equal to the max
    peak_reserved_mib: float = 3500.0
    loss_start: float = 10.8
    loss_end: float = 6.0
    loss_noise: float = 0.05
    noise_seed: int = 0
    grad_norm: float = 1.5
    mfu: float = 0.25
    precision: str = "fp16"
    seed: int = 1337
    data_key: str = "5e0f3c1d2b4a" + "0" * 20
    complete: bool = True
    experiment: str = "tiny-test"
    epoch_jitter: float = 0.0  # relative per-epoch wobble of throughput and grad norm, for realistic figures

    def loss(self, step: int) -> float:
        """Exponential decay towards loss_end over the whole run, plus reproducible noise."""
        total = self.epochs * self.steps_per_epoch
        trend = self.loss_end + (self.loss_start - self.loss_end) * math.exp(-4.0 * step / total)
        noise = np.random.default_rng([self.noise_seed, step]).normal(0.0, self.loss_noise)
        return float(trend + noise)


def write_run(directory: Path, fake: FakeRun) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    lines, epochs = [], []
    elapsed = 0.0
    step_time = fake.global_batch_tokens / fake.tokens_per_s
    alloc_mean = fake.peak_alloc_mib if fake.peak_alloc_mean_mib is None else fake.peak_alloc_mean_mib
    for epoch in range(1, fake.epochs + 1):
        losses, steps = [], []
        for i in range(fake.steps_per_epoch):
            step = (epoch - 1) * fake.steps_per_epoch + i + 1
            elapsed += step_time
            losses.append(fake.loss(step))
            steps.append(step)
            lines.append(
                {
                    "kind": "train",
                    "step": step,
                    "epoch": epoch,
                    "tokens": step * fake.global_batch_tokens,
                    "loss": losses[-1],
                    "loss_interval": losses[-1],
                    "grad_norm": fake.grad_norm,
                    "lr": 6e-4,
                    "step_time_s": step_time,
                    "tokens_per_s": fake.tokens_per_s,
                    "tokens_per_s_per_device": fake.tokens_per_s / fake.world_size,
                    "samples_per_s": fake.tokens_per_s / 128,
                    "mfu": fake.mfu,
                    "peak_mem_allocated_mib": fake.peak_alloc_mib,
                    "peak_mem_reserved_mib": fake.peak_reserved_mib,
                    "peak_mem_allocated_mib_mean": alloc_mean,
                    "peak_mem_reserved_mib_mean": fake.peak_reserved_mib,
                    "elapsed_s": elapsed,
                    "warmup": step <= WARMUP_STEPS,
                }
            )
        tokens = fake.steps_per_epoch * fake.global_batch_tokens
        wobble = 1.0 + fake.epoch_jitter * math.sin(3 * epoch + fake.noise_seed)
        val_loss = fake.loss(epoch * fake.steps_per_epoch) + 0.1
        lines.append(
            {
                "kind": "eval",
                "step": epoch * fake.steps_per_epoch,
                "epoch": epoch,
                "tokens": epoch * tokens,
                "val_loss": val_loss,
                "val_ppl": math.exp(val_loss),
                "eval_time_s": 1.0,
            }
        )
        epochs.append(
            {
                "epoch": epoch,
                "steps": fake.steps_per_epoch,
                "tokens": tokens,
                "loss_mean": _mean_after_warmup(dict(zip(steps, losses))),
                "grad_norm_mean": fake.grad_norm * wobble,
                "time_s": tokens / (fake.tokens_per_s * wobble),
                "tokens_per_s": fake.tokens_per_s * wobble,
                "tokens_per_s_per_device": fake.tokens_per_s * wobble / fake.world_size,
                "samples_per_s": fake.tokens_per_s / 128,
                "peak_mem_allocated_mib_max": fake.peak_alloc_mib,
                "peak_mem_allocated_mib_mean": alloc_mean,
                "peak_mem_reserved_mib_max": fake.peak_reserved_mib,
                "peak_mem_reserved_mib_mean": fake.peak_reserved_mib,
                "val_loss": val_loss,
                "val_ppl": math.exp(val_loss),
            }
        )
    steps = fake.epochs * fake.steps_per_epoch
    train_time = steps * step_time
    summary = {
        "run_name": f"{fake.strategy}-{fake.world_size}x-{fake.precision}",
        "experiment": fake.experiment,
        "strategy": fake.strategy,
        "requested_strategy": fake.strategy,
        "world_size": fake.world_size,
        "num_machines": 1,
        "precision": fake.precision,
        "requested_precision": fake.precision,
        "device_type": "cuda",
        "device_name": "Tesla T4",
        "peak_flops_per_device": 65e12,
        "peak_flops_source": "table",
        "preset": "tiny",
        "n_params": 1_000_000,
        "n_params_non_embedding": 800_000,
        "seed": fake.seed,
        "data_key": fake.data_key,
        "block_size": 128,
        "micro_batch_size": 4,
        "grad_accum_steps": fake.global_batch_tokens // (4 * 128 * fake.world_size),
        "global_batch_tokens": fake.global_batch_tokens,
        "steps": steps,
        "tokens_trained": steps * fake.global_batch_tokens,
        "complete": fake.complete,
        "epochs": epochs,
        "total": {
            "train_time_s": train_time,
            "eval_time_s": float(fake.epochs),
            "checkpoint_time_s": 0.5,
            "wall_time_s": train_time + fake.epochs + 0.5,
            "warmup_time_s": 3 * step_time,
            "tokens_per_s": fake.tokens_per_s,
            "tokens_per_s_per_device": fake.tokens_per_s / fake.world_size,
            "tokens_per_s_excl_warmup": fake.tokens_per_s * 1.01,
            "tokens_per_s_per_device_excl_warmup": fake.tokens_per_s * 1.01 / fake.world_size,
            "samples_per_s": fake.tokens_per_s / 128,
            "step_time_s_mean": step_time,
            "step_time_s_p50": step_time,
            "step_time_s_p90": step_time * 1.1,
            "loss_mean": _mean_after_warmup({s: fake.loss(s) for s in range(1, steps + 1)}),
            "final_loss": fake.loss(steps),
            "grad_norm_mean": fake.grad_norm,
            "mfu": fake.mfu,
            "peak_mem_allocated_mib_max": fake.peak_alloc_mib,
            "peak_mem_allocated_mib_mean": alloc_mean,
            "peak_mem_reserved_mib_max": fake.peak_reserved_mib,
            "peak_mem_reserved_mib_mean": fake.peak_reserved_mib,
            "final_val_loss": epochs[-1]["val_loss"],
            "final_val_ppl": epochs[-1]["val_ppl"],
        },
        "step_times_s": [step_time * (1.0 + 0.05 * math.sin(i)) for i in range(steps)],
    }
    config = {
        "preset": "tiny",
        "optim": {"global_batch_tokens": fake.global_batch_tokens, "micro_batch_size": 4},
        "run": {"seed": fake.seed, "output_dir": str(directory), "perf_warmup_steps": WARMUP_STEPS},
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    (directory / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (directory / "summary.json").write_text(json.dumps(summary, indent=2))
    return directory


def three_strategies(root: Path, **overrides: dict) -> list[Path]:
    """single, ddp, fsdp with the reference's ordering of costs: fsdp least memory, ddp fastest."""
    fakes = {
        "single": FakeRun("single", 1, tokens_per_s=40_000, peak_alloc_mib=3000, peak_reserved_mib=3500, noise_seed=1),
        "ddp": FakeRun(
            "ddp",
            2,
            tokens_per_s=72_000,
            peak_alloc_mib=3100,
            peak_reserved_mib=3600,
            peak_alloc_mean_mib=3050,
            noise_seed=2,
        ),
        "fsdp": FakeRun(
            "fsdp",
            2,
            tokens_per_s=60_000,
            peak_alloc_mib=1800,
            peak_reserved_mib=2200,
            peak_alloc_mean_mib=1700,
            noise_seed=3,
        ),
    }
    for name, changes in overrides.items():
        for key, value in changes.items():
            setattr(fakes[name], key, value)
    return [write_run(root / name, fake) for name, fake in fakes.items()]


def write_launch_configs(tmp_path: Path) -> Path:
    """Launch configs like the project's (one process for single, two for ddp and fsdp), in tmp_path/configs."""
    folder = tmp_path / "configs"
    folder.mkdir()
    for name, processes in (("single_gpu", 1), ("ddp", 2), ("fsdp", 2)):
        (folder / f"{name}.yaml").write_text(f"distributed_type: X\nnum_processes: {processes}\n")
    return folder


SAMPLE_RUNS = Path(__file__).resolve().parents[1] / "docs" / "sample_report" / "runs"


def scaled_sample_runs(
    root: Path, repeats: int, seed: int = 0, strategies: tuple[str, ...] = ("single", "ddp", "fsdp")
) -> list[Path]:
    """docs/sample_report's real runs copied `repeats` times, each copy's times scaled by 0.98-1.03 (drawn from
    `seed`): ddp about 1.8x single's throughput with about 2% spread between repeats, and the step peak bytes
    as every repeat of a run measures them. Folders root/<strategy>-r<k>."""
    rng = np.random.default_rng(seed)
    made = []
    for strategy in strategies:
        for k in range(1, repeats + 1):
            made.append(_scaled_copy(SAMPLE_RUNS / strategy, root / f"{strategy}-r{k}", float(rng.uniform(0.98, 1.03))))
    return made


def _scaled_copy(source: Path, target: Path, factor: float) -> Path:
    """A run folder whose every time is `factor` times the source's (and every rate 1 / factor)."""
    target.mkdir(parents=True)
    (target / "config.json").write_text((source / "config.json").read_text())
    summary = json.loads((source / "summary.json").read_text())
    for figures in [summary["total"], *summary["epochs"]]:
        for key, value in figures.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool) or key in ("epoch", "steps", "tokens"):
                continue
            if key.startswith(("tokens_per_s", "samples_per_s")):
                figures[key] = value / factor
            elif key.endswith("time_s") or key.startswith("step_time_s"):
                figures[key] = value * factor
    summary["step_times_s"] = [t * factor for t in summary["step_times_s"]]
    (target / "summary.json").write_text(json.dumps(summary))
    lines = [json.loads(line) for line in (source / "metrics.jsonl").read_text().splitlines() if line.strip()]
    for line in lines:
        if isinstance(line.get("elapsed_s"), (int, float)):
            line["elapsed_s"] *= factor
    (target / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return target
