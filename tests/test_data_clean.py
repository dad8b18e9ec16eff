"""Cleaning as in the reference experiment: no HTML, decoded entities, tidy whitespace, case kept."""

from __future__ import annotations

from pathlib import Path

from data import build_datasets, load_tokenizer
from data.clean import clean_text
from data.documents import clean_documents
from tests.test_data_support import config, log_sink, write_kaggle_csv


def test_tags_are_stripped_and_block_tags_break_lines():
    assert (
        clean_text('<p>One <b>bold</b> <a href="x">link</a>.</p><p>Two<br>lines</p>') == "One bold link.\n\nTwo\nlines"
    )


def test_script_style_and_comments_are_removed():
    assert clean_text("Keep<script>var x = '<p>';</script><style>p{}</style><!-- note --> this") == "Keep this"


def test_entities_are_decoded_after_tags_are_stripped():
    # An escaped tag is text the author meant to show, so it must survive as text.
    assert clean_text("caf&eacute; &amp; &#8212; &lt;b&gt;not a tag&lt;/b&gt; &nbsp;x") == "café & — <b>not a tag</b> x"


def test_comparison_signs_are_not_mistaken_for_tags():
    assert clean_text("if 3 < 5 and 7 > 2") == "if 3 < 5 and 7 > 2"


def test_whitespace_is_normalised_but_paragraphs_kept():
    raw = "  First\t\tline   here \r\nsecond line\n\n\n\n  Next   paragraph\u00a0end.  "
    assert clean_text(raw) == "First line here\nsecond line\n\nNext paragraph end."


def test_case_and_punctuation_are_preserved():
    text = "NASA’s CEO said: “Yes!” — iPhone, McDonald's."
    assert clean_text(text) == text


def test_empty_documents_are_dropped():
    assert clean_documents(["<p> </p>", "  \n ", "Real text", "&nbsp;"], clean=True) == ["Real text"]
    assert clean_documents(["<p> </p>", "  \n ", "Real text"], clean=False) == ["<p> </p>", "Real text"]


def test_pipeline_counts_dropped_empty_documents(tmp_path: Path):
    docs = ["<div></div>", "Kept article " * 30, "   ", "Another kept one " * 30]
    path = write_kaggle_csv(tmp_path / "a.csv", docs)
    lines, log = log_sink()
    data = build_datasets(config(tmp_path, paths=[str(path)], block_size=16, val_fraction=0.0), log=log)
    assert data.stats.documents_read == 4 and data.stats.documents_empty == 2
    assert data.stats.train.documents == 2


def test_clean_false_keeps_markup(tmp_path: Path):
    path = write_kaggle_csv(tmp_path / "a.csv", ["<b>Bold</b> &amp; raw " * 20])
    _, log = log_sink()
    data = build_datasets(config(tmp_path, paths=[str(path)], block_size=32, val_fraction=0.0, clean=False), log=log)
    decoded = load_tokenizer().decode(data.train.block(0).tolist())
    assert decoded.startswith("<b>Bold</b> &amp;")
