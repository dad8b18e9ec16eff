"""Whether a checkpoint can continue exactly under this launch: what must match, and the refusal when not.

A checkpoint resumes under any strategy and process count (training/checkpoints/store.py), but the continued
steps equal the uninterrupted run's only when what shapes them is the same: the model, the global batch
in tokens, the data (corpus, tokenizer, block size and split, as the data cache's content hash says), the
seed (it orders the data), the precision, and the optimisation (AdamW's settings, the clipping, the
learning-rate schedule). Each checkpoint's origin.json records these and who wrote it; `refusal` compares
them with this launch's before anything is loaded or written, and names what differs.

The one change a resume accepts is a longer schedule (a larger --max_steps: train on): `schedule_change`
says from which step the learning rate differs, in a warning line and in the run record. Without these
checks the checkpoint's optimizer and scheduler state would silently replace a new --lr, while the
schedule would silently follow a new --warmup_steps or --max_steps.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from training.checkpoints.store import (
    CHECKPOINTS_DIR,
    ROLLBACK_FILE,
    ROLLED_BACK_SUFFIX,
    aside_name,
    checkpoint_folders,
    checkpoint_problem,
    checkpoint_step,
    complete_checkpoints,
    earlier_layout_error,
    read_origin,
    set_aside,
    step_of_name,
)
from training.config import RunError
from training.durable import sync_folder, write_atomic
from training.records.record import ResumedFromRecord

if TYPE_CHECKING:
    import torch

    from training.config import OptimConfig

# Model config keys that change how, not what, the model computes: the attention kernel (a device may
# lack one) gives the same outputs to rounding.
_HOW_NOT_WHAT = frozenset({"attn_impl"})


@dataclass(frozen=True)
class Optimisation:
    """What shapes every update besides the model and the data: AdamW's settings, the clipping, the schedule."""

    lr: float  # the peak learning rate
    weight_decay: float
    beta1: float
    beta2: float
    eps: float
    grad_clip: float
    warmup_steps: int
    min_lr_ratio: float
    total_steps: int  # the schedule's length: --max_steps, or --epochs in steps

    @classmethod
    def of(cls, optim: OptimConfig, total_steps: int) -> Optimisation:
        return cls(
            lr=optim.lr,
            weight_decay=optim.weight_decay,
            beta1=optim.beta1,
            beta2=optim.beta2,
            eps=optim.eps,
            grad_clip=optim.grad_clip,
            warmup_steps=optim.warmup_steps,
            min_lr_ratio=optim.min_lr_ratio,
            total_steps=total_steps,
        )


# How a refusal names each setting that must not change, in the order a user would check them; the
# schedule's length is judged apart (a longer one is accepted).
_SETTING_NAMES = {
    "lr": "learning rate (--lr)",
    "weight_decay": "weight decay (--weight_decay)",
    "beta1": "AdamW beta1 (--beta1)",
    "beta2": "AdamW beta2 (--beta2)",
    "eps": "AdamW epsilon (--eps)",
    "grad_clip": "gradient clipping (--grad_clip)",
    "warmup_steps": "warm-up (--warmup_steps)",
    "min_lr_ratio": "minimum learning rate ratio (--min_lr_ratio)",
}


@dataclass(frozen=True)
class ResumeIdentity:
    """What a resumed launch must share with the one that wrote its checkpoint to continue it exactly."""

    model_config: dict[str, Any]  # model.GPT2Config.to_dict()
    global_batch_tokens: int
    seed: int  # seeds the data order
    data_key: str | None  # the packed data's content hash (corpus, tokenizer, block size, split)
    # Named in the refusal when the data differs; the content hash above decides.
    block_size: int
    tokenizer: str | None
    precision: str  # fp32 | fp16 | bf16, as in effect
    optimisation: Optimisation

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def origin_record(strategy: str, num_processes: int, identity: ResumeIdentity) -> dict[str, Any]:
    """What a checkpoint's origin.json says besides its format: who wrote it (its precision is the identity's),
    and what a resume must match."""
    return {"strategy": strategy, "num_processes": num_processes, **identity.to_dict()}


