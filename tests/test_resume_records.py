"""What a resume keeps of a run's records: metrics.jsonl with a torn last line (dropped with one warning) or a
broken line before it (refused in one line, nothing written), decided before anything is written or renamed.
In-process, on the tiny model of tests/test_checkpoint_keeping.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_checkpoint_keeping import CONFIG, _prepared
from tests.test_resume_refusal import SAVED
from training import session
from training.checkpoint import checkpoint_path, save_checkpoint
from training.errors import RunError
from training.resume import origin_record
from training.rundir import truncate_metrics

# --------------------------------------------------------------------------------------------- metrics.jsonl


def _lines(steps: range) -> str:
    return "".join(json.dumps({"kind": "train", "step": s, "loss": 10.0 - s}) + "\n" for s in steps)


def test_a_torn_last_line_is_dropped_when_a_resume_cuts_the_metrics_back(tmp_path: Path) -> None:
    """A kill or a full disk in the middle of an append leaves a last line cut short: the resume drops it."""
    path = tmp_path / "metrics.jsonl"
    path.write_text(_lines(range(1, 6)) + '{"kind": "train", "step": 6, "lo')
    truncate_metrics(path, 4)
    assert path.read_text() == _lines(range(1, 5))


def test_a_broken_line_before_the_last_is_refused_in_one_line_naming_the_file(tmp_path: Path) -> None:
    """Not a cut write (something else changed the file): refused, the file as it was."""
    path = tmp_path / "metrics.jsonl"
    before = _lines(range(1, 3)) + '{"kind": "train", "st\n' + _lines(range(4, 6))
    path.write_text(before)
    with pytest.raises(RunError) as refused:
        truncate_metrics(path, 4)
    message = str(refused.value)
    assert "\n" not in message and str(path) in message and "line 3" in message, message
    assert path.read_text() == before


def _resumable(out: Path, later: int | None = None) -> Path:
    """A verified checkpoint of step 3 whose origin the identity SAVED continues (and one of step `later`)."""
    accelerator, model, optimizer = _prepared()
    origin = origin_record("fsdp", 2, SAVED)
    for step in (3, *([later] if later else [])):
        save_checkpoint(accelerator, model, optimizer, out, step, CONFIG.to_dict(), 3, {"state": {}}, origin)
    return checkpoint_path(out, 3)


def test_the_resume_decision_warns_of_a_torn_last_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = _resumable(tmp_path)
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(_lines(range(1, 5)) + '{"kind": "tr')
    capsys.readouterr()
    session._resume_origin(checkpoint, SAVED)
    (warning,) = capsys.readouterr().out.splitlines()
    assert warning.startswith(f"warning: {metrics}: line 5 ") and "dropped" in warning, warning
    assert metrics.read_text() == _lines(range(1, 5)) + '{"kind": "tr'  # cut once the checkpoint has loaded


def test_the_resume_decision_refuses_a_broken_line_before_anything_is_renamed(tmp_path: Path) -> None:
    """--resume_step 3 past a checkpoint of step 6, over a metrics.jsonl broken in its middle: one line, and step 6
    is not rolled aside."""
    checkpoint = _resumable(tmp_path, later=6)
    (tmp_path / "metrics.jsonl").write_text('{"kind": "train", "step": 1\n' + _lines(range(2, 5)))
    with pytest.raises(RunError, match=r"metrics\.jsonl: line 1 "):
        session._resume_origin(checkpoint, SAVED, roll_back=True)
    assert checkpoint_path(tmp_path, 6).is_dir()


def test_a_roll_back_renames_nothing_until_the_checkpoint_has_loaded(tmp_path: Path) -> None:
    """The decision names the folders a --resume_step will set aside; renaming them is left to after the load."""
    checkpoint = _resumable(tmp_path, later=6)
    record = session._resume_origin(checkpoint, SAVED, roll_back=True)
    assert record["rolled_back"] == ["step_0000006.rolled_back"]
    assert checkpoint_path(tmp_path, 6).is_dir()
