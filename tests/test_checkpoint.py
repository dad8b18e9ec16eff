"""Checkpoints: only complete ones count, the newest `keep` are kept, loading picks the newest, and what a
checkpoint holds comes back (weights, optimizer, grad scaler, random states)."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator

from model import GPT2, GPT2Config
from training.checkpoints.store import (
    COMPLETE_MARKER,
    checkpoint_path,
    checkpoint_step,
    complete_checkpoints,
    load_model_from_checkpoint,
    load_model_state_dict,
    load_states,
    newest_checkpoint,
    save_checkpoint,
)

# The tiny preset with a small vocabulary and context: a checkpoint of a few hundred KiB saves in milliseconds.
CONFIG = GPT2Config.from_preset("tiny", vocab_size=256, n_positions=32)


@pytest.fixture(scope="module")
def prepared() -> tuple[Accelerator, torch.nn.Module, torch.optim.Optimizer]:
    """One process on CPU, a model and its optimizer prepared as training prepares them."""
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = GPT2(CONFIG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def save(prepared, out: Path, step: int, keep: int = 3) -> Path:
    accelerator, model, optimizer = prepared
    return save_checkpoint(accelerator, model, optimizer, out, step, CONFIG.to_dict(), keep=keep)


def names(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "checkpoints").iterdir())


def fake_checkpoint(out: Path, step: int, complete: bool) -> Path:
    """A checkpoint folder as the finder sees it: complete.json only once the save has finished."""
    path = checkpoint_path(out, step)
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"")
    if complete:
        (path / COMPLETE_MARKER).write_text(json.dumps({"step": step}))
    return path


def test_save_writes_a_complete_checkpoint_with_the_model_config(prepared, tmp_path: Path) -> None:
    path = save(prepared, tmp_path, 7)
    assert path == tmp_path / "checkpoints" / "step_0000007"
    assert checkpoint_step(path) == 7
    # Model and optimizer through torch.distributed.checkpoint, one layout whatever the strategy.
    assert (path / "model" / ".metadata").is_file() and (path / "optimizer" / ".metadata").is_file()
    assert json.loads((path / "origin.json").read_text())["format"] == 2
    assert GPT2Config.from_dict(json.loads((path / "model_config.json").read_text())) == CONFIG


def test_save_keeps_only_the_newest_keep_complete_checkpoints(prepared, tmp_path: Path) -> None:
    for step in (1, 2, 3, 4, 5):
        save(prepared, tmp_path, step, keep=2)
    assert names(tmp_path) == ["step_0000004", "step_0000005"]
    assert complete_checkpoints(tmp_path) == [checkpoint_path(tmp_path, 4), checkpoint_path(tmp_path, 5)]


def test_save_removes_partial_folders_of_interrupted_saves(prepared, tmp_path: Path) -> None:
    save(prepared, tmp_path, 2)
    fake_checkpoint(tmp_path, 3, complete=False)  # interrupted before complete.json
    fake_checkpoint(tmp_path, 9, complete=False)  # a newer one, from a run that was then resumed earlier
    save(prepared, tmp_path, 4)
    assert names(tmp_path) == ["step_0000002", "step_0000004"]


def test_save_replaces_a_leftover_folder_at_the_same_step(prepared, tmp_path: Path) -> None:
    leftover = fake_checkpoint(tmp_path, 5, complete=False)
    (leftover / "stale.bin").write_bytes(b"half-written")
    save(prepared, tmp_path, 5)
    assert not (leftover / "stale.bin").exists() and checkpoint_step(leftover) == 5


def test_newest_checkpoint_skips_an_incomplete_one(tmp_path: Path) -> None:
    # Created newest first, so neither creation order nor modification time can stand in for the step.
    fake_checkpoint(tmp_path, 12, complete=False)
    fake_checkpoint(tmp_path, 10, complete=True)
    fake_checkpoint(tmp_path, 9, complete=True)
    assert complete_checkpoints(tmp_path) == [checkpoint_path(tmp_path, 9), checkpoint_path(tmp_path, 10)]
    assert newest_checkpoint(tmp_path) == checkpoint_path(tmp_path, 10)


def test_no_complete_checkpoint_means_none(tmp_path: Path) -> None:
    assert newest_checkpoint(tmp_path) is None and complete_checkpoints(tmp_path) == []
    fake_checkpoint(tmp_path, 3, complete=False)
    assert newest_checkpoint(tmp_path) is None and complete_checkpoints(tmp_path) == []


def test_loading_a_run_directory_takes_its_newest_complete_checkpoint(prepared, tmp_path: Path) -> None:
    _, model, _ = prepared
    weights = {}
    for step in (1, 2):
        with torch.no_grad():
            model.transformer.wte.weight.add_(1.0)  # different weights in each checkpoint
        weights[step] = model.transformer.wte.weight.detach().clone()
        save(prepared, tmp_path, step)
    newer_partial = fake_checkpoint(tmp_path, 3, complete=False)  # e.g. a save still in progress
    (newer_partial / "model_config.json").write_text(json.dumps(CONFIG.to_dict()))

    loaded = load_model_from_checkpoint(tmp_path)
    assert torch.equal(loaded.transformer.wte.weight, weights[2])
    assert loaded.lm_head.weight is loaded.transformer.wte.weight  # the tie survives loading
    older = load_model_from_checkpoint(checkpoint_path(tmp_path, 1))  # a checkpoint folder: that one
    assert torch.equal(older.transformer.wte.weight, weights[1])


def test_loading_a_folder_without_a_complete_checkpoint_says_so(tmp_path: Path) -> None:
    fake_checkpoint(tmp_path, 3, complete=False)
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        load_model_from_checkpoint(tmp_path)


# -- damaged checkpoints: resume takes the newest intact one -------------------------------------------------


def test_a_truncated_or_corrupted_checkpoint_is_skipped_for_the_newest_intact_one(
    prepared, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from training.checkpoints.store import checkpoint_problem, newest_good_checkpoint

    for step in (2, 4, 6):
        save(prepared, tmp_path, step)
    weights = checkpoint_path(tmp_path, 6) / "model" / "__0_0.distcp"
    weights.write_bytes(weights.read_bytes()[:-100])  # a copy cut short
    optimizer = checkpoint_path(tmp_path, 4) / "optimizer" / "__0_0.distcp"
    data = bytearray(optimizer.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte, same size
    optimizer.write_bytes(bytes(data))
    assert "model/__0_0.distcp has" in checkpoint_problem(checkpoint_path(tmp_path, 6))
    assert "optimizer/__0_0.distcp is corrupted" in checkpoint_problem(checkpoint_path(tmp_path, 4))
    assert newest_good_checkpoint(tmp_path) == checkpoint_path(tmp_path, 2)
    warnings = capsys.readouterr().err.strip().splitlines()
    assert [w.split(" (")[0] for w in warnings] == [
        "warning: checkpoint step_0000006 is damaged",
        "warning: checkpoint step_0000004 is damaged",
    ]
    # Set aside: never counted or chosen again, kept for a person to look at.
    assert names(tmp_path) == ["step_0000002", "step_0000004.damaged", "step_0000006.damaged"]


def test_resume_with_no_intact_checkpoint_is_a_one_line_error(prepared, tmp_path: Path) -> None:
    from training.checkpoints.store import newest_good_checkpoint
    from training.config import RunError

    save(prepared, tmp_path, 3)
    (checkpoint_path(tmp_path, 3) / "model" / "__0_0.distcp").unlink()
    with pytest.raises(
        RunError, match=r"no intact checkpoint to continue, only folders set aside: step_0000003\.damaged "
    ) as error:
        newest_good_checkpoint(tmp_path)
    assert "\n" not in str(error.value)
    with pytest.raises(RunError, match="no complete checkpoint"):
        newest_good_checkpoint(tmp_path / "elsewhere")


def test_resuming_unpickles_nothing_but_the_checkpoint_formats_own_index(
    prepared, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every file a resume or an export reads is JSON or torch.load(weights_only=True), except the index
    torch.distributed.checkpoint writes (`.metadata`), which PyTorch itself reads with pickle.load: a resume
    is as safe as the folder it reads, and nothing the project writes adds to what is unpickled."""
    accelerator, model, optimizer = prepared
    path = save(prepared, tmp_path, 5)
    torch_loads, unpickled = [], []
    real_torch_load, real_pickle_load, real_pickle_loads = torch.load, pickle.load, pickle.loads

    def recording_torch_load(*args, **kwargs):
        torch_loads.append(kwargs.get("weights_only"))
        return real_torch_load(*args, **kwargs)

    def recording_pickle_load(file, *args, **kwargs):
        unpickled.append(Path(getattr(file, "name", "?")).name)
        return real_pickle_load(file, *args, **kwargs)

    def recording_pickle_loads(data, *args, **kwargs):
        unpickled.append("<bytes>")
        return real_pickle_loads(data, *args, **kwargs)

    monkeypatch.setattr(torch, "load", recording_torch_load)
    monkeypatch.setattr(pickle, "load", recording_pickle_load)
    monkeypatch.setattr(pickle, "loads", recording_pickle_loads)
    load_states(accelerator, model, optimizer, path)
    load_model_from_checkpoint(path)
    assert all(weights_only is True for weights_only in torch_loads), torch_loads
    # Each state dict (the model's, the optimizer's) is read through its own DCP index, and through nothing else.
    assert unpickled and set(unpickled) == {".metadata"}, unpickled


