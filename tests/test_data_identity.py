"""The packed bytes are what a plain in-memory pipeline gives for the same inputs.

The reference below reads every file whole with Python's own csv and json modules, cleans, tokenizes
with transformers' GPT2TokenizerFast, splits and packs, all in memory, in the fewest lines that
state the rules of docs/data.md. Whatever the pipeline does to be fast or to bound its memory
(streaming, worker processes, another tokenizer implementation, caching tokenized documents), its
packed files and statistics must equal this.
"""

from __future__ import annotations

import codecs
import csv
import functools
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest

from data import DataConfig, build_datasets, documents, load_tokenizer, sources
from data.clean import clean_text, is_empty
from data.config import SAMPLE_CSV
from data.packing import assign_validation, document_hash
from tests.test_data_support import article, config, log_sink, write_kaggle_csv
from tests.test_data_untidy import book

_LINE_END = re.compile(r"\r\n?")


def _unix(text: str) -> str:
    return _LINE_END.sub("\n", text)


def _reference_documents(path: Path, cfg: DataConfig) -> tuple[list[str], int]:
    """The raw documents of one file and its count of bytes that are not UTF-8."""
    raw = path.read_bytes()
    text = raw.decode("utf-8", "replace").removeprefix(codecs.BOM_UTF8.decode())
    bad = len(re.findall("[\udc80-\udcff]", raw.decode("utf-8", "surrogateescape")))
    if path.suffix == ".txt":
        return [_unix(text)], bad
    if path.suffix == ".csv":
        rows = list(csv.DictReader(io.StringIO(text, newline="")))
        records = [{k: _unix(v) for k, v in row.items()} for row in rows]
    else:
        records = [json.loads(line) for line in _LINE_END.sub("\n", text).split("\n") if line.strip()]
    column = cfg.text_column or ("content" if path.suffix == ".csv" else "text")
    docs = []
    for record in records:
        body, title = record.get(column) or "", record.get("title") or ""
        titled = cfg.prepend_title and body.strip() and title.strip()
        docs.append(f"{title}\n\n{body}" if titled else body)
    return docs, bad


