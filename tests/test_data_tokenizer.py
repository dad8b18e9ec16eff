"""The bundled GPT-2 tokenizer: right vocabulary, verified files, usable fingerprints."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from data import DataError, load_tokenizer
from data.tokenizer import EOT_ID, _bundled_files_dir, load_gpt2_from_files, tokenizer_fingerprint


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def test_bundled_tokenizer_is_gpt2(tok):
    assert len(tok) == 50257
    assert tok.eos_token_id == tok.bos_token_id == tok.unk_token_id == EOT_ID == 50256
    assert tok.convert_ids_to_tokens(50256) == "<|endoftext|>"
    assert tok("Hello world")["input_ids"] == [15496, 995]


def test_round_trip_unicode(tok):
    text = "Café Ünïcode — “curly quotes”, naïve Kraków, 日本語 and an emoji 🙂.\n\nNew paragraph."
    assert tok.decode(tok(text)["input_ids"]) == text


def test_long_documents_do_not_warn(tok, caplog):
    ids = tok(" word" * 5000)["input_ids"]
    assert len(ids) == 5000
    assert "longer than the specified maximum" not in caplog.text


def test_tampered_vocabulary_is_rejected(tmp_path: Path):
    for name in ("encoder.json", "vocab.bpe"):
        shutil.copy(_bundled_files_dir() / name, tmp_path / name)
    assert len(load_gpt2_from_files(tmp_path)) == 50257  # the untouched copy loads
    raw = bytearray((tmp_path / "vocab.bpe").read_bytes())
    raw[100] ^= 0x01
    (tmp_path / "vocab.bpe").write_bytes(bytes(raw))
    with pytest.raises(DataError) as err:
        load_gpt2_from_files(tmp_path)
    message = str(err.value)
    assert str(tmp_path / "vocab.bpe") in message and "1ce1664773c5" in message and "\n" not in message


def test_fingerprint_follows_behaviour_not_name(tok, tmp_path: Path):
    same = tmp_path / "same"
    tok.save_pretrained(same)
    assert tokenizer_fingerprint(load_tokenizer(str(same))) == tokenizer_fingerprint(tok)
    other = load_tokenizer(str(same))
    other.add_tokens(["<|pad|>"])
    assert tokenizer_fingerprint(other) != tokenizer_fingerprint(tok)


def test_unloadable_tokenizer_is_a_data_error(tmp_path: Path):
    with pytest.raises(DataError, match=str(tmp_path / "empty")):
        (tmp_path / "empty").mkdir()
        load_tokenizer(str(tmp_path / "empty"))