def test_the_model_the_optimizer_and_the_random_states_come_back(prepared, tmp_path: Path) -> None:
    """What a resume restores equals what was saved: weights, AdamW's moments and step, the random states."""
    accelerator, model, optimizer = prepared
    model(torch.randint(0, CONFIG.vocab_size, (2, 8)), torch.randint(0, CONFIG.vocab_size, (2, 8)))[1].backward()
    optimizer.step()  # AdamW has moments to save
    optimizer.zero_grad()
    saved_weights = {k: v.clone() for k, v in model.state_dict().items()}
    saved_moments = {k: v.clone() for k, v in optimizer.state_dict()["state"][0].items()}
    path = save(prepared, tmp_path, 1)
    draw = torch.rand(4)  # what the random state gives next, at the save
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    optimizer.step()  # no gradients: moments unchanged, so change them by hand
    optimizer.state[next(iter(optimizer.state))]["exp_avg"].add_(1.0)
    assert load_states(accelerator, model, optimizer, path)  # the same (one) process: its own random states
    assert all(torch.equal(v, saved_weights[k]) for k, v in model.state_dict().items())
    assert all(torch.equal(v, saved_moments[k]) for k, v in optimizer.state_dict()["state"][0].items())
    assert torch.equal(torch.rand(4), draw)


