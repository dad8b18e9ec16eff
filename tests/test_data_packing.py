"""Packing: exact blocks, shifted labels, EOT between documents, a leak-free and stable split."""

from __future__ import annotations

import hashlib
import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from data import build_datasets, load_tokenizer
from data.packing import assign_validation
from tests.test_data_support import article, config, log_sink, write_kaggle_csv

REPO = Path(__file__).resolve().parents[1]
EOT = 50256


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_kaggle_csv(tmp_path / "articles1.csv", [article(i) for i in range(60)])


def stream(ds) -> np.ndarray:
    """All tokens of a split, block after block."""
    return np.concatenate([ds.block(i) for i in range(len(ds))]) if len(ds) else np.zeros(0, np.int64)


def markers(tokens: np.ndarray, tok) -> set[str]:
    return {w for w in tok.decode(tokens.tolist()).split() if w.startswith("Marker")}


def test_items_are_block_size_and_labels_are_inputs_shifted(tmp_path: Path, corpus: Path):
    _, log = log_sink()
    data = build_datasets(config(tmp_path, paths=[str(corpus)], block_size=32), log=log)
    assert len(data.train) == data.stats.train.blocks > 10 and len(data.val) >= 1
    for ds in (data.train, data.val):
        for i in (0, len(ds) - 1):
            item, block = ds[i], torch.from_numpy(ds.block(i).astype(np.int64))
            assert block.shape == (33,)
            assert item["input_ids"].dtype == item["labels"].dtype == torch.long
            assert item["input_ids"].shape == item["labels"].shape == (32,)
            assert torch.equal(item["input_ids"], block[:-1]) and torch.equal(item["labels"], block[1:])
            assert torch.equal(item["labels"][:-1], item["input_ids"][1:])
    with pytest.raises(IndexError):
        data.train[len(data.train)]


def test_documents_are_concatenated_in_order_with_eot_and_the_remainder_dropped(tmp_path: Path, tok):
    docs = ["First document, short.", "Second one: a little longer than the first.", "Third!"]
    path = write_kaggle_csv(tmp_path / "a.csv", docs)
    _, log = log_sink()
    data = build_datasets(config(tmp_path, paths=[str(path)], block_size=7, val_fraction=0.0), log=log)
    expected = [t for d in docs for t in tok(d)["input_ids"] + [EOT]]
    got = stream(data.train)
    assert len(got) == data.stats.train.blocks * 8 == len(expected) // 8 * 8
    assert got.tolist() == expected[: len(got)]
    assert data.stats.train.tokens == len(expected)
    assert data.stats.train.tokens_dropped == len(expected) % 8
    assert len(data.val) == 0 and data.stats.val.documents == 0


def test_no_document_is_in_both_splits(tmp_path: Path, corpus: Path, tok):
    _, log = log_sink()
    data = build_datasets(config(tmp_path, paths=[str(corpus)], block_size=16, val_fraction=0.2), log=log)
    train, val = markers(stream(data.train), tok), markers(stream(data.val), tok)
    assert train and val and not train & val
    assert data.stats.train.documents + data.stats.val.documents == 60
    assert 4 <= data.stats.val.documents <= 24  # about a fifth, by hash


def test_duplicate_documents_land_on_the_same_side():
    doc_hash = (np.array([0.5, 0.5, 0.9, 0.1, 0.5]) * 2**63).astype(np.int64)  # three copies of one document
    lengths = np.array([10, 10, 30, 5, 10])
    mask = assign_validation(doc_hash, lengths, 0.2, block_size=9, where="x", log=lambda s: None)
    # Below 0.2 there are only 5 tokens, less than a block of 10, so the threshold rises to the next
    # hash, 0.5, which takes all three copies, never just the one needed to fill the block.
    assert mask.tolist() == [True, True, False, True, True]


def test_small_corpus_still_gets_one_validation_block(tmp_path: Path):
    lines, log = log_sink()
    data = build_datasets(config(tmp_path), log=log)  # the bundled sample, default block_size 1024
    assert len(data.val) >= 1 and len(data.train) >= 1
    assert any("less than one validation block" in line for line in lines)
    assert any("bundled sample" in line and "--data path/to/articles*.csv" in line for line in lines)


