"""The project's perplexity metric (analysis/metrics/perplexity) and the export check, `python -m analysis.export_check`.

The metric is checked against a hand loop of torch cross-entropy on a tiny random model; the command is
checked on real single, DDP and FSDP runs: their exports, scored on the rebuilt validation blocks, give the
loss each run recorded.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file, save_file

from analysis import export_check
from tests.launch import REPO, SHARED_EVAL_BLOCKS, launch_env

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_EVALUATE_OFFLINE": "1"}
CONTEXT = 16
EVAL_BLOCKS = SHARED_EVAL_BLOCKS
STRATEGIES = ("single", "ddp", "fsdp")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised GPT2LMHeadModel folder with the project's tokenizer, small enough to score by hand."""
    from data import load_tokenizer

    folder = tmp_path_factory.mktemp("tiny_lm")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=CONTEXT, vocab_size=50257)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    load_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture()
def metric(monkeypatch: pytest.MonkeyPatch):
    for name, value in OFFLINE.items():
        monkeypatch.setenv(name, value)
    import evaluate

    return evaluate.load(str(export_check.METRIC_DIR))


def _hand_loss(folder: Path, sequences: list[list[int]]) -> tuple[float, int]:
    """Token-weighted mean next-token cross-entropy, one sequence at a time."""
    model = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
    total, tokens = 0.0, 0
    with torch.no_grad():
        for seq in sequences:
            ids = torch.tensor(seq)
            logits = model(ids[None, :-1]).logits[0]
            total += F.cross_entropy(logits, ids[1:], reduction="sum").item()
            tokens += len(seq) - 1
    return total / tokens, tokens


def test_metric_is_token_weighted_cross_entropy_and_its_exp(model_dir: Path, metric) -> None:
    generator = torch.Generator().manual_seed(1)
    # Unequal lengths, so a mean of per-sequence means would differ from the token-weighted mean.
    sequences = [torch.randint(0, 50257, (n,), generator=generator).tolist() for n in (17, 17, 17, 9, 3, 2)]
    loss, tokens = _hand_loss(model_dir, sequences)
    result = metric.compute(predictions=sequences, model_path=str(model_dir), batch_size=2)
    assert result["tokens"] == tokens
    assert result["loss"] == pytest.approx(loss, rel=1e-6)
    # exp turns the loss's rounding (1e-6 of 10.8 nats) into 1e-5 of the perplexity: compared with its own loss.
    assert result["perplexity"] == pytest.approx(math.exp(result["loss"]), rel=1e-12)


def test_texts_are_scored_as_their_tokens_and_long_ones_in_windows(model_dir: Path, metric) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    texts = ["The council met on Monday.", "Residents said the bridge " + "and the harbor " * 20 + "stayed open."]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    assert len(ids[1]) > CONTEXT + 1  # longer than the model's context: scored window by window
    from_texts = metric.compute(predictions=texts, model_path=str(model_dir))
    from_ids = metric.compute(predictions=ids, model_path=str(model_dir))
    assert from_texts == pytest.approx(from_ids, rel=1e-9)
    assert from_texts["tokens"] == sum(len(seq) - 1 for seq in ids)  # every next token scored once


@pytest.fixture(scope="module")
def runs(shared_runs) -> dict[str, Path]:
    """The session's single, DDP and FSDP runs (tests/conftest.py), exported at their defaults."""
    return {strategy: shared_runs[strategy] for strategy in STRATEGIES}


# The command as a user runs it, `python -m analysis.export_check RUN --json`, for one run (its own process,
# entry point and exit status); the other runs through the same main() in this process, which spares each a
# Python start with torch, transformers and evaluate to import (about 5 s).
BY_COMMAND = "single"


def _check(run_dir: Path, by_command: bool, capsys, monkeypatch) -> subprocess.CompletedProcess[str]:
    argv = [str(run_dir), "--json"]
    if by_command:
        return subprocess.run(
            [sys.executable, "-m", "analysis.export_check", *argv],
            cwd=REPO,
            env={**launch_env(), **OFFLINE},
            capture_output=True,
            text=True,
            timeout=300,
        )
    for name, value in OFFLINE.items():
        monkeypatch.setenv(name, value)
    capsys.readouterr()
    status = export_check.main(argv)
    printed = capsys.readouterr()
    return subprocess.CompletedProcess(argv, status, printed.out, printed.err)