def refusal(checkpoint: Path, requested: ResumeIdentity) -> str | None:
    """The one-line reason this launch cannot continue `checkpoint` exactly, or None when it can."""
    origin = read_origin(checkpoint)
    if origin is None:
        return f"--resume: {earlier_layout_error(checkpoint)}"
    found = differences(origin, requested, checkpoint_step(checkpoint))
    if not found:
        return None
    return (
        f"--resume: {checkpoint.name} cannot be continued exactly by this launch: {'; '.join(found)}; resume "
        f"with the saved settings, or start a new run (--overwrite or another --output_dir)"
    )


def differences(saved: dict[str, Any], requested: ResumeIdentity, step: int) -> list[str]:
    """What differs, each as `what: saved value, requested value`, in the order a user would check them;
    `step` is the checkpoint's."""
    found = _model_differences(saved.get("model_config") or {}, requested.model_config)
    if saved.get("global_batch_tokens") != requested.global_batch_tokens:
        found.append(
            f"global batch {saved.get('global_batch_tokens')} tokens saved, {requested.global_batch_tokens} requested"
        )
    if saved.get("seed") != requested.seed:
        found.append(f"seed (it orders the data) {saved.get('seed')} saved, {requested.seed} requested")
    if saved.get("data_key") != requested.data_key:
        found.append(_data_difference(saved, requested))
    if saved.get("precision") != requested.precision:
        found.append(f"precision {saved.get('precision')} saved, {requested.precision} requested")
    return found + _optimisation_differences(saved.get("optimisation"), requested.optimisation, step)


def _optimisation_differences(saved: dict[str, Any] | None, requested: Optimisation, step: int) -> list[str]:
    if saved is None:  # written before checkpoints recorded it: resume_warnings says so
        return []
    found = [
        f"{name} {saved.get(key)} saved, {getattr(requested, key)} requested"
        for key, name in _SETTING_NAMES.items()
        if saved.get(key) != getattr(requested, key)
    ]
    saved_total = saved.get("total_steps")
    if saved_total is not None and requested.total_steps < saved_total:
        where = f"; the checkpoint is at step {step}" if requested.total_steps <= step else ""
        found.append(
            f"schedule length (--max_steps, or --epochs in steps) {saved_total} steps saved, "
            f"{requested.total_steps} requested{where} (a shorter schedule reshapes the learning rate: to stop "
            f"earlier, keep it and add --stop_after_steps)"
        )
    return found


def _model_differences(saved: dict[str, Any], requested: dict[str, Any]) -> list[str]:
    keys = sorted((saved.keys() | requested.keys()) - _HOW_NOT_WHAT)
    return [
        f"model {k} {saved.get(k)} saved, {requested.get(k)} requested"
        for k in keys
        if saved.get(k) != requested.get(k)
    ]


def _data_difference(saved: dict[str, Any], requested: ResumeIdentity) -> str:
    """The data differs (its content hash); named by the likely cause when the block size or tokenizer changed."""
    causes = [
        f"{name} {saved.get(key)} saved, {getattr(requested, key)} requested"
        for name, key in (("block size", "block_size"), ("tokenizer", "tokenizer"))
        if saved.get(key) != getattr(requested, key)
    ]
    hashes = f"content hash {str(saved.get('data_key'))[:12]} saved, {str(requested.data_key)[:12]} requested"
    return f"data ({', '.join([*causes, hashes])})" if causes else f"data: another corpus or split ({hashes})"


@dataclass(frozen=True)
class ScheduleChange:
    """A resume under a longer schedule: the learning rate differs from the saved schedule's from `from_step`."""

    saved_total_steps: int
    total_steps: int
    from_step: int  # the first step (counted from 1) whose learning rate differs
    saved_lr: float  # that step's learning rate under each schedule
    lr: float

    def warning(self) -> str:
        return (
            f"warning: --resume with a longer schedule ({self.saved_total_steps} steps saved, {self.total_steps} "
            f"requested): from step {self.from_step} on, the learning rate decays to its minimum at step "
            f"{self.total_steps} instead of {self.saved_total_steps} (step {self.from_step}: {self.lr:.3g} instead "
            f"of {self.saved_lr:.3g}); config.json's launch.resumed_from records it"
        )


