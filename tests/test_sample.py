import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from data.tokenizer import load_tokenizer
from model import GPT2, GPT2Config
from model.hf import save_hf
from training.sample import ModelPathError, main, resolve_model, resolve_tokenizer

REPO = Path(__file__).resolve().parents[1]
PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    """A run directory as train.py leaves it: its own config.json, and the model in hf/ with the tokenizer."""
    run = tmp_path_factory.mktemp("run")
    (run / "config.json").write_text(json.dumps({"model": {"preset": "tiny"}}))
    torch.manual_seed(0)
    save_hf(GPT2(GPT2Config.from_preset("tiny")), run / "hf", tokenizer=load_tokenizer())
    return run


def cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "training.sample", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_resolve_model_reads_a_hugging_face_folder(export):
    model = resolve_model(export / "hf")
    assert model.config == GPT2Config.from_preset("tiny")


def test_resolve_model_finds_hf_inside_a_run_directory(export):
    # the run's own config.json is not a model config and must not be mistaken for one
    assert resolve_model(export).config == GPT2Config.from_preset("tiny")


def test_resolve_model_rejects_a_missing_path(tmp_path):
    with pytest.raises(ModelPathError, match="no such file or folder"):
        resolve_model(tmp_path / "missing")


def test_resolve_model_rejects_a_folder_that_holds_no_model(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ModelPathError, match="not a model"):
        resolve_model(tmp_path)


def test_tokenizer_saved_with_the_model_is_preferred(tmp_path):
    tok = load_tokenizer()
    tok.add_tokens(["<|marker|>"])  # tells this tokenizer from the default one
    model = GPT2(GPT2Config.from_preset("tiny"))
    save_hf(model, tmp_path / "with" / "hf", tokenizer=tok)
    save_hf(model, tmp_path / "without" / "hf")
    assert len(resolve_tokenizer(tmp_path / "with")) == len(tok)
    assert len(resolve_tokenizer(tmp_path / "without")) == len(load_tokenizer())


def test_cli_prints_the_prompt_then_a_seeded_reproducible_continuation(export):
    args = ("--model", str(export), "--prompt", PROMPT, "--max_new_tokens", "8", "--temperature", "1.0")
    # started together: each run is mostly interpreter and library start-up
    runs = [cli(*args, "--seed", "3"), cli(*args, "--seed", "3"), cli(*args, "--seed", "4")]
    (out1, err1), (out2, _), (out3, _) = [p.communicate(timeout=120) for p in runs]
    assert [p.returncode for p in runs] == [0, 0, 0], err1
    assert out1.startswith(PROMPT) and len(out1.rstrip("\n")) > len(PROMPT)
    assert out1 == out2
    assert out1 != out3


def test_cli_exits_2_with_one_line_for_a_missing_path(tmp_path):
    p = cli("--model", str(tmp_path / "missing"), "--prompt", PROMPT, "--max_new_tokens", "3")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 2
    assert out == ""
    assert err.count("\n") == 1 and "no such file or folder" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "extra, message",
    [
        (("--max_new_tokens", "-1"), "--max_new_tokens must be >= 0"),
        (("--temperature", "-0.5"), "--temperature must be >= 0"),
        (("--top_k", "0"), "--top_k must be >= 1"),
        (("--max_new_tokens", "many"), "invalid int value"),
    ],
)
def test_cli_rejects_bad_arguments_in_one_line(export, capsys, extra, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", str(export), "--prompt", PROMPT, *extra])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_cli_exits_2_for_a_folder_that_holds_no_model(tmp_path, capsys):
    assert main(["--model", str(tmp_path), "--prompt", PROMPT]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a model" in err


def test_cli_greedy_matches_generate_with_temperature_zero(export, capsys):
    assert main(["--model", str(export / "hf"), "--prompt", PROMPT, "--max_new_tokens", "5", "--temperature", "0"]) == 0
    tok = load_tokenizer(str(export / "hf"))
    model = resolve_model(export).eval()
    prompt_ids = torch.tensor([tok(PROMPT).input_ids])
    expected = PROMPT + tok.decode(model.generate(prompt_ids, 5, temperature=0)[0, prompt_ids.shape[1] :].tolist())
    assert capsys.readouterr().out == expected + "\n"
