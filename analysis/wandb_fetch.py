"""Fetch the runs of one W&B group back as run directories, so the same report can read them.

train.py gives W&B the resolved config (config.json's content), every metrics line under namespaced
keys (`train/loss`, `perf/tokens_per_s`, ...) and the whole-run figures as `total/<key>` in the run
summary. From those, `run_files_from_wandb` rebuilds config.json, metrics.jsonl and summary.json.
What W&B does not hold is approximated from the logged lines, which come every `log_interval`
steps: the per-epoch figures and the step-time distribution (interval means, not single steps).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.report import write_atomic
from analysis.runs import CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, number
from training.records.record import BatchRecord, EpochFigures, LaunchRecord, RunFacts, RunTotals, run_summary
from training.records.schema import (
    ELAPSED,
    LINE_GRAD_NORM,
    LINE_KIND_KEY,
    LINE_LOSS,
    LINE_SAMPLES_PER_S,
    LINE_STEP_TIME,
    LINE_TOKENS,
    VAL_LOSS,
    Scope,
    in_scope,
    only_in,
)
from training.records.sinks import WANDB_KEYS, WANDB_SUMMARY_PREFIX

# What an eval line holds besides its step (W&B's own step axis), and what only an eval line holds:
# W&B merges the eval line of a step into the train line's row, and this splits them again.
EVAL_KEYS = tuple(m.key for m in in_scope(Scope.EVAL) if m.wandb_key is not None)
EVAL_ONLY_KEYS = only_in(Scope.EVAL, [Scope.TRAIN])
APPROXIMATION_NOTE = (
    "fetched from W&B: per-epoch figures and step times are rebuilt from the lines logged "
    "every log_interval steps, so they approximate what summary.json would hold"
)


class FetchError(RuntimeError):
    """W&B could not be reached or asked; the message is one line for the user."""


@dataclass
class RunFiles:
    config: dict[str, Any]
    metrics: list[dict[str, Any]]
    summary: dict[str, Any]


def wandb_namespace() -> dict[str, str]:
    """metrics.jsonl key -> W&B key, from the training side that chose the names (one source of truth)."""
    return dict(WANDB_KEYS)


def metrics_from_history(rows: Iterable[Mapping[str, Any]], namespace: Mapping[str, str]) -> list[dict[str, Any]]:
    """History rows -> metrics.jsonl records; a row can hold a train and an eval line of the same step."""
    local = {wandb_key: key for key, wandb_key in namespace.items()}
    records: list[dict[str, Any]] = []
    for row in rows:
        step = row.get("_step")
        values = {local.get(k, k): v for k, v in row.items() if not k.startswith("_") and v is not None}
        if LINE_LOSS.key in values:
            train = {k: v for k, v in values.items() if k not in EVAL_ONLY_KEYS}
            records.append({LINE_KIND_KEY: Scope.TRAIN.value, "step": step, **train})
        if VAL_LOSS.key in values:
            evals = {k: values[k] for k in EVAL_KEYS if k in values}
            records.append({LINE_KIND_KEY: Scope.EVAL.value, "step": step, **evals})
    return records


def epochs_from_metrics(metrics: list[dict[str, Any]], world_size: int, warmup_steps: int) -> list[EpochFigures]:
    """Per-epoch figures from the logged lines (see the module docstring for what is approximate); what
    the lines cannot tell (whether the epoch was partial, the skipped steps) is None.

    Means follow train.py's own definition (training.records.steady_mean.steady_mean, the same warm-up rule and
    non-finite handling), over the logged steps instead of every step.
    """
    epochs: list[EpochFigures] = []
    last_step, last_tokens, last_elapsed = 0, 0, 0.0
    for epoch in sorted({r["epoch"] for r in metrics if r["kind"] == "train" and isinstance(r.get("epoch"), int)}):
        lines = [r for r in metrics if r["kind"] == "train" and r.get("epoch") == epoch]
        evals = [r for r in metrics if r["kind"] == "eval" and r.get("epoch") == epoch]
        end = lines[-1]
        tokens = (number(end.get(LINE_TOKENS.key)) or 0) - last_tokens
        time_s = (number(end.get(ELAPSED.key)) or 0.0) - last_elapsed
        tokens_per_s = tokens / time_s if time_s > 0 else None
        epochs.append(
            EpochFigures(
                epoch=epoch,
                partial=None,
                steps=(end.get("step") or 0) - last_step,
                tokens=int(tokens),
                **_step_means(lines, warmup_steps),
                skipped_steps=None,
                time_s=time_s,
                tokens_per_s=tokens_per_s,
                tokens_per_s_per_device=tokens_per_s / world_size if tokens_per_s and world_size else None,
                samples_per_s=_mean(lines, LINE_SAMPLES_PER_S.key),
                **_last_values(lines, evals),
            )
        )
        last_step, last_tokens, last_elapsed = end.get("step") or 0, tokens + last_tokens, time_s + last_elapsed
    return epochs


def _last_values(lines: list[dict[str, Any]], evals: list[dict[str, Any]]) -> dict[str, Any]:
    """The epoch figures the run schema declares as the epoch's last value of a line key (peak
    memory since the epoch started, the last validation)."""
    train_keys = {m.key for m in in_scope(Scope.TRAIN)}
    figures: dict[str, Any] = {}
    for figure in in_scope(Scope.EPOCH):
        if figure.epoch_last_of is not None:
            source = lines if figure.epoch_last_of in train_keys else evals
            figures[figure.key] = source[-1].get(figure.epoch_last_of) if source else None
    return figures


def _step_means(lines: list[dict[str, Any]], warmup_steps: int) -> dict[str, Any]:
    from training.records.steady_mean import steady_mean

    loss, norm = (
        steady_mean(((line["step"], line.get(key)) for line in lines), warmup_steps)
        for key in (LINE_LOSS.key, LINE_GRAD_NORM.key)
    )
    return dict(
        loss_mean=loss.value if loss.steps else None,
        loss_nonfinite_steps=loss.nonfinite_left_out,
        grad_norm_mean=norm.value if norm.steps else None,
        grad_norm_nonfinite_steps=norm.nonfinite_left_out,
    )


def _mean(lines: list[dict[str, Any]], key: str) -> float | None:
    values = [v for line in lines if (v := number(line.get(key))) is not None]
    return sum(values) / len(values) if values else None


def run_files_from_wandb(
    config: Mapping[str, Any],
    summary: Mapping[str, Any],
    rows: Iterable[Mapping[str, Any]],
    namespace: Mapping[str, str],
) -> RunFiles:
    """Rebuild a run directory's three files from a W&B run's config, summary and history.

    The summary is laid out by the same function as train.py's (training.records.record.run_summary) from the
    launch record W&B holds in the config; what W&B does not hold (the memory probe, the observed sharding,
    the skipped steps) is left out (null) rather than guessed.
    """
    run = config.get("run") or {}
    launch = LaunchRecord.from_dict(config.get("launch") or {})
    batch = launch.batch or BatchRecord.from_dict({})
    metrics = metrics_from_history(rows, namespace)
    train = [r for r in metrics if r["kind"] == "train"]
    steps = train[-1]["step"] if train else 0
    world_size = (launch.effective.world_size if launch.effective else None) or 1
    total = {k.removeprefix(WANDB_SUMMARY_PREFIX): v for k, v in summary.items() if k.startswith(WANDB_SUMMARY_PREFIX)}
    epochs = epochs_from_metrics(metrics, world_size, int(run.get("perf_warmup_steps") or 0))
    rebuilt = run_summary(
        launch,
        RunFacts(
            experiment=run.get("experiment"),
            preset=config.get("preset"),
            seed=run.get("seed"),
            block_size=(config.get("data") or {}).get("block_size"),
            sharding_observed=None,
            memory=None,
            steps=steps,
            tokens_trained=steps * (batch.global_batch_tokens or 0),
            complete=bool(total) and steps >= ((launch.schedule.total_steps if launch.schedule else None) or 0),
            epochs=epochs,
            total=RunTotals.from_dict(total),
            step_times_s=[v for line in train if (v := number(line.get(LINE_STEP_TIME.key))) is not None],
            skipped_step_numbers=None,
        ),
    )
    return RunFiles(dict(config), metrics, rebuilt.to_dict())


def fetch_wandb_runs(entity_project: str, group: str, dest: Path) -> list[Path]:
    """Write every run of `group` in `entity_project` as dest/<run id>/; raise FetchError when W&B can't."""
    try:
        import wandb  # imported here: only this path needs it, and importing it is slow
    except ImportError as err:
        raise FetchError(f"wandb is not installed ({err})") from err
    try:
        remote_runs = list(wandb.Api().runs(entity_project, filters={"group": group}))
        if not remote_runs:
            raise FetchError(f"no W&B runs in {entity_project} with group {group!r}")
        namespace = wandb_namespace()
        paths = []
        for remote in remote_runs:
            files = run_files_from_wandb(dict(remote.config), dict(remote.summary), remote.scan_history(), namespace)
            paths.append(_write_run_files(dest / str(remote.id), files))
        return paths
    except FetchError:
        raise
    except Exception as err:  # offline, not logged in, no such project: all mean "cannot fetch"
        first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise FetchError(f"cannot fetch W&B runs of {entity_project}, group {group!r}: {first_line}") from err


def _write_run_files(folder: Path, files: RunFiles) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / CONFIG_FILE, json.dumps(files.config, indent=2, default=str).encode())
    write_atomic(folder / METRICS_FILE, "".join(json.dumps(r, default=str) + "\n" for r in files.metrics).encode())
    write_atomic(folder / SUMMARY_FILE, json.dumps(files.summary, indent=2, default=str).encode())
    return folder