class _Mkdir:
    """An object whose unpickling creates a folder: what a checkpoint from elsewhere could hold instead of a weight."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (os.mkdir, (str(self.path),))


def _with_pickled_weight(checkpoint: Path, marker: Path) -> Path:
    """`checkpoint` as one from elsewhere could be: its model's DCP folder stores transformer.wte.weight as a pickled
    object whose loading creates `marker`, and complete.json lists the new files, so that the folder verifies."""
    import torch.distributed.checkpoint as dcp

    from training.checkpoints.store import (
        MODEL_DIR,
        _durable_manifest,
        _one_process_quiet,
        _own_files,
        checkpoint_problem,
    )

    state: dict = load_model_state_dict(checkpoint)
    state["transformer.wte.weight"] = _Mkdir(marker)
    shutil.rmtree(checkpoint / MODEL_DIR)
    with _one_process_quiet():
        dcp.save(state, checkpoint_id=checkpoint / MODEL_DIR, no_dist=True)
    files = _durable_manifest(checkpoint, _own_files(checkpoint, 0, True))
    (checkpoint / COMPLETE_MARKER).write_text(json.dumps({"step": checkpoint_step(checkpoint), "files": files}))
    assert checkpoint_problem(checkpoint) is None
    return checkpoint


def test_the_projects_own_checkpoints_hold_tensors_only(prepared, tmp_path: Path) -> None:
    """Model and AdamW state (moments and step counts, after a step) are tensors: nothing for the refusal below."""
    from training.checkpoints.store import pickled_problem

    accelerator, model, optimizer = prepared
    model(torch.randint(0, CONFIG.vocab_size, (2, 8)), torch.randint(0, CONFIG.vocab_size, (2, 8)))[1].backward()
    optimizer.step()
    optimizer.zero_grad()
    path = save(prepared, tmp_path, 2)
    assert optimizer.state and pickled_problem(path) is None
    load_states(accelerator, model, optimizer, path)
    assert load_model_from_checkpoint(path).config.to_dict() == CONFIG.to_dict()


def test_a_checkpoint_holding_a_pickled_object_is_refused_in_one_line_before_anything_unpickles_it(
    prepared, tmp_path: Path
) -> None:
    """By the resume's decision, --init_from's check, the export's and sampling's load, and the load itself (a folder
    changed after the checks): each refuses in one line naming the entry, and the object's code never runs."""
    from tests.test_resume_refusal import SAVED
    from training import trainer as session
    from training.checkpoints.init_from import init_source
    from training.checkpoints.resume import origin_record
    from training.checkpoints.store import save_checkpoint
    from training.config import RunError

    accelerator, model, optimizer = prepared
    origin = origin_record("single", 1, SAVED)
    saved = save_checkpoint(accelerator, model, optimizer, tmp_path / "run", 4, CONFIG.to_dict(), 2, {}, origin)
    marker = tmp_path / "code-ran"
    checkpoint = _with_pickled_weight(saved, marker)
    refusals = []
    for refused in (
        lambda: session._resume_origin(checkpoint, SAVED),
        lambda: init_source(str(checkpoint), tmp_path / "new", CONFIG.to_dict()),
        lambda: load_model_from_checkpoint(checkpoint),
        lambda: load_states(accelerator, model, optimizer, checkpoint),
    ):
        with pytest.raises((RunError, ValueError)) as error:
            refused()
        refusals.append(str(error.value))
        assert not marker.exists(), refusals[-1]
    for message in refusals:
        assert "\n" not in message and "transformer.wte.weight as pickled Python objects" in message, message


