"""The five metrics: loss, grad norm, peak memory, time, throughput (and MFU).

Each step's loss and grad norm stay on the device until the log interval; then one reduction across
ranks and one host transfer turn them into numbers. That is not the only host synchronization: every
step also all-reduces its health (training.step.step_health) and synchronizes the device for the
step clock (training.loop). What this writes are records of the run schema: training/records/schema.py
declares each figure (key with its unit, aggregation, direction), training/records/record.py builds the records.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass

import torch
from accelerate import Accelerator

from training.records.memory import peak_memory_mib
from training.records.record import EpochFigures, EvalLine, RunTotals, TrainLine
from training.records.steady_mean import steady_mean


@dataclass
class StepRecord:
    """One optimizer step, on the host, after a flush."""

    step: int
    epoch: int
    tokens: int  # cumulative, whole job
    loss: float
    grad_norm: float
    lr: float
    step_time_s: float
    warmup: bool
    skipped: bool = False  # the fp16 grad scaler found inf/nan gradients and skipped the optimizer step


@dataclass(frozen=True)
class _PendingStep:
    """A finished step whose loss and grad norm are still on the device (until the next flush)."""

    step: int
    epoch: int
    tokens: int
    loss_and_tokens: torch.Tensor  # this rank's (token-weighted loss sum, tokens)
    grad_norm: torch.Tensor  # already the global norm, on every rank
    lr: float
    step_time_s: float
    skipped: bool


@dataclass
class ThroughputFacts:
    """Constants that turn times into throughput and MFU."""

    tokens_per_step: int  # global batch in tokens
    samples_per_step: int  # global batch in sequences
    world_size: int
    flops_per_token: float
    peak_flops_per_device: float


@dataclass
class EpochMemory:
    allocated_max: float = 0.0
    allocated_mean: float = 0.0
    reserved_max: float = 0.0
    reserved_mean: float = 0.0


class MetricsTracker:
    """Accumulates a step's loss on the device; flushes intervals of steps to host records."""

    def __init__(self, accelerator: Accelerator, facts: ThroughputFacts, perf_warmup_steps: int) -> None:
        self.accelerator = accelerator
        self.facts = facts
        self.perf_warmup_steps = perf_warmup_steps
        device = accelerator.device
        self._step_loss_sum = torch.zeros((), device=device, dtype=torch.float64)
        self._step_tokens = torch.zeros((), device=device, dtype=torch.float64)
        self._pending: list[_PendingStep] = []
        self.records: list[StepRecord] = []
        self._logged = 0  # how many of `records` a metrics line has covered
        self.memory = EpochMemory()

    @property
    def step_loss_sum(self) -> torch.Tensor:
        """This rank's token-weighted loss sum of the step in progress (on the device)."""
        return self._step_loss_sum

    def add_micro_batch(self, mean_loss: torch.Tensor, num_tokens: int) -> None:
        """A micro-step's mean token loss; weighted by its tokens so the step loss is token-weighted."""
        self._step_loss_sum += mean_loss.detach().double() * num_tokens
        self._step_tokens += num_tokens

    def end_step(
        self,
        step: int,
        epoch: int,
        tokens: int,
        grad_norm: torch.Tensor,
        lr: float,
        step_time_s: float,
        skipped: bool = False,
    ) -> None:
        local = torch.stack([self._step_loss_sum, self._step_tokens])
        self._pending.append(
            _PendingStep(step, epoch, tokens, local, grad_norm.detach().double().reshape(()), lr, step_time_s, skipped)
        )
        self._step_loss_sum = torch.zeros_like(self._step_loss_sum)
        self._step_tokens = torch.zeros_like(self._step_tokens)

    def flush(self) -> list[StepRecord]:
        """The steps since the last flush, as records of a metrics line: the pending ones reduced over ranks (one
        collective) and moved to the host, after those a checkpoint settled before."""
        self.settle()
        new = self.records[self._logged :]
        if not new:
            return []
        self._logged = len(self.records)
        self._read_memory()
        return new

    @property
    def unlogged(self) -> int:
        """How many of the newest records no metrics line has covered yet."""
        return len(self.records) - self._logged

    def restore(self, records: list[StepRecord], unlogged: int) -> None:
        """The records a checkpoint held; the newest `unlogged` of them go into the next metrics line."""
        if not 0 <= unlogged <= len(records):  # a hand-edited or foreign train state: refused, not misread
            raise ValueError(f"a checkpoint's train state says {unlogged} of its {len(records)} step records unlogged")
        self.records = list(records)
        self._logged = len(self.records) - unlogged

    def settle(self) -> None:
        """Move the pending steps to host records (one collective) without logging them: a checkpoint between two
        metrics lines must hold every step it has trained."""
        if not self._pending:
            return
        local = torch.stack([p.loss_and_tokens for p in self._pending])  # (n_steps, 2): loss*tokens, tokens
        grad_norms = torch.stack([p.grad_norm for p in self._pending])
        summed = self.accelerator.reduce(local, reduction="sum")
        losses = (summed[:, 0] / summed[:, 1]).tolist()
        norms = grad_norms.tolist()  # already the global norm on every rank
        new = [
            StepRecord(
                step=p.step,
                epoch=p.epoch,
                tokens=p.tokens,
                loss=loss,
                grad_norm=norm,
                lr=p.lr,
                step_time_s=p.step_time_s,
                warmup=p.step <= self.perf_warmup_steps,
                skipped=p.skipped,
            )
            for p, loss, norm in zip(self._pending, losses, norms, strict=True)
        ]
        self._pending.clear()
        self.records.extend(new)

    def _read_memory(self) -> None:
        allocated, reserved = peak_memory_mib(self.accelerator.device)
        local = torch.tensor([allocated, reserved], device=self.accelerator.device, dtype=torch.float64)
        every_rank = self.accelerator.gather(local.unsqueeze(0)).reshape(-1, 2)
        self.memory = EpochMemory(
            allocated_max=every_rank[:, 0].max().item(),
            allocated_mean=every_rank[:, 0].mean().item(),
            reserved_max=every_rank[:, 1].max().item(),
            reserved_mean=every_rank[:, 1].mean().item(),
        )

    def interval_line(self, new: list[StepRecord], elapsed_s: float) -> TrainLine:
        """The metrics.jsonl train line for an interval of steps (the last step's values + rates)."""
        last, m = new[-1], self.memory
        interval_time = sum(r.step_time_s for r in new)
        rates = self.rates(len(new), interval_time)
        return TrainLine(
            step=last.step,
            epoch=last.epoch,
            tokens=last.tokens,
            loss=last.loss,
            loss_interval=statistics.fmean(r.loss for r in new),
            grad_norm=last.grad_norm,
            lr=last.lr,
            step_time_s=interval_time / len(new),
            **asdict(rates),
            peak_mem_allocated_mib=m.allocated_max,
            peak_mem_reserved_mib=m.reserved_max,
            peak_mem_allocated_mib_mean=m.allocated_mean,
            peak_mem_reserved_mib_mean=m.reserved_mean,
            elapsed_s=elapsed_s,
            warmup=any(r.warmup for r in new),
            skipped_steps_interval=sum(r.skipped for r in new),
            skipped_steps=sum(r.skipped for r in self.records),
        )

    def rates(self, steps: int, seconds: float) -> Rates:
        """Throughput and MFU of `steps` optimizer steps that took `seconds` in all."""
        f = self.facts
        if seconds <= 0:
            nan = float("nan")
            return Rates(nan, nan, nan, nan)
        tokens_per_s = steps * f.tokens_per_step / seconds
        per_device = tokens_per_s / f.world_size
        return Rates(
            tokens_per_s=tokens_per_s,
            tokens_per_s_per_device=per_device,
            samples_per_s=steps * f.samples_per_step / seconds,
            mfu=per_device * f.flops_per_token / f.peak_flops_per_device,
        )