def test_split_is_stable_across_runs_and_worker_counts(tmp_path: Path, corpus: Path):
    _, log = log_sink()
    one = build_datasets(config(tmp_path / "a", paths=[str(corpus)], block_size=16, val_fraction=0.2), log=log)
    two = build_datasets(
        config(tmp_path / "b", paths=[str(corpus)], block_size=16, val_fraction=0.2, num_proc=2), log=log
    )
    assert not one.stats.cache_hit and not two.stats.cache_hit
    assert np.array_equal(stream(one.train), stream(two.train)) and np.array_equal(stream(one.val), stream(two.val))
    other_seed = build_datasets(
        config(tmp_path / "c", paths=[str(corpus)], block_size=16, val_fraction=0.2, split_seed=7), log=log
    )
    assert not np.array_equal(stream(one.val), stream(other_seed.val))


def test_split_is_equal_when_built_in_another_process(tmp_path: Path, corpus: Path):
    script = (
        "import hashlib, sys\n"
        "from data import DataConfig, build_datasets\n"
        "d = build_datasets(DataConfig(paths=[sys.argv[1]], cache_dir=sys.argv[2], block_size=16, num_proc=1), log=lambda s: None)\n"
        "print(hashlib.sha256(d.train.path.read_bytes()).hexdigest(), hashlib.sha256(d.val.path.read_bytes()).hexdigest())\n"
    )
    # A fixed PYTHONHASHSEED in the child, a random one here: the split must not depend on hash().
    child = subprocess.run(
        [sys.executable, "-c", script, str(corpus), str(tmp_path / "child_cache")],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={"PYTHONHASHSEED": "12345", "PATH": "/usr/bin:/bin"},
        check=True,
    )
    _, log = log_sink()
    here = build_datasets(config(tmp_path, paths=[str(corpus)], block_size=16), log=log)
    mine = [hashlib.sha256(p.read_bytes()).hexdigest() for p in (here.train.path, here.val.path)]
    assert child.stdout.split() == mine


def test_datasets_work_in_dataloader_workers(tmp_path: Path, corpus: Path):
    _, log = log_sink()
    data = build_datasets(config(tmp_path, paths=[str(corpus)], block_size=16), log=log)
    data.train[0]  # opens the memory map; it must not travel with the pickle
    assert len(pickle.dumps(data.train)) < 1000
    loader = torch.utils.data.DataLoader(data.train, batch_size=4, num_workers=2, shuffle=False)
    batches = list(loader)
    first = torch.stack([data.train[i]["input_ids"] for i in range(4)])
    assert torch.equal(batches[0]["input_ids"], first)
    assert sum(len(b["input_ids"]) for b in batches) == len(data.train)


def test_stats_are_logged_and_serialisable(tmp_path: Path, corpus: Path):
    lines, log = log_sink()
    data = build_datasets(config(tmp_path, paths=[str(corpus)], block_size=16), log=log)
    d = data.stats.to_dict()
    assert d["train"]["blocks"] == len(data.train) and d["val"]["blocks"] == len(data.val)
    assert d["cache_key"] and d["cache_hit"] is False and d["build_time_s"] > 0 and str(corpus) in d["source"]
    assert any(line.startswith("data: train") and "tokens dropped" in line for line in lines)
    timing = [line for line in lines if line.startswith("data: built in ")]
    stages = ("hash", "read", "clean", "tokenize", "split", "pack")
    assert len(timing) == 1 and all(f"{stage} " in timing[0] for stage in stages)
    assert set(stages) < set(d["stage_seconds"]) and d["stage_seconds"]["total"] == d["build_time_s"]
    hit_lines, log = log_sink()
    hit = build_datasets(config(tmp_path, paths=[str(corpus)], block_size=16), log=log).stats.to_dict()
    assert [line for line in hit_lines if line.startswith("data: reused in ")] and "tokenize" not in hit[
        "stage_seconds"
    ]
    # config.json records these stats: they must survive JSON unchanged, nested splits included.
    assert json.loads(json.dumps(d, allow_nan=False)) == d
