"""Untidy corpora, as public ones come: one large file, stray bytes that are not UTF-8, mixed line
ends, byte-order marks, very long lines, CSVs with quotes and newlines in their values, empty rows."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from data import DataError, build_datasets, load_tokenizer
from data.clean import clean_text
from data.prepare import main as prepare_main
from data.sources import describe, read_corpus
from tests.test_data_support import config, log_sink, write_kaggle_csv

EOT = 50256


def book(words: int, seed: int = 0) -> str:
    """A long text of varied made-up words in sentences and paragraphs, like a book in one file."""
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ren", "tu", "sa", "vel", "or", "an", "thi", "qu", "es", "dor", "pi"]
    vocab = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(3000)]
    parts, n = [], 0
    while n < words:
        sentence = " ".join(rng.choice(vocab) for _ in range(rng.randint(5, 18)))
        parts.append(sentence.capitalize() + rng.choice(".!?.") + ("\n\n" if rng.random() < 0.1 else " "))
        n += sentence.count(" ") + 1
    return "".join(parts)


def stream(ds) -> np.ndarray:
    """All tokens of a split, block after block."""
    return np.concatenate([ds.block(i) for i in range(len(ds))]) if len(ds) else np.zeros(0, np.int64)


def corpus_of(tmp_path: Path, **overrides):
    cfg = config(tmp_path, **overrides)
    return read_corpus(describe(cfg, tmp_path / "hf"), cfg)


def texts_of(tmp_path: Path, **overrides) -> list[str]:
    return corpus_of(tmp_path, **overrides).table.column("text").to_pylist()


# ----------------------------------------------------------------------------- one large file


@pytest.fixture(scope="module")
def one_book(tmp_path_factory) -> tuple[Path, str]:
    text = book(140_000)  # about 300,000 GPT-2 tokens
    path = tmp_path_factory.mktemp("book") / "book.txt"
    path.write_text(text, encoding="utf-8")
    return path, text


def test_one_large_file_holds_out_the_tail_of_its_token_stream(tmp_path: Path, one_book):
    path, text = one_book
    lines, log = log_sink()
    data = build_datasets(config(tmp_path, paths=[str(path)], block_size=64), log=log)
    s = data.stats
    assert s.split_by == "token_stream"
    blocks = s.train.blocks + s.val.blocks
    assert blocks > 4000 and s.val.blocks == int(0.05 * blocks) and len(data.val) == s.val.blocks
    said = [line for line in lines if "holding out the tail of the token stream" in line]
    assert len(said) == 1 and f"last {s.val.blocks:,} of {blocks:,} blocks" in said[0]
    assert any(line.startswith("data: val") and "(the tail of the token stream)" in line for line in lines)
    # Training is the head of the document's tokens and validation the blocks that follow it.
    expected = load_tokenizer()(clean_text(text))["input_ids"] + [EOT]
    assert s.train.tokens + s.val.tokens == len(expected) and s.train.tokens_dropped == 0
    assert s.val.tokens_dropped == len(expected) % 65
    assert np.concatenate([stream(data.train), stream(data.val)]).tolist() == expected[: blocks * 65]
    assert s.train.documents == s.val.documents == 1  # the one document straddles the cut


def test_a_few_documents_that_cannot_be_split_by_document_count_the_straddling_one_twice(tmp_path: Path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a_preface.txt").write_text("A short preface of a few words.", encoding="utf-8")
    (corpus / "b_book.txt").write_text(book(3000), encoding="utf-8")
    lines, log = log_sink()
    data = build_datasets(config(tmp_path, paths=[str(corpus)], block_size=64), log=log)
    assert data.stats.split_by == "token_stream" and len(data.train) >= 1 and len(data.val) >= 1
    assert data.stats.train.documents == 2 and data.stats.val.documents == 1
    assert not any("holding out 1 document(s)" in line for line in lines)  # the document split was not used


def test_one_document_of_exactly_two_blocks_gives_one_block_each(tmp_path: Path):
    tok = load_tokenizer()
    words = book(200).split()
    n = next(n for n in range(10, len(words)) if len(tok(" ".join(words[:n]))["input_ids"]) + 1 >= 2 * 33)
    path = tmp_path / "two_blocks.txt"
    path.write_text(" ".join(words[:n]), encoding="utf-8")
    _, log = log_sink()
    data = build_datasets(config(tmp_path, paths=[str(path)], block_size=32), log=log)
    assert data.stats.split_by == "token_stream" and len(data.train) == len(data.val) == 1


def test_split_by_document_is_kept_whenever_it_works(tmp_path: Path):
    path = write_kaggle_csv(tmp_path / "a.csv", [book(150, seed=i) for i in range(30)])
    lines, log = log_sink()
    data = build_datasets(config(tmp_path, paths=[str(path)], block_size=32, val_fraction=0.2), log=log)
    assert data.stats.split_by == "document" and data.stats.train.documents + data.stats.val.documents == 30
    assert not any("token stream" in line for line in lines)


def test_cache_entries_of_the_two_split_methods_stay_apart(tmp_path: Path):
    # A long document and a shorter one: at 16 tokens a block either can be validation and the other
    # training; at 1024 the shorter one is less than a block, so they cannot be split by document.
    path = write_kaggle_csv(tmp_path / "a.csv", [book(3000), book(300, seed=1)])
    first = {
        bs: build_datasets(config(tmp_path, paths=[str(path)], block_size=bs), log=log_sink()[1]) for bs in (16, 1024)
    }
    assert first[16].stats.split_by == "document" and first[1024].stats.split_by == "token_stream"
    assert first[16].stats.cache_key != first[1024].stats.cache_key
    for bs, before in first.items():
        lines, log = log_sink()
        again = build_datasets(config(tmp_path, paths=[str(path)], block_size=bs), log=log)
        assert again.stats.cache_hit and again.stats.split_by == before.stats.split_by
        assert np.array_equal(stream(again.val), stream(before.val)) and again.stats.val == before.stats.val
        assert any(line.startswith("data: val") for line in lines)


# ----------------------------------------------------------------------------- bytes that are not UTF-8

BAD_BYTES = {3: b"\xff\xfe", 50: b"caf\xe9", 120: b"cut \xe2\x82 euro"}  # 2 + 1 + 2 bytes that are not UTF-8


@pytest.fixture
def folder_with_a_few_bad_files(tmp_path: Path) -> Path:
    folder = tmp_path / "texts"
    folder.mkdir()
    for i in range(200):
        body = f"Text file {i} holds a few words about item {i}. ".encode() * 3
        (folder / f"f{i:03d}.txt").write_bytes(body + BAD_BYTES.get(i, b""))
    return folder


def test_a_few_files_with_bytes_not_utf8_are_read_and_reported_in_one_line(tmp_path: Path, folder_with_a_few_bad_files):
    lines, log = log_sink()
    data = build_datasets(config(tmp_path, paths=[str(folder_with_a_few_bad_files)], block_size=32), log=log)
    assert data.stats.not_utf8_files == 3 and data.stats.not_utf8_bytes == 5 and len(data.train) > 10
    warnings = [line for line in lines if line.startswith("warning:")]
    assert len(warnings) == 1
    names = ", ".join(str(folder_with_a_few_bad_files / f"f{i:03d}.txt") for i in (3, 50, 120))
    assert warnings[0] == (
        f"warning: 3 of 200 files had bytes that are not UTF-8 (5 bytes, decoded as U+FFFD): {names}; "
        "--strict_utf8 refuses such files instead"
    )
    # A cache hit says it again: the run still trains on the replaced text.
    lines, log = log_sink()
    again = build_datasets(config(tmp_path, paths=[str(folder_with_a_few_bad_files)], block_size=32), log=log)
    assert again.stats.cache_hit and again.stats.not_utf8_bytes == 5
    assert [line for line in lines if line.startswith("warning:")] == warnings


def test_bad_bytes_become_replacement_characters(tmp_path: Path, folder_with_a_few_bad_files):
    corpus = corpus_of(tmp_path, paths=[str(folder_with_a_few_bad_files)])
    texts = corpus.table.column("text").to_pylist()
    # Python's errors="replace": one U+FFFD per invalid sequence, so the cut euro sign (2 bytes) is one.
    assert (
        texts[3].endswith("\ufffd\ufffd") and texts[50].endswith("caf\ufffd") and texts[120].endswith("cut \ufffd euro")
    )
    assert sum("\ufffd" in t for t in texts) == 3
    assert corpus.files_read == 200 and [n for _, n in corpus.not_utf8] == [2, 1, 2]


def test_more_files_with_bad_bytes_than_named_are_counted(tmp_path: Path):
    for i in range(5):
        (tmp_path / f"t{i}.txt").write_bytes(b"Words of a file with a stray byte \x80 in it. " * 4)
    lines, log = log_sink()
    build_datasets(config(tmp_path, paths=[str(tmp_path / "*.txt")], block_size=16), log=log)
    (warning,) = [line for line in lines if line.startswith("warning:")]
    assert "5 of 5 files" in warning and "(20 bytes," in warning and f"{tmp_path / 't2.txt'} and 2 more;" in warning


@pytest.mark.parametrize("suffix", ["csv", "json", "jsonl"])
def test_bad_bytes_in_structured_files_are_replaced_too(tmp_path: Path, suffix: str):
    path = tmp_path / f"x.{suffix}"
    raw = {
        "csv": b"title,content\nT,caf\xe9 au lait\n",
        "json": b'[{"text": "caf\xe9 au lait"}]',
        "jsonl": b'{"text": "caf\xe9 au lait"}\n',
    }[suffix]
    path.write_bytes(raw)
    corpus = corpus_of(tmp_path, paths=[str(path)])
    assert corpus.table.column("text").to_pylist() == ["caf\ufffd au lait"] and corpus.not_utf8 == [(str(path), 1)]


def test_strict_utf8_refuses_what_a_lenient_run_cached(tmp_path: Path, folder_with_a_few_bad_files):
    _, log = log_sink()
    build_datasets(config(tmp_path, paths=[str(folder_with_a_few_bad_files)], block_size=32), log=log)
    with pytest.raises(DataError) as err:
        build_datasets(
            config(tmp_path, paths=[str(folder_with_a_few_bad_files)], block_size=32, strict_utf8=True), log=log
        )
    first_bad = folder_with_a_few_bad_files / "f003.txt"
    offset = first_bad.read_bytes().index(BAD_BYTES[3])
    assert str(err.value).startswith(f"{first_bad}: not UTF-8 text (bad byte at offset {offset})")


def test_cli_strict_utf8_is_one_line_and_exit_2(tmp_path: Path, capsys):
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"Enough words to fill a few blocks of tokens, caf\xe9 included. " * 10)
    args = ["--data", str(path), "--block_size", "16", "--cache_dir", str(tmp_path / "c"), "--num_proc", "1"]
    assert prepare_main(args + ["--strict_utf8"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and str(path) in err and "offset 48" in err
    assert prepare_main(args) == 0
    out = capsys.readouterr().out
    assert "warning: 1 of 1 files had bytes that are not UTF-8 (10 bytes" in out and '"not_utf8_bytes": 10' in out


# ----------------------------------------------------------------------------- line ends, BOM, long lines, CSV quoting


def test_txt_with_mixed_line_ends(tmp_path: Path):
    (tmp_path / "mixed.txt").write_bytes(b"one\r\ntwo\rthree\nfour\r\n\r\nfive\r")
    assert texts_of(tmp_path, paths=[str(tmp_path / "mixed.txt")]) == ["one\ntwo\nthree\nfour\n\nfive\n"]


def test_csv_with_mixed_line_ends_inside_and_between_rows(tmp_path: Path):
    path = tmp_path / "mixed.csv"
    path.write_bytes(b'title,content\r\nA,"windows\r\nlines"\rB,"old mac\rline"\nC,"unix\nline"\r\n')
    assert texts_of(tmp_path, paths=[str(path)]) == ["windows\nlines", "old mac\nline", "unix\nline"]
    assert texts_of(tmp_path, paths=[str(path)], prepend_title=True)[0] == "A\n\nwindows\nlines"


def test_jsonl_with_crlf_lines_and_unicode_line_separators_in_values(tmp_path: Path):
    rows = [{"text": "a\u2028b\u2029c\x85d"}, {"text": "second"}]
    path = tmp_path / "x.jsonl"
    path.write_bytes("\r\n".join(json.dumps(r, ensure_ascii=False) for r in rows).encode() + b"\r\n")
    assert texts_of(tmp_path, paths=[str(path)]) == ["a\u2028b\u2029c\x85d", "second"]


@pytest.mark.parametrize("suffix", ["txt", "csv", "json", "jsonl"])
def test_a_byte_order_mark_is_not_text(tmp_path: Path, suffix: str):
    body = {
        "txt": "Plain text.",
        "csv": "content,title\nPlain text.,T\n",
        "json": '[{"text": "Plain text."}]',
        "jsonl": '{"text": "Plain text."}\n',
    }[suffix]
    path = tmp_path / f"bom.{suffix}"
    path.write_bytes(b"\xef\xbb\xbf" + body.encode())
    # The CSV's first header column is "content": it is found, not "\ufeffcontent".
    assert texts_of(tmp_path, paths=[str(path)]) == ["Plain text."]


def test_bom_and_crlf_csv_as_spreadsheets_export_it(tmp_path: Path):
    path = tmp_path / "export.csv"
    path.write_bytes(b'\xef\xbb\xbfcontent,id\r\n"First, with ""quotes""\r\nand a line",1\r\nSecond,2\r\n')
    assert texts_of(tmp_path, paths=[str(path)]) == ['First, with "quotes"\nand a line', "Second"]


def test_very_long_lines(tmp_path: Path):
    line = book(600_000, seed=1).replace("\n", " ")  # one line of several MB
    assert len(line) > 3_000_000
    (tmp_path / "long.txt").write_text(line, encoding="utf-8")
    write_kaggle_csv(tmp_path / "long.csv", ["short one", line, "short two"])
    (tmp_path / "long.jsonl").write_text(
        json.dumps({"text": line}) + "\n" + json.dumps({"text": "after"}), encoding="utf-8"
    )
    assert texts_of(tmp_path, paths=[str(tmp_path / "long.txt")]) == [line]
    assert texts_of(tmp_path, paths=[str(tmp_path / "long.csv")]) == ["short one", line, "short two"]
    assert texts_of(tmp_path, paths=[str(tmp_path / "long.jsonl")]) == [line, "after"]


def test_csv_with_quotes_newlines_and_empty_rows_as_all_the_news_has(tmp_path: Path):
    path = tmp_path / "articles1.csv"
    path.write_text(
        ",id,title,publication,author,date,year,month,url,content\n"
        '0,17283,"House Republicans Fret About Winning, Again",New York Times,Carl Hulse,2016-12-31,2016.0,12.0,,'
        '"WASHINGTON — Congressional Republicans said ""we will win"", then:\n\nA new paragraph, with commas."\n'
        "\n"  # a blank line between rows
        "1,17284,Title only,Breitbart,,2017-01-01,2017.0,1.0,,\n"  # a row whose content is empty
        ",,,,,,,,,\n"  # a row of empty fields
        '2,17285,Quote at the ends,CNN,,2017-01-02,2017.0,1.0,,"""Quoted,"" she said"\n'
        "\n\n",  # blank lines at the end
        encoding="utf-8",
    )
    assert texts_of(tmp_path, paths=[str(path)]) == [
        'WASHINGTON — Congressional Republicans said "we will win", then:\n\nA new paragraph, with commas.',
        "",
        "",
        '"Quoted," she said',
    ]
    _, log = log_sink()
    data = build_datasets(config(tmp_path, paths=[str(path)], block_size=8, val_fraction=0.0), log=log)
    assert data.stats.documents_read == 4 and data.stats.documents_empty == 2