def test_a_save_refuses_a_state_that_is_not_all_tensors(prepared, tmp_path: Path) -> None:
    """DCP would pickle a value that is not a tensor, and every resume refuses such a checkpoint: a value added to
    the optimizer's state one day must stop the save that would write it, not every resume after it."""
    from training.checkpoints.store import complete_checkpoints

    accelerator, model, optimizer = prepared
    model(torch.randint(0, CONFIG.vocab_size, (2, 8)), torch.randint(0, CONFIG.vocab_size, (2, 8)))[1].backward()
    optimizer.step()
    first = next(iter(optimizer.optimizer.state.values()))
    first["note"] = "not a tensor"
    with pytest.raises(TypeError, match=r"not tensors: .*\.note"):
        save(prepared, tmp_path, 2)
    assert complete_checkpoints(tmp_path) == [] and not checkpoint_path(tmp_path, 2).exists()  # nothing written


@pytest.mark.parametrize("fused", ["on", "off"])
def test_a_resume_runs_the_optimizer_implementation_this_launch_records(tmp_path: Path, fused: str) -> None:
    """--fused_adamw as this launch resolves it (the levers config.json records), not as the checkpoint's param
    groups say: a run saved with the other implementation resumes with this one, and steps with it."""
    from training.config import OptimConfig
    from training.distributed.speed_levers import DeviceInfo, decide_fused_adamw
    from training.step import make_optimizer

    accelerator = Accelerator(cpu=True)
    recorded = {launch: decide_fused_adamw(launch, DeviceInfo.of(torch.device("cpu")))[0] for launch in ("on", "off")}
    saved_with = "off" if fused == "on" else "on"
    prepared = []
    for launch in (saved_with, fused):
        model = GPT2(CONFIG)
        prepared.append(accelerator.prepare(model, make_optimizer(model, OptimConfig(), fused=recorded[launch])))
    (model, optimizer), (resumed_model, resumed) = prepared
    model(torch.randint(0, CONFIG.vocab_size, (2, 8)), torch.randint(0, CONFIG.vocab_size, (2, 8)))[1].backward()
    optimizer.step()
    save_checkpoint(accelerator, model, optimizer, tmp_path, 1, CONFIG.to_dict(), keep=1)
    load_states(accelerator, resumed_model, resumed, checkpoint_path(tmp_path, 1))
    in_effect = {bool(group["fused"]) for group in resumed.param_groups}
    assert in_effect == {recorded[fused]}, (fused, in_effect)
    resumed_model(torch.randint(0, CONFIG.vocab_size, (2, 8)), torch.randint(0, CONFIG.vocab_size, (2, 8)))[
        1
    ].backward()
    resumed.step()  # the step counts loaded where this implementation keeps them