@dataclass(frozen=True)
class Rates:
    """Throughput and MFU of some optimizer steps, named as the schema names them (all NaN for no time)."""

    tokens_per_s: float
    tokens_per_s_per_device: float
    samples_per_s: float
    mfu: float


def eval_line(step: int, epoch: int, tokens: int, val_loss: float, seconds: float) -> EvalLine:
    """The metrics.jsonl eval line of a validation that took `seconds`; NaN loss when it had no blocks."""
    return EvalLine(
        step=step,
        epoch=epoch,
        tokens=tokens,
        val_loss=val_loss,
        val_ppl=math.exp(min(val_loss, 700.0)),  # capped: exp overflows a float past 709
        eval_time_s=seconds,
    )


@dataclass(frozen=True)
class StepMeans:
    """Mean loss and grad norm of some steps, how many non-finite steps each left out, and skipped steps."""

    loss_mean: float
    loss_nonfinite_steps: int
    grad_norm_mean: float
    grad_norm_nonfinite_steps: int
    skipped_steps: int


def step_means(tracker: MetricsTracker, records: list[StepRecord]) -> StepMeans:
    """Mean loss and grad norm of `records`, how many non-finite steps each left out, and skipped steps;
    each mean is the run's one definition of a per-step mean (training.records.steady_mean.steady_mean)."""
    loss = steady_mean(((r.step, r.loss) for r in records), tracker.perf_warmup_steps)
    norm = steady_mean(((r.step, r.grad_norm) for r in records), tracker.perf_warmup_steps)
    return StepMeans(
        loss_mean=loss.value,
        loss_nonfinite_steps=loss.nonfinite_left_out,
        grad_norm_mean=norm.value,
        grad_norm_nonfinite_steps=norm.nonfinite_left_out,
        skipped_steps=sum(r.skipped for r in records),
    )