def schedule_change(saved: Optimisation, requested: Optimisation, step: int) -> ScheduleChange | None:
    """How a longer schedule changes the steps after `step` (the checkpoint's); None when it changes none.

    The step after the checkpoint takes its rate from this launch's schedule (`follow_schedule`), so the
    first step that differs is the first one past both the checkpoint and the warm-up (the warm-up does not
    depend on the length); a constant rate after it (minimum ratio 1) differs nowhere.
    """
    from training.step import lr_factor  # imports torch, which reading a checkpoint's records does not need

    if requested.total_steps <= saved.total_steps:
        return None
    first = max(step + 1, saved.warmup_steps + 2)
    if first > requested.total_steps:
        return None

    def lr_at(total_steps: int) -> float:  # step `first` is taken after `first - 1` steps
        return saved.lr * lr_factor(first - 1, saved.warmup_steps, total_steps, saved.min_lr_ratio)

    before, after = lr_at(saved.total_steps), lr_at(requested.total_steps)
    if before == after:
        return None
    return ScheduleChange(saved.total_steps, requested.total_steps, first, before, after)


def saved_optimisation(checkpoint: Path) -> Optimisation | None:
    """The optimisation a checkpoint was written under; None when its origin.json predates the record of it."""
    saved = (read_origin(checkpoint) or {}).get("optimisation")
    return None if saved is None else Optimisation(**saved)


def resume_warnings(checkpoint: Path, requested: Optimisation) -> tuple[list[str], ScheduleChange | None]:
    """The warning lines of a resume `refusal` accepted (each once, from the main process), and the schedule's
    change, if any."""
    saved = saved_optimisation(checkpoint)
    if saved is None:
        return [
            f"warning: --resume: {checkpoint.name} was written before checkpoints recorded the learning rate, "
            f"the optimizer's settings and the schedule: they are not compared; the checkpoint's learning rate, "
            f"weight decay and betas are kept, and the schedule follows this launch's flags"
        ], None
    change = schedule_change(saved, requested, checkpoint_step(checkpoint))
    return ([change.warning()] if change else []), change


