"""Readers: every supported format yields the right documents, in order."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data.config import SAMPLE_CSV
from data.sources import describe, read_documents, resolve_files
from tests.test_data_support import KAGGLE_HEADER, config, write_kaggle_csv


def texts_of(tmp_path: Path, **overrides) -> list[str]:
    cfg = config(tmp_path, **overrides)
    return read_documents(describe(cfg, tmp_path / "hf"), cfg).column("text").to_pylist()


def test_bundled_sample_parses_as_forty_articles(tmp_path: Path):
    with open(SAMPLE_CSV, encoding="utf-8") as f:
        assert f.readline().rstrip("\n").split(",") == KAGGLE_HEADER
    texts = texts_of(tmp_path)  # no paths: the sample
    assert len(texts) == 40
    assert all(120 <= len(t.split()) <= 260 for t in texts)
    assert any("\n\n" in t for t in texts) and any('"' in t for t in texts)


def test_kaggle_csv_with_multiline_quoted_content(tmp_path: Path):
    contents = ['He said "no, never".\nThen, a new line.', "Plain one", 'Commas, "quotes", and\n\nparagraphs']
    path = write_kaggle_csv(tmp_path / "articles1.csv", contents)
    assert path.read_text().count("\n") > len(contents) + 1  # the newlines really are inside fields
    assert texts_of(tmp_path, paths=[str(path)]) == contents


def test_prepend_title_puts_title_and_blank_line_first(tmp_path: Path):
    path = write_kaggle_csv(tmp_path / "a.csv", ["Body text.", ""], titles=["Headline", "Title of nothing"])
    # The second article has no content: a headline alone stays an empty document.
    assert texts_of(tmp_path, paths=[str(path)], prepend_title=True) == ["Headline\n\nBody text.", ""]


def test_txt_is_one_document_per_file(tmp_path: Path):
    (tmp_path / "b.txt").write_text("second file\nwith two lines", encoding="utf-8")
    (tmp_path / "a.txt").write_text("first file", encoding="utf-8")
    assert texts_of(tmp_path, paths=[str(tmp_path / "*.txt")]) == ["first file", "second file\nwith two lines"]


def test_jsonl_and_json_array_read_the_text_field(tmp_path: Path):
    rows = [{"text": "one", "id": 1}, {"text": "two\nlines", "id": 2}]
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    (tmp_path / "d.json").write_text(json.dumps(rows), encoding="utf-8")
    assert texts_of(tmp_path, paths=[str(tmp_path / "c.jsonl")]) == ["one", "two\nlines"]
    assert texts_of(tmp_path, paths=[str(tmp_path / "d.json")]) == ["one", "two\nlines"]


def test_json_lines_with_json_suffix_and_custom_column(tmp_path: Path):
    (tmp_path / "e.json").write_text('{"body": "x"}\n{"body": "y"}\n', encoding="utf-8")
    assert texts_of(tmp_path, paths=[str(tmp_path / "e.json")], text_column="body") == ["x", "y"]


def test_parquet_reads_text_column(tmp_path: Path):
    pq.write_table(pa.table({"text": ["p1", None, "p3"], "n": [1, 2, 3]}), tmp_path / "f.parquet")
    assert texts_of(tmp_path, paths=[str(tmp_path / "f.parquet")]) == ["p1", "", "p3"]


def test_folder_is_read_recursively_in_sorted_order(tmp_path: Path):
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    write_kaggle_csv(corpus / "articles2.csv", ["csv doc"])
    (corpus / "sub" / "z.txt").write_text("txt doc", encoding="utf-8")
    (corpus / "notes.md").write_text("ignored: not a corpus format", encoding="utf-8")
    assert [f.path.name for f in resolve_files([str(corpus)])] == ["articles2.csv", "z.txt"]
    assert texts_of(tmp_path, paths=[str(corpus)]) == ["csv doc", "txt doc"]


def test_a_file_named_twice_is_read_once(tmp_path: Path):
    path = write_kaggle_csv(tmp_path / "articles1.csv", ["only once"])
    assert texts_of(tmp_path, paths=[str(path), str(tmp_path / "articles*.csv")]) == ["only once"]


def test_max_documents_takes_the_first_n(tmp_path: Path):
    a = write_kaggle_csv(tmp_path / "a.csv", ["a0", "a1"])
    b = write_kaggle_csv(tmp_path / "b.csv", ["b0", "b1"])
    assert texts_of(tmp_path, paths=[str(a), str(b)], max_documents=3) == ["a0", "a1", "b0"]


def test_hf_builder_over_local_files(tmp_path: Path):
    (tmp_path / "g.jsonl").write_text('{"text": "hf one"}\n{"text": "hf two"}\n', encoding="utf-8")
    assert texts_of(tmp_path, hf_dataset="json", paths=[str(tmp_path / "g.jsonl")]) == ["hf one", "hf two"]
    csv_path = write_kaggle_csv(tmp_path / "h.csv", ["hf csv\nmultiline"])
    assert texts_of(tmp_path, hf_dataset="csv", paths=[str(csv_path)], text_column="content") == ["hf csv\nmultiline"]


def test_hf_dataset_saved_to_disk(tmp_path: Path):
    import datasets

    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["s1", "s2"]})}).save_to_disk(tmp_path / "saved")
    assert texts_of(tmp_path, hf_dataset=str(tmp_path / "saved"), hf_split="train") == ["s1", "s2"]


@pytest.mark.parametrize("edit", ["content", "append"])
def test_source_key_follows_content_not_name(tmp_path: Path, edit: str):
    path = write_kaggle_csv(tmp_path / "a.csv", ["first version"])
    before = describe(config(tmp_path, paths=[str(path)]), tmp_path).key
    moved = tmp_path / "moved.csv"
    path.rename(moved)
    assert describe(config(tmp_path, paths=[str(moved)]), tmp_path).key == before
    if edit == "content":
        write_kaggle_csv(moved, ["first versioN"])
    else:
        moved.write_text(moved.read_text() + "1,1001,T,P,A,2017-01-01,2017.0,1.0,,more\n")
    assert describe(config(tmp_path, paths=[str(moved)]), tmp_path).key != before