def test_an_earlier_layout_is_refused_in_one_line(tmp_path: Path) -> None:
    path = fake_checkpoint(tmp_path, 3, complete=True)  # model.safetensors: accelerate's save_state layout
    (path / "model_config.json").write_text(json.dumps(CONFIG.to_dict()))
    with pytest.raises(ValueError, match="earlier version of this project") as error:
        load_model_from_checkpoint(tmp_path)
    assert "\n" not in str(error.value)


def test_the_grad_scaler_state_is_checkpointed(tmp_path: Path) -> None:
    """An fp16 run resumes with the loss scale it had reached, not the initial one."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        scales = []
        for attempt in range(2):
            AcceleratorState._reset_state(reset_partial_state=True)
            accelerator = Accelerator(cpu=True, mixed_precision="fp16")
            # accelerate makes no grad scaler on CPU: the GPU's GradScaler class is handed to it.
            accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
            accelerator.native_amp = True
            model = GPT2(CONFIG)
            model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
            if attempt == 0:
                accelerator.scaler.scale(torch.ones(()))  # the scale tensor exists from the first scaled loss
                accelerator.scaler.update(new_scale=2.0**7)  # where a few overflows would have brought it
                save_checkpoint(accelerator, model, optimizer, tmp_path, 1, CONFIG.to_dict(), keep=1)
            else:
                load_states(accelerator, model, optimizer, checkpoint_path(tmp_path, 1))
            scales.append(accelerator.scaler.get_scale())
        assert scales == [2.0**7, 2.0**7]
        assert (checkpoint_path(tmp_path, 1) / "grad_scaler.json").is_file()
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


def test_a_complete_checkpoint_or_a_run_holding_one_is_what_sampling_loads(tmp_path: Path) -> None:
    """training/sample.py loads a path as a checkpoint only when this says so: an interrupted save is not one."""
    from training.checkpoints.store import is_checkpoint_or_run

    partial = fake_checkpoint(tmp_path, 3, complete=False)
    assert not is_checkpoint_or_run(tmp_path) and not is_checkpoint_or_run(partial)
    complete = fake_checkpoint(tmp_path, 4, complete=True)
    assert is_checkpoint_or_run(tmp_path) and is_checkpoint_or_run(complete)
