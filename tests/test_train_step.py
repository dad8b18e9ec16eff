"""The optimizer step and its metrics, in one process on CPU (no data pipeline involved)."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator

import pytest
import torch
from accelerate import Accelerator

from model import GPT2, GPT2Config
from training.batching import EpochOrderSampler
from training.config import OptimConfig, RunError
from training.geometry import BatchGeometry, batch_geometry
from training.records.metrics import MetricsTracker, ThroughputFacts
from training.step import lr_factor, train_step


@pytest.fixture(scope="module")
def accelerator() -> Accelerator:
    return Accelerator(cpu=True)


def _tiny_model(seed: int = 0) -> GPT2:
    torch.manual_seed(seed)
    return GPT2(GPT2Config.from_preset("tiny"))


def _batch(batch_size: int, seq_len: int = 32, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    block = torch.randint(0, 50257, (batch_size, seq_len + 1), generator=g)
    return {"input_ids": block[:, :-1], "labels": block[:, 1:]}


def _split(batch: dict[str, torch.Tensor], parts: int) -> list[dict[str, torch.Tensor]]:
    return [dict(zip(batch, chunk)) for chunk in zip(*(t.chunk(parts) for t in batch.values()))]


def _tracker(accelerator: Accelerator, tokens_per_step: int = 1) -> MetricsTracker:
    facts = ThroughputFacts(tokens_per_step, 1, 1, flops_per_token=1.0, peak_flops_per_device=1.0)
    return MetricsTracker(accelerator, facts, perf_warmup_steps=0)


def test_loss_falls_when_one_batch_repeats(accelerator: Accelerator) -> None:
    accelerator.gradient_accumulation_steps = 1
    model = _tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    tracker = _tracker(accelerator)
    batch = _batch(8)
    for step in range(1, 51):
        result = train_step(accelerator, model, optimizer, None, [batch], tracker, grad_clip=1.0)
        tracker.end_step(step, 1, step, result.grad_norm, 3e-3, 0.1)
    losses = [r.loss for r in tracker.flush()]
    assert losses[0] == pytest.approx(math.log(50257), rel=0.05)  # an untrained model is near uniform
    assert losses[-1] < 0.5 * losses[0]
    assert losses[-1] < min(losses[:10])


def test_grad_norm_is_the_global_norm_before_clipping(accelerator: Accelerator) -> None:
    accelerator.gradient_accumulation_steps = 1
    model = _tiny_model()
    reference = copy.deepcopy(model)
    batch = _batch(4)
    _, loss = reference(batch["input_ids"], batch["labels"])
    loss.backward()
    expected = math.sqrt(sum(p.grad.double().pow(2).sum().item() for p in reference.parameters()))

    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    model, optimizer = accelerator.prepare(model, optimizer)
    # A threshold far below the norm: the returned value must still be the norm before clipping.
    result = train_step(accelerator, model, optimizer, None, [batch], None, grad_clip=1e-3)
    assert not result.skipped
    assert result.grad_norm.item() == pytest.approx(expected, rel=1e-5)
    assert expected > 1e-2


def _one_sgd_step(accelerator: Accelerator, micro_batches: list[dict[str, torch.Tensor]]) -> tuple[float, GPT2]:
    accelerator.gradient_accumulation_steps = len(micro_batches)
    # accelerate counts micro-batches across calls and steps the optimizer when the count reaches a multiple of
    # the accumulation steps; train.py's optimizer steps always start from such a multiple, so this one does too
    # (without it the result depended on which tests ran before on this accelerator).
    accelerator.step = 0
    model = _tiny_model()
    # SGD with lr 1 and no clipping: new weights = old weights - accumulated gradient.
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    model, optimizer = accelerator.prepare(model, optimizer)
    tracker = _tracker(accelerator)
    result = train_step(accelerator, model, optimizer, None, micro_batches, tracker, grad_clip=0.0)
    tracker.end_step(1, 1, 1, result.grad_norm, 1.0, 0.1)
    (record,) = tracker.flush()
    return record.loss, model


def test_gradient_accumulation_matches_one_large_batch(accelerator: Accelerator) -> None:
    batch = _batch(8)
    loss_whole, model_whole = _one_sgd_step(accelerator, [batch])
    loss_accum, model_accum = _one_sgd_step(accelerator, _split(batch, 4))
    assert loss_accum == pytest.approx(loss_whole, rel=1e-6)
    initial = _tiny_model().state_dict()
    whole, accum = model_whole.state_dict(), model_accum.state_dict()
    for name, before in initial.items():
        grad_whole, grad_accum = before - whole[name], before - accum[name]
        torch.testing.assert_close(grad_accum, grad_whole, rtol=1e-4, atol=1e-7, msg=name)
    assert any((before - whole[n]).abs().max() > 0 for n, before in initial.items())


def test_tokens_per_s_is_tokens_over_the_interval_time(accelerator: Accelerator) -> None:
    tracker = _tracker(accelerator, tokens_per_step=1024)
    step_times = [0.5, 0.25, 0.25]
    for step, seconds in enumerate(step_times, start=1):
        tracker.add_micro_batch(torch.tensor(2.0), 1024)
        tracker.end_step(step, 1, step * 1024, torch.tensor(1.0), 1e-3, seconds)
    line = tracker.interval_line(tracker.flush(), elapsed_s=1.0)
    assert line.tokens_per_s == pytest.approx(3 * 1024 / 1.0)
    assert line.step_time_s == pytest.approx(1.0 / 3)
    assert line.loss == pytest.approx(2.0)


def test_learning_rate_warms_up_linearly_then_decays_to_the_floor() -> None:
    factors = [lr_factor(s, warmup_steps=4, total_steps=20, min_ratio=0.1) for s in range(21)]
    assert factors[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert factors[4] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(factors[4:], factors[5:]))
    assert factors[20] == pytest.approx(0.1)


def test_global_batch_derives_accumulation_and_rejects_a_remainder() -> None:
    optim = OptimConfig(micro_batch_size=8, global_batch_tokens=16 * 64)
    assert batch_geometry(optim, block_size=64, world_size=1) == BatchGeometry(8, 2, 1, 64)
    assert batch_geometry(optim, block_size=64, world_size=2) == BatchGeometry(8, 1, 2, 64)
    with pytest.raises(RunError, match="not a multiple"):
        batch_geometry(OptimConfig(micro_batch_size=8, global_batch_tokens=24 * 64), block_size=64, world_size=2)


def test_data_order_depends_only_on_seed_and_epoch() -> None:
    a = list(EpochOrderSampler(100, 96, seed=7))
    b = list(EpochOrderSampler(100, 96, seed=7))
    other_epoch = EpochOrderSampler(100, 96, seed=7)
    other_epoch.use_epoch(2)
    assert a == b and len(a) == 96 and len(set(a)) == 96
    assert list(other_epoch) != a
    assert list(EpochOrderSampler(100, 96, seed=8)) != a


@pytest.fixture
def fp16_accelerator() -> Iterator[Accelerator]:
    """An fp16 Accelerator in a fresh accelerate state (it is a process-wide singleton), reset again after, set up
    by the project's GPT2S_CPU_FP16 path: autocast float16 and accelerate's own GradScaler, as on a GPU."""
    from accelerate.state import AcceleratorState

    from training.distributed.strategy import _enable_fp16_on_cpu

    AcceleratorState._reset_state(reset_partial_state=True)
    accelerator = Accelerator(cpu=True, mixed_precision="fp16")
    _enable_fp16_on_cpu(accelerator)
    accelerator.gradient_accumulation_steps = 1
    yield accelerator
    AcceleratorState._reset_state(reset_partial_state=True)


# fused: AdamW's fused kernel, the GPU's default (training/distributed/speed_levers.py), which GradScaler.step always calls and
# which skips inside itself; foreach: PyTorch's default, which GradScaler.step leaves uncalled on an overflow.
ADAMW_KINDS = pytest.mark.parametrize("fused", [True, False], ids=["fused", "foreach"])


@ADAMW_KINDS
def test_a_step_the_fp16_grad_scaler_skips_holds_the_schedule_and_is_counted(
    fp16_accelerator: Accelerator, fused: bool
) -> None:
    # A gradient hook injects the inf that an fp16 overflow produces.
    from training.step import make_optimizer

    accelerator = fp16_accelerator
    model = _tiny_model()
    optimizer = make_optimizer(model, OptimConfig(lr=1e-3), fused=fused)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, 4, 10, 0.1))
    model, optimizer = accelerator.prepare(model, optimizer)
    tracker = MetricsTracker(accelerator, ThroughputFacts(32, 1, 1, 1.0, 1.0), perf_warmup_steps=0)
    overflow = {"on": False}
    model.transformer.wte.weight.register_hook(lambda g: g * float("inf") if overflow["on"] else g)

    lrs, skipped = [], []
    for step, overflows in enumerate([False, True, False], start=1):
        overflow["on"] = overflows
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        lrs.append(scheduler.get_last_lr()[0])
        result = train_step(accelerator, model, optimizer, scheduler, [_batch(2, seed=step)], tracker, grad_clip=1.0)
        tracker.end_step(step, 1, step * 32, result.grad_norm, lrs[-1], 0.1, result.skipped)
        skipped.append(result.skipped)
        moved = any(not torch.equal(before[n], p) for n, p in model.named_parameters())
        assert moved != overflows, f"step {step}: weights moved={moved}"
    assert skipped == [False, True, False]
    # Step 3 runs at the learning rate step 2 would have had: the skipped step did not advance the schedule.
    assert lrs == pytest.approx([1e-3 * 0.25, 1e-3 * 0.5, 1e-3 * 0.5])

    from training.records.metrics import step_means

    line = tracker.interval_line(tracker.flush(), elapsed_s=0.3)
    assert (line.skipped_steps, line.skipped_steps_interval) == (1, 1)
    means = step_means(tracker, tracker.records)
    assert means.skipped_steps == 1 and means.grad_norm_nonfinite_steps == 1
    finite = [r.grad_norm for r in tracker.records if math.isfinite(r.grad_norm)]
    assert len(finite) == 2 and means.grad_norm_mean == pytest.approx(sum(finite) / 2)


@ADAMW_KINDS
@pytest.mark.parametrize(("scale", "real_overflow"), [(2.0, False), (1.0, True)])
def test_a_skip_at_the_minimum_loss_scale_is_a_real_overflow(
    fp16_accelerator: Accelerator, fused: bool, scale: float, real_overflow: bool
) -> None:
    """At scale 2 the scaler may still find a scale that fits; at 1 the gradients overflow fp16 unscaled."""
    from training.step import MIN_LOSS_SCALE, make_optimizer

    accelerator = fp16_accelerator
    # The scale a run has backed off to, as a resume loads it (training/checkpoints/store.py).
    accelerator.scaler.load_state_dict({**accelerator.scaler.state_dict(), "scale": scale})
    model = accelerator.prepare(_tiny_model())
    optimizer = accelerator.prepare(make_optimizer(model, OptimConfig(lr=1e-3), fused=fused))
    model.transformer.wte.weight.register_hook(lambda g: g * float("inf"))
    result = train_step(accelerator, model, optimizer, None, [_batch(2)], None, grad_clip=1.0)
    assert result.skipped and result.skipped_unscaled is real_overflow
    assert accelerator.scaler.get_scale() == scale / 2 and MIN_LOSS_SCALE == 1.0


def test_grad_norm_copies_nothing_from_the_host() -> None:
    # On a GPU a blocking host-to-device copy inside the step waits for the backward: a host sync. The
    # meta device stands in for the GPU here; any copy from the CPU to it shows up as a device change.
    from torch.utils._python_dispatch import TorchDispatchMode

    from training.step import global_grad_norm

    class CrossDeviceCopies(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.copies: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = kwargs or {}
            devices = {a.device.type for a in args if isinstance(a, torch.Tensor)}
            target = kwargs.get("device")
            if target is not None and {torch.device(target).type} != devices:
                self.copies.append(str(func))
            return func(*args, **kwargs)

    params = [torch.nn.Parameter(torch.ones(3, 4, device="meta")) for _ in range(3)]
    for p in params:
        p.grad = torch.ones_like(p)
    with CrossDeviceCopies() as mode:
        norm = global_grad_norm(params)
    assert norm.device.type == "meta" and mode.copies == []
