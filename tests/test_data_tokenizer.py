"""The bundled GPT-2 tokenizer: right vocabulary, verified files, usable fingerprints."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from data import DataConfig, DataError, load_tokenizer
from data.clean import clean_text
from data.sources import describe, read_documents
from data.tokenizer import (
    EOT_ID,
    _bundled_files_dir,
    load_document_tokenizer,
    load_gpt2_from_files,
    tokenizer_fingerprint,
)


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
    # The pipeline's two implementations of GPT-2 fingerprint apart, though their ids are the same.
    fast, transformers_path = load_document_tokenizer(), load_document_tokenizer(str(same))
    assert fast.fingerprint() == load_document_tokenizer().fingerprint()
    assert transformers_path.fingerprint() == tokenizer_fingerprint(tok) != fast.fingerprint()
    assert (fast.vocab_size, fast.eot_id) == (transformers_path.vocab_size, transformers_path.eot_id) == (50257, EOT_ID)


def test_unloadable_tokenizer_is_a_data_error(tmp_path: Path):
    with pytest.raises(DataError, match=str(tmp_path / "empty")):
        (tmp_path / "empty").mkdir()
        load_tokenizer(str(tmp_path / "empty"))


# ----------------------------------------------------------------------------- tiktoken, the pipeline's GPT-2

EDGE_CASES = [
    "Hello world",
    "Emoji 🙂🚀👩‍👩‍👧 and flags 🇫🇷🇯🇵, and a lone 🏳️‍🌈.",
    "Windows\r\nline ends\r\n\r\nand a lone\rCR",
    "   leading, trailing and inner runs     of spaces\t\t\ttabs \n\n\n\n  and   newlines   ",
    " " * 300 + "x" + "\n" * 50 + "y" + "\t " * 40,
    "<|endoftext|>at the start, <|endoftext|> in the middle,<|endoftext|><|endoftext|> twice, and at the end<|endoftext|>",
    " <|endoftext|> ",
    "<|endoftext| not quite, <|endoftext>, |endoftext|>",
    "Contractions: it's, I'M, we'll, they've, you're, she'd, o'clock, rock 'n' roll",
    "Numbers 1234567890, 3.14159, 1,000,000 and ١٢٣ and ½",
    "日本語のテキスト、中文文本，한국어 텍스트, Ελληνικά, русский текст, עברית, العربية, हिन्दी",
    "Combining: e\u0301, Zalgo z\u0351\u0352\u0353, zero\u200bwidth, nbsp\u00a0here, BOM\ufeffinside",
    "\u2028line separator\u2029paragraph separator\u0085next line",
]


def test_tiktoken_gives_transformers_ids_on_real_and_edge_case_text(tok):
    cfg = DataConfig()  # the bundled sample: real articles' mix of quotes, dashes, accents and HTML
    raw = read_documents(describe(cfg, Path("unused")), cfg).column("text").to_pylist()
    texts = raw + [clean_text(t) for t in raw] + EDGE_CASES + ["".join(EDGE_CASES)]
    fast = load_document_tokenizer()
    expected = tok(texts, add_special_tokens=False)["input_ids"]
    got = [ids.tolist() for ids in fast.encode(texts)]
    assert sum(map(len, expected)) > 20_000
    mismatched = [t[:60] for t, a, b in zip(texts, got, expected) if a != b]
    assert mismatched == []
    assert got[len(raw) * 2 + 5] == [EOT_ID, *expected[len(raw) * 2 + 5][1:]]  # <|endoftext|> in text is EOT
