"""What the loop does after a step (training.loop.decide), from hand-made states: no model, no processes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from training.loop import Actions, Cadence, LoopState, Stop, decide

# Log every 5 steps, validate every 4, checkpoint every 6, stop after 3 non-finite steps in a row;
# epochs of 10 steps, a schedule of 30 that this launch runs to the end.
CADENCE = Cadence(
    log_interval=5,
    eval_interval=4,
    checkpoint_interval=6,
    max_nonfinite_steps=3,
    steps_per_epoch=10,
    stop_at=30,
    total_steps=30,
)


def state(
    step: int,
    steps_in_epoch: int | None = None,
    nonfinite: bool = False,
    nonfinite_since: int | None = None,
    signal: int = 0,
    cadence: Cadence = CADENCE,
) -> LoopState:
    if steps_in_epoch is None:
        steps_in_epoch = (step - 1) % cadence.steps_per_epoch + 1
    return LoopState(cadence, step, steps_in_epoch, nonfinite, nonfinite_since, signal)


NOTHING = Actions(
    log=False, evaluate=False, close_epoch=False, checkpoint=False, write_summary=False, nonfinite_since=None, stop=None
)


def test_an_ordinary_step_does_nothing() -> None:
    actions = decide(state(1))
    assert actions == NOTHING and not actions.pauses


def test_log_interval_logs_without_pausing() -> None:
    actions = decide(state(5))
    assert actions == replace(NOTHING, log=True) and not actions.pauses


def test_eval_interval_validates_inside_an_epoch() -> None:
    actions = decide(state(8))
    assert actions == replace(NOTHING, evaluate=True) and actions.pauses


def test_no_interval_validation_at_an_epoch_end_which_validates_anyway() -> None:
    # Step 20 is an eval step (20 % 4 == 0) and closes epoch 2: one validation, the epoch's.
    actions = decide(state(20))
    assert actions == replace(NOTHING, log=True, close_epoch=True, write_summary=True) and actions.pauses


def test_epoch_end_logs_closes_the_epoch_and_writes_the_summary() -> None:
    cadence = replace(CADENCE, log_interval=7, eval_interval=0, checkpoint_interval=0)
    assert decide(state(10, cadence=cadence)) == replace(NOTHING, log=True, close_epoch=True, write_summary=True)


def test_no_interval_validation_when_the_final_one_follows() -> None:
    # The schedule ends at step 12, inside an epoch: 12 is an eval step, but the end validates.
    cadence = replace(CADENCE, stop_at=12, total_steps=12)
    actions = decide(state(12, cadence=cadence))
    assert actions == replace(NOTHING, log=True, checkpoint=True, write_summary=True)


def test_stopping_early_validates_at_the_eval_interval() -> None:
    # --stop_after_steps 12 of a 30-step schedule: no final validation follows, so the interval's runs.
    cadence = replace(CADENCE, stop_at=12)
    actions = decide(state(12, cadence=cadence))
    assert actions == replace(NOTHING, log=True, evaluate=True, checkpoint=True, write_summary=True)


def test_checkpoint_interval_checkpoints() -> None:
    actions = decide(state(6))
    assert actions == replace(NOTHING, checkpoint=True) and actions.pauses


def test_zero_intervals_mean_never() -> None:
    cadence = replace(CADENCE, eval_interval=0, checkpoint_interval=0)
    assert decide(state(24, cadence=cadence)) == NOTHING


def test_a_non_finite_step_is_logged_starts_a_streak_and_is_not_checkpointed() -> None:
    actions = decide(state(6, nonfinite=True))  # 6 is a checkpoint step
    assert actions == replace(NOTHING, log=True, nonfinite_since=6) and not actions.pauses


def test_the_streak_goes_on_and_a_finite_step_ends_it() -> None:
    assert decide(state(7, nonfinite=True, nonfinite_since=6)).nonfinite_since == 6
    after = decide(state(12, nonfinite_since=6))  # finite, and a checkpoint step
    assert after.nonfinite_since is None and after.checkpoint


def test_no_checkpoint_at_the_end_during_a_streak() -> None:
    actions = decide(state(30, nonfinite=True, nonfinite_since=29))
    assert not actions.checkpoint and actions.write_summary and actions.close_epoch and actions.stop is None


def test_divergence_after_max_nonfinite_steps() -> None:
    assert decide(state(7, nonfinite=True, nonfinite_since=6)).stop is None  # 2 in a row
    actions = decide(state(8, nonfinite=True, nonfinite_since=6))  # 3 in a row
    assert actions.stop is Stop.DIVERGED and not actions.checkpoint and actions.log


def test_no_divergence_limit_when_max_nonfinite_steps_is_zero() -> None:
    cadence = replace(CADENCE, max_nonfinite_steps=0)
    assert decide(state(29, nonfinite=True, nonfinite_since=1, cadence=cadence)).stop is None


def test_a_signal_logs_checkpoints_writes_the_summary_and_stops() -> None:
    actions = decide(state(3, signal=15))
    assert actions == replace(NOTHING, log=True, checkpoint=True, write_summary=True, stop=Stop.SIGNAL)


def test_a_signal_skips_the_interval_validation() -> None:
    actions = decide(state(4, signal=15))  # an eval step
    assert not actions.evaluate and actions.stop is Stop.SIGNAL


def test_a_signal_during_a_streak_stops_without_a_checkpoint() -> None:
    actions = decide(state(7, nonfinite=True, nonfinite_since=7, signal=2))
    assert actions.stop is Stop.SIGNAL and not actions.checkpoint


def test_divergence_is_reported_before_a_signal() -> None:
    assert decide(state(8, nonfinite=True, nonfinite_since=6, signal=15)).stop is Stop.DIVERGED


@pytest.mark.parametrize("step", range(1, 31))
def test_every_step_of_a_run_is_decided_without_error(step: int) -> None:
    actions = decide(state(step))
    assert actions.close_epoch == (step % 10 == 0)
    assert actions.write_summary == (step % 10 == 0)
    assert actions.checkpoint == (step % 6 == 0 or step == 30)