def _packed(tokens: list[list[int]], block_size: int) -> np.ndarray:
    flat = np.array([t for doc in tokens for t in doc], dtype=np.uint16)
    return flat[: len(flat) // (block_size + 1) * (block_size + 1)]


@functools.cache
def _transformers_gpt2():
    return load_tokenizer()


def reference(cfg: DataConfig, paths: list[Path]) -> dict:
    """Train and validation tokens and the statistics, computed all in memory."""
    read: list[tuple[list[str], int]] = []
    for path in paths:  # a file after the first max_documents is not read at all
        if cfg.max_documents is None or sum(len(docs) for docs, _ in read) < cfg.max_documents:
            read.append(_reference_documents(path, cfg))
    raw = [d for docs, _ in read for d in docs][: cfg.max_documents]
    texts = [t for t in (clean_text(d) if cfg.clean else d for d in raw) if not is_empty(t)]
    tok = _transformers_gpt2()
    tokens = [ids + [tok.eos_token_id] for ids in tok(texts, add_special_tokens=False)["input_ids"]]
    lengths = np.array([len(t) for t in tokens])
    hashes = np.array([document_hash(t, cfg.split_seed) for t in texts], dtype=np.int64)
    is_val = assign_validation(hashes, lengths, cfg.val_fraction, cfg.block_size, "reference", lambda _: None)
    per_block = cfg.block_size + 1
    if is_val is None:  # the tail of the token stream
        stream = _packed(tokens, cfg.block_size)
        blocks = len(stream) // per_block
        cut = (blocks - max(1, int(cfg.val_fraction * blocks))) * per_block
        train, val = stream[:cut], stream[cut:]
    else:
        train = _packed([t for t, v in zip(tokens, is_val) if not v], cfg.block_size)
        val = _packed([t for t, v in zip(tokens, is_val) if v], cfg.block_size)
    return {
        "train": train.tobytes(),
        "val": val.tobytes(),
        "documents_read": len(raw),
        "documents_empty": len(raw) - len(texts),
        "split_by": "document" if is_val is not None else "token_stream",
        "not_utf8_bytes": sum(bad for _, bad in read),
        "tokens": int(lengths.sum()),
    }


def pipeline(cfg: DataConfig) -> dict:
    data = build_datasets(cfg, log=log_sink()[1])
    s = data.stats
    return {
        "train": data.train.path.read_bytes(),
        "val": data.val.path.read_bytes(),
        "documents_read": s.documents_read,
        "documents_empty": s.documents_empty,
        "split_by": s.split_by,
        "not_utf8_bytes": s.not_utf8_bytes,
        "tokens": s.train.tokens + s.val.tokens,
    }


def _untidy_csv(path: Path) -> Path:
    """A Kaggle-layout CSV as spreadsheets and other platforms leave them: a byte-order mark, CRLF
    and lone CR line ends, bytes that are not UTF-8, empty rows, HTML, quotes, emoji and the
    end-of-text marker inside an article."""
    contents = [
        article(i, words=40 + 13 * i) + extra
        for i, extra in enumerate(
            [
                " <p>HTML &amp; entities</p>",
                "",
                ' He said "yes, and no", then left.\r\nNext line\rand a lone CR.',
                " Emoji 🙂🚀 and 日本語, Ελληνικά, русский.",
                " Text with <|endoftext|> inside it.",
                "   many     spaces\t\ttabs\n\n\n\nand blank lines",
            ]
            * 4
        )
    ]
    contents[5] = "   "  # empty after cleaning
    write_kaggle_csv(path, contents, titles=[f"Headline {i}" if i % 3 else "" for i in range(len(contents))])
    raw = path.read_bytes().replace(b"\n", b"\r\n").replace(b"Marker0007", b"Marker\xe90007")
    path.write_bytes(codecs.BOM_UTF8 + raw)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> list[Path]:
    folder = tmp_path_factory.mktemp("corpus")
    second = write_kaggle_csv(folder / "b.csv", [book(120, seed=i) for i in range(30)])
    jsonl = folder / "c.jsonl"
    jsonl.write_text("\n".join(json.dumps({"text": book(80, seed=100 + i), "title": f"T{i}"}) for i in range(12)))
    txt = folder / "d.txt"
    txt.write_bytes(b"A plain text file,\r\nwith Windows line ends and a stray \xff byte.\r\n" * 20)
    return [SAMPLE_CSV, _untidy_csv(folder / "a.csv"), second, jsonl, txt]


CASES = {
    "defaults": {},
    "small blocks, titles, workers": {"block_size": 32, "prepend_title": True, "val_fraction": 0.2, "num_proc": 2},
    "no cleaning, another seed": {"block_size": 48, "clean": False, "split_seed": 7},
    "first documents only": {"block_size": 24, "max_documents": 50, "val_fraction": 0.1},
}


@pytest.mark.parametrize("case", list(CASES))
def test_multi_file_corpus_packs_as_the_in_memory_reference(tmp_path: Path, files: list[Path], case: str):
    cfg = config(tmp_path, paths=[str(p) for p in files], **CASES[case])
    assert pipeline(cfg) == reference(cfg, files)


def test_streaming_in_small_blocks_and_batches_changes_nothing(tmp_path: Path, files: list[Path], monkeypatch):
    # CSV blocks far smaller than a row, so rows straddle blocks and the reader restarts with larger
    # ones; and batches that end inside files, so documents of several files share a batch.
    monkeypatch.setattr(sources, "CSV_BLOCK_BYTES", 512)
    monkeypatch.setattr(documents, "BATCH_DOCUMENTS", 7)
    cfg = config(tmp_path, paths=[str(p) for p in files], block_size=32, prepend_title=True, num_proc=2)
    assert pipeline(cfg) == reference(cfg, files)


def test_bundled_sample_packs_as_the_in_memory_reference(tmp_path: Path):
    cfg = config(tmp_path)
    got = pipeline(cfg)
    assert got == reference(cfg, [SAMPLE_CSV]) and len(got["train"]) == 8 * 1025 * 2


def test_one_long_document_packs_as_the_in_memory_reference(tmp_path: Path):
    path = tmp_path / "book.txt"
    path.write_text(book(3000), encoding="utf-8")
    cfg = config(tmp_path, paths=[str(path)], block_size=64)
    got = pipeline(cfg)
    assert got == reference(cfg, [path]) and got["split_by"] == "token_stream"