@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_export_scores_the_recorded_final_validation_loss(
    runs: dict[str, Path], strategy: str, capsys, monkeypatch
) -> None:
    summary = json.loads((runs[strategy] / "summary.json").read_text())
    assert summary["strategy"] == strategy
    recorded = summary["total"]["final_val_loss"]
    assert recorded < math.log(50257) - 1.0  # trained away from the uniform guess, so agreement says something
    result = _check(runs[strategy], strategy == BY_COMMAND, capsys, monkeypatch)
    assert result.returncode == 0, result.stderr[-2000:]
    check = json.loads(result.stdout)
    assert check["blocks"] == EVAL_BLOCKS and check["tokens"] == EVAL_BLOCKS * 64
    assert check["recorded_final_val_loss"] == recorded
    assert check["agree"] and check["relative_difference"] <= 1e-4
    assert check["perplexity"] == pytest.approx(math.exp(check["loss"]))
    # An fp32 run is scored in fp32, within the fixed tolerance alone.
    assert check["scored_in"] == "fp32" and check["loss_fp32"] == check["loss"] and check["tolerance"] == 1e-4


BF16_SCORED_IN = {"single": "bf16 autocast", "fsdp": "bf16 parameters (as FSDP's mixed precision) and autocast"}


@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy", list(BF16_SCORED_IN))
def test_a_bf16_export_is_scored_in_bf16_and_agrees(
    bf16_runs: dict[str, Path], strategy: str, capsys, monkeypatch
) -> None:
    recorded = json.loads((bf16_runs[strategy] / "summary.json").read_text())["total"]["final_val_loss"]
    assert recorded < math.log(50257) - 1.0  # trained away from the uniform guess, so agreement says something
    result = _check(bf16_runs[strategy], False, capsys, monkeypatch)
    assert result.returncode == 0, result.stderr[-2000:]
    check = json.loads(result.stdout)
    assert check["scored_in"] == BF16_SCORED_IN[strategy] and check["agree"]
    assert check["loss"] != check["loss_fp32"]  # bf16 really in effect when scoring
    # The allowance is bf16's rounding on these blocks: more than fp32's 1e-4, far less than a wrong weight.
    assert 0 < check["rounding_allowance"] and 1e-4 < check["tolerance"] < 1e-2
    assert "per-token" in check["tolerance_method"]
    if strategy == "fsdp":  # bf16 parameters shift the loss: the fp32 score is further from the record
        fp32_difference = abs(check["loss_fp32"] - recorded) / recorded
        assert fp32_difference > check["relative_difference"]


@pytest.mark.multiprocess
def test_a_bf16_export_of_other_weights_differs(bf16_runs: dict[str, Path], tmp_path: Path, capsys) -> None:
    run_dir = _copy_run(bf16_runs["fsdp"], tmp_path / "changed")
    _scale_embedding(run_dir, 1.1)
    assert export_check.main([str(run_dir)]) == export_check.EXIT_DIFFER
    captured = capsys.readouterr()
    assert f"scored in {BF16_SCORED_IN['fsdp']}" in captured.out
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "differ (scored in bf16 parameters" in err[0]


def _scale_embedding(run_dir: Path, factor: float) -> None:
    weights = run_dir / "hf" / "model.safetensors"
    state = {k: v.clone() for k, v in load_file(weights).items()}
    state["transformer.wte.weight"] *= factor
    save_file(state, weights, metadata={"format": "pt"})


def _copy_run(run_dir: Path, to: Path) -> Path:
    shutil.copytree(run_dir, to, ignore=shutil.ignore_patterns("checkpoints", "wandb"))
    return to


@pytest.mark.multiprocess
def test_an_export_of_other_weights_differs_with_exit_1(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = _copy_run(runs["single"], tmp_path / "changed")
    _scale_embedding(run_dir, 1.1)
    assert export_check.main([str(run_dir)]) == export_check.EXIT_DIFFER
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "differ" in err[0]


def test_a_folder_that_is_not_a_run_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert export_check.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {tmp_path} is not a run directory (no config.json and summary.json)"]


@pytest.mark.multiprocess
def test_a_run_without_export_is_one_error_line(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = _copy_run(runs["single"], tmp_path / "no_export")
    shutil.rmtree(run_dir / "hf")
    assert export_check.main([str(run_dir), "--json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "no Hugging Face export" in err[0]


@pytest.mark.multiprocess
def test_the_experiment_driver_checks_every_export(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from analysis.experiment import EXIT_FAILED, EXIT_OK, check_exports

    assert check_exports(list(runs.values())) == EXIT_OK
    assert capsys.readouterr().out.count("export check: ") == len(runs)
    changed = _copy_run(runs["single"], tmp_path / "changed")
    save_file(
        {
            k: v * 1.1 if k == "transformer.wte.weight" else v
            for k, v in load_file(changed / "hf" / "model.safetensors").items()
        },
        changed / "hf" / "model.safetensors",
        metadata={"format": "pt"},
    )
    assert check_exports([changed]) == EXIT_FAILED
    assert "differ" in capsys.readouterr().err
