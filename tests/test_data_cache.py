"""The packed-data cache: reused when nothing changed, rebuilt when anything that matters did, and
never trusted half-written."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from data import build_datasets, load_tokenizer, pipeline
from data.cache import publish, read_entry
from tests.test_data_support import article, config, log_sink, write_kaggle_csv

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_kaggle_csv(tmp_path / "articles1.csv", [article(i) + " <b>bold</b>" for i in range(40)])


def build(tmp_path: Path, corpus: Path, **overrides):
    _, log = log_sink()
    values = {"paths": [str(corpus)], "block_size": 16, **overrides}
    return build_datasets(config(tmp_path, **values), log=log)


def test_second_run_is_a_cache_hit_with_the_same_data(tmp_path: Path, corpus: Path, monkeypatch):
    first = build(tmp_path, corpus)

    def must_not_run(*args, **kwargs):
        raise AssertionError("the second run rebuilt the data instead of reading the cache")

    # A hit reads the stored entry: neither the build nor its tokenizing step may run again.
    monkeypatch.setattr(pipeline, "_build", must_not_run)
    monkeypatch.setattr(pipeline, "tokenize_documents", must_not_run)
    second = build(tmp_path, corpus)
    assert not first.stats.cache_hit and second.stats.cache_hit
    assert first.stats.cache_key == second.stats.cache_key
    assert second.train.path == first.train.path and len(second.train) == len(first.train)
    assert first.stats.train == second.stats.train and first.stats.val == second.stats.val


@pytest.mark.parametrize(
    "change",
    ["block_size", "clean", "prepend_title", "max_documents", "val_fraction", "split_seed", "content", "tokenizer"],
)
def test_any_key_change_rebuilds(tmp_path: Path, corpus: Path, change: str):
    base = build(tmp_path, corpus)
    overrides: dict = {
        "block_size": {"block_size": 17},
        "clean": {"clean": False},
        "prepend_title": {"prepend_title": True},
        "max_documents": {"max_documents": 30},
        "val_fraction": {"val_fraction": 0.2},
        "split_seed": {"split_seed": 99},
    }.get(change, {})
    if change == "content":
        write_kaggle_csv(corpus, [article(i) + " <b>bold</b>" for i in range(39)] + ["Edited last article. " * 10])
    if change == "tokenizer":
        tok = load_tokenizer()
        tok.add_tokens(["<|pad|>"])  # a different vocabulary, so different ids may follow
        tok.save_pretrained(tmp_path / "tok")
        overrides = {"tokenizer": str(tmp_path / "tok")}
    rebuilt = build(tmp_path, corpus, **overrides)
    assert not rebuilt.stats.cache_hit and rebuilt.stats.cache_key != base.stats.cache_key
    assert build(tmp_path, corpus, **overrides).stats.cache_hit  # and the new entry is reused in turn


@pytest.mark.parametrize(
    "change", [{"block_size": 17}, {"val_fraction": 0.2}, {"split_seed": 99}, {"block_size": 8, "split_seed": 5}]
)
def test_another_block_size_or_split_only_repacks(tmp_path: Path, corpus: Path, monkeypatch, change: dict):
    base = build(tmp_path, corpus)

    def must_not_run(*args, **kwargs):
        raise AssertionError("the documents were tokenized again for a change that only needs packing")

    monkeypatch.setattr(pipeline, "tokenize_documents", must_not_run)
    lines, log = log_sink()
    repacked = build_datasets(config(tmp_path, paths=[str(corpus)], **{"block_size": 16, **change}), log=log)
    assert not repacked.stats.cache_hit and repacked.stats.cache_key != base.stats.cache_key
    assert any("reusing tokenized documents" in line for line in lines)
    monkeypatch.undo()  # the same packing from a fresh tokenization, in a cache of its own
    fresh = build_datasets(config(tmp_path / "fresh", paths=[str(corpus)], **{"block_size": 16, **change}), log=log)
    assert repacked.train.path.read_bytes() == fresh.train.path.read_bytes()
    assert repacked.val.path.read_bytes() == fresh.val.path.read_bytes()
    assert (repacked.stats.train, repacked.stats.val) == (fresh.stats.train, fresh.stats.val)


@pytest.mark.parametrize("change", [{"clean": False}, {"prepend_title": True}, {"max_documents": 30}])
def test_a_change_to_the_documents_tokenizes_again(tmp_path: Path, corpus: Path, change: dict):
    build(tmp_path, corpus)
    lines, log = log_sink()
    build_datasets(config(tmp_path, paths=[str(corpus)], block_size=16, **change), log=log)
    assert any("no tokenized documents" in line for line in lines)
    assert len(list((tmp_path / "cache" / "documents").iterdir())) == 2


def test_interrupted_build_leaves_nothing_that_is_trusted(tmp_path: Path, corpus: Path, monkeypatch):
    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # as if the user hit Ctrl-C halfway through writing the splits

    monkeypatch.setattr(pipeline, "pack_split", crash)
    with pytest.raises(KeyboardInterrupt):
        build(tmp_path, corpus)
    packed = tmp_path / "cache" / "packed"
    assert list(packed.iterdir()) == []  # no entry, and the temporary folder is gone too
    monkeypatch.undo()
    assert not build(tmp_path, corpus).stats.cache_hit


def test_damaged_entry_is_rebuilt(tmp_path: Path, corpus: Path):
    first = build(tmp_path, corpus)
    with open(first.train.path, "r+b") as f:
        f.truncate(10)
    again = build(tmp_path, corpus)
    assert not again.stats.cache_hit and again.train.path.stat().st_size == len(again.train) * 17 * 2


def test_publish_keeps_the_entry_another_process_published_first(tmp_path: Path):
    def build_and_race(tmp: Path) -> dict:
        (tmp / "train.bin").write_bytes(b"ours")
        (tmp / "val.bin").write_bytes(b"")
        # Meanwhile another process finishes the same key.
        other = tmp_path / "k"
        other.mkdir()
        (other / "train.bin").write_bytes(b"them")
        (other / "val.bin").write_bytes(b"")
        (other / "meta.json").write_text('{"who": "them", "splits": {"train": {"bytes": 4}, "val": {"bytes": 0}}}')
        return {"who": "us", "splits": {"train": {"bytes": 4}, "val": {"bytes": 0}}}

    assert publish(tmp_path, "k", build_and_race)["who"] == "them"
    assert read_entry(tmp_path, "k")["who"] == "them" and (tmp_path / "k" / "train.bin").read_bytes() == b"them"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k"]


def test_concurrent_builders_agree_on_one_entry(tmp_path: Path, corpus: Path):
    script = (
        "import sys\n"
        "from data import DataConfig, build_datasets\n"
        "d = build_datasets(DataConfig(paths=[sys.argv[1]], cache_dir=sys.argv[2], block_size=16, num_proc=1), log=lambda s: None)\n"
        "print(d.train.path.read_bytes().hex()[:64], len(d.train), len(d.val))\n"
    )
    cache = tmp_path / "shared_cache"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(corpus), str(cache)], cwd=REPO, stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outputs[0] == outputs[1]
    assert [p.name for p in (cache / "packed").iterdir()] == [build(tmp_path, corpus).stats.cache_key]


def test_cached_tokens_match_a_fresh_tokenization(tmp_path: Path, corpus: Path):
    build(tmp_path, corpus, val_fraction=0.0)
    hit = build(tmp_path, corpus, val_fraction=0.0)
    assert hit.stats.cache_hit
    # What the cache hands back is the corpus tokenized now: every cleaned document ("<b>bold</b>" ->
    # "bold") in order, each followed by end-of-text, cut into whole blocks of 16 + 1 tokens.
    tok = load_tokenizer()
    expected = [t for i in range(40) for t in tok(article(i) + " bold")["input_ids"] + [tok.eos_token_id]]
    got = np.concatenate([hit.train.block(i) for i in range(len(hit.train))]).tolist()
    assert len(got) == len(expected) // 17 * 17
    assert got == expected[: len(got)]


def test_build_runs_inside_main_process_first(tmp_path: Path, corpus: Path):
    from accelerate import PartialState

    events: list[str] = []

    @contextlib.contextmanager
    def main_process_first():
        with PartialState().main_process_first():  # what training passes, here in one process
            events.append("enter")
            yield
            events.append("exit")

    _, log = log_sink()
    data = build_datasets(
        config(tmp_path, paths=[str(corpus)], block_size=16), main_process_first=main_process_first, log=log
    )
    assert events == ["enter", "exit"] and len(data.train) > 0