def follow_schedule(scheduler: torch.optim.lr_scheduler.LambdaLR) -> None:
    """Each of its optimizer's groups at the learning rate this launch's schedule gives at the step the loaded
    scheduler is at.

    The loaded optimizer holds the rate its own schedule gave for the next step; under the same schedule this
    is the same float (base_lr x factor, as LambdaLR computes it), under a longer one the next step already
    follows the longer schedule. The base rates are the checkpoint's (equal to --lr: a change is refused).
    """
    rates = [base * factor(scheduler.last_epoch) for base, factor in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
    for group, rate in zip(scheduler.optimizer.param_groups, rates):
        group["lr"] = rate  # what the loop logs and the step applies (training/loop.py reads the group's)


def resumed_from(checkpoint: Path, change: ScheduleChange | None = None) -> ResumedFromRecord:
    """The run record's note of the checkpoint a launch continues: its step, who wrote it, and how a longer
    schedule changed the steps after it."""
    origin = read_origin(checkpoint) or {}
    return ResumedFromRecord(
        step=checkpoint_step(checkpoint),
        strategy=origin.get("strategy"),
        num_processes=origin.get("num_processes"),
        precision=origin.get("precision"),
        saved_total_steps=None if change is None else change.saved_total_steps,
        schedule_changed_from_step=None if change is None else change.from_step,
    )


# ---------------------------------------------------------------------------------------------
# --resume_step: continue from an older checkpoint than the newest


def checkpoint_at_step(output_dir: Path, step: int) -> Path:
    """The complete checkpoint of `step` in `output_dir` when its files verify; else RunError, one line that lists
    the steps that can be resumed from. Reads only: nothing is renamed or written."""
    found = {step_of_name(p): p for p in complete_checkpoints(output_dir)}
    problem = checkpoint_problem(found[step]) if step in found else None
    if step in found and problem is None:
        return found[step]
    why = (
        f"{found[step].name} fails verification ({problem})"
        if step in found
        else f"no complete checkpoint of step {step} in {output_dir / CHECKPOINTS_DIR}"
    )
    verified = [str(s) for s, p in found.items() if s != step and checkpoint_problem(p) is None]
    raise RunError(
        f"--resume_step {step}: {why}; verified checkpoints to resume from: steps {', '.join(verified) or 'none'}"
    )


def roll_back_past(checkpoint: Path) -> list[Path]:
    """Rename every checkpoint folder of a later step than `checkpoint` (complete or not) step_N.rolled_back, so
    that no listing counts, keeps, deletes or resumes from them; their files stay for a person to look at.
    Returns the new names (`rolled_back_names` says them beforehand), oldest step first; main process only."""
    return [set_aside(p, ROLLED_BACK_SUFFIX) for p in _later(checkpoint)]


def rolled_back_names(checkpoint: Path) -> list[str]:
    """The names `roll_back_past` would give, without renaming anything: a resume decides, and renames only once
    the checkpoint has loaded."""
    return [aside_name(p, ROLLED_BACK_SUFFIX).name for p in _later(checkpoint)]


def _later(checkpoint: Path) -> list[Path]:
    step = checkpoint_step(checkpoint)
    return [p for p in checkpoint_folders(checkpoint.parent.parent) if (step_of_name(p) or 0) > step]


# A --resume_step's roll-back, recorded before the launch can fail: a restart (which continues the newest
# checkpoint) or an --auto_resume/--resume after a failed load finishes it instead of continuing the step rolled
# back from.


def pending_rollback(output_dir: Path) -> int | None:
    """The step of a roll-back decided but not yet done (`record_rollback`), if any."""
    path = output_dir / CHECKPOINTS_DIR / ROLLBACK_FILE
    if not path.is_file():
        return None
    try:
        return int(json.loads(path.read_text())["step"])
    except (ValueError, KeyError, TypeError) as exc:
        raise RunError(
            f"{path} cannot be read ({exc}): it names the step a --resume_step rolls back to; "
            f"resume again with --resume_step N"
        ) from None


def record_rollback(checkpoint: Path, aside: list[str]) -> None:
    """Durably note that the run rolls back to `checkpoint` when folders are to be set aside (else drop a note
    left by an earlier decision): renaming waits for the load, but a launch that fails before then must not leave
    its restart to continue a checkpoint the user rolled back from. Main process only."""
    path = checkpoint.parent / ROLLBACK_FILE
    try:
        if aside:
            write_atomic(path, json.dumps({"step": checkpoint_step(checkpoint), "rolled_back": aside}), sync=True)
        elif path.exists():
            path.unlink()
        else:
            return
        sync_folder(path.parent)
    except OSError as exc:  # a full or read-only disk: one line on every process, not a traceback on one
        raise RunError(f"{path} cannot be written ({type(exc).__name__}: {exc})") from exc


def finish_rollback(checkpoint: Path) -> list[Path]:
    """Once `checkpoint` has loaded: set the newer folders aside (`roll_back_past`), then drop the note. A rename
    that fails leaves the note, so that the next launch finishes the roll-back."""
    try:
        renamed = roll_back_past(checkpoint)
    except OSError as exc:
        raise RunError(f"the roll-back to {checkpoint} was cut short ({type(exc).__name__}: {exc})") from exc
    record_rollback(checkpoint, [])
    return renamed


def rolled_back_warning(checkpoint: Path, renamed: list[Path]) -> str:
    """The one line that names the checkpoints a --resume_step set aside."""
    return (
        f"warning: --resume_step {checkpoint_step(checkpoint)}: rolled back past {len(renamed)} newer "
        f"checkpoint(s), renamed {', '.join(p.name for p in renamed)} (kept, never resumed from or counted by "
        f"--keep_checkpoints); their metrics.jsonl lines are cut"
    )