def epoch_summary(tracker: MetricsTracker, epoch: int, val: EvalLine | None, partial: bool) -> EpochFigures:
    """Figures of one epoch; `partial`: the step budget ended before the epoch did."""
    records = [r for r in tracker.records if r.epoch == epoch]
    seconds = sum(r.step_time_s for r in records)
    rates, m = tracker.rates(len(records), seconds), tracker.memory
    return EpochFigures(
        epoch=epoch,
        partial=partial,
        steps=len(records),
        tokens=len(records) * tracker.facts.tokens_per_step,
        **asdict(step_means(tracker, records)),
        time_s=seconds,
        tokens_per_s=rates.tokens_per_s,
        tokens_per_s_per_device=rates.tokens_per_s_per_device,
        samples_per_s=rates.samples_per_s,
        peak_mem_allocated_mib_max=m.allocated_max,
        peak_mem_allocated_mib_mean=m.allocated_mean,
        peak_mem_reserved_mib_max=m.reserved_max,
        peak_mem_reserved_mib_mean=m.reserved_mean,
        val_loss=None if val is None else val.val_loss,
        val_ppl=None if val is None else val.val_ppl,
    )


@dataclass
class RunTimes:
    """Seconds spent in each phase, from perf_counter differences after a device sync."""

    train_s: float = 0.0
    eval_s: float = 0.0
    checkpoint_s: float = 0.0


def total_summary(
    tracker: MetricsTracker,
    epochs: list[EpochFigures],
    times: RunTimes,
    wall_time_s: float,
    final_val: EvalLine | None,
    open_epoch: bool,
) -> RunTotals:
    """Whole-run figures; `open_epoch`: the run stopped inside an epoch that has no epoch summary yet."""
    records = tracker.records
    step_times = [r.step_time_s for r in records]
    steady = [r for r in records if not r.warmup]
    whole = tracker.rates(len(records), sum(step_times))
    excl = tracker.rates(len(steady), sum(r.step_time_s for r in steady)) if steady else whole
    quantiles = statistics.quantiles(step_times, n=10) if len(step_times) >= 2 else step_times * 9 or [math.nan] * 9
    memory = _run_memory(tracker, epochs, open_epoch)
    return RunTotals(
        train_time_s=times.train_s,
        eval_time_s=times.eval_s,
        checkpoint_time_s=times.checkpoint_s,
        wall_time_s=wall_time_s,
        warmup_time_s=sum(r.step_time_s for r in records if r.warmup),
        tokens_per_s=whole.tokens_per_s,
        tokens_per_s_per_device=whole.tokens_per_s_per_device,
        tokens_per_s_excl_warmup=excl.tokens_per_s,
        tokens_per_s_per_device_excl_warmup=excl.tokens_per_s_per_device,
        samples_per_s=whole.samples_per_s,
        step_time_s_mean=statistics.fmean(step_times) if step_times else float("nan"),
        step_time_s_p50=statistics.median(step_times) if step_times else float("nan"),
        step_time_s_p90=quantiles[8],
        **asdict(step_means(tracker, records)),
        final_loss=records[-1].loss if records else float("nan"),
        mfu=excl.mfu,
        peak_mem_allocated_mib_max=memory.allocated_max,
        peak_mem_allocated_mib_mean=memory.allocated_mean,
        peak_mem_reserved_mib_max=memory.reserved_max,
        peak_mem_reserved_mib_mean=memory.reserved_mean,
        final_val_loss=None if final_val is None else final_val.val_loss,
        final_val_ppl=None if final_val is None else final_val.val_ppl,
    )


def _run_memory(tracker: MetricsTracker, epochs: list[EpochFigures], open_epoch: bool) -> EpochMemory:
    """The run's peaks: max over the epochs of their max over ranks, mean over the epochs of their rank mean.
    An epoch still open has no summary yet; its readings count too."""
    readings = [
        EpochMemory(
            e.peak_mem_allocated_mib_max,
            e.peak_mem_allocated_mib_mean,
            e.peak_mem_reserved_mib_max,
            e.peak_mem_reserved_mib_mean,
        )
        for e in epochs
    ]
    if open_epoch:
        readings.append(tracker.memory)
    if not readings:
        nan = float("nan")
        return EpochMemory(nan, nan, nan, nan)
    return EpochMemory(
        allocated_max=max(r.allocated_max for r in readings),
        allocated_mean=statistics.fmean(r.allocated_mean for r in readings),
        reserved_max=max(r.reserved_max for r in readings),
        reserved_mean=statistics.fmean(r.reserved_mean for r in readings),
    )
