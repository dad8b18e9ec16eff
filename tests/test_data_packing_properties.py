"""Packing's functions on their own, in-process, on token files written here: every block whole, no token
lost, duplicated or reordered beyond the declared drop, and a validation split by document hash that is
stable, keyed by the seed and at the declared fraction. The end-to-end cases are in test_data_packing.py."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from data import packing
from data.errors import DataError
from data.packing import (
    SplitStats,
    assign_validation,
    document_hash,
    document_hash_bytes,
    pack_split,
    pack_token_split,
    split_hashes,
    token_dtype,
)

# Each hypothesis example writes a few small files; a handful of examples covers the branches.
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
documents = st.lists(st.integers(1, 9), min_size=1, max_size=12)  # token counts of the documents


def write_store(folder: Path, lengths: list[int], dtype: np.dtype) -> tuple[Path, np.ndarray]:
    """A token file of documents whose tokens are their positions in the corpus (every token distinct),
    and the documents' lengths."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tokens.bin"
    np.arange(sum(lengths), dtype=dtype).tofile(path)
    return path, np.array(lengths, dtype=np.int64)


def read(path: Path, dtype: np.dtype) -> np.ndarray:
    return np.fromfile(path, dtype=dtype)


class Counted:
    """A progress callback that adds up what it is told."""

    def __init__(self) -> None:
        self.total = 0

    def __call__(self, n: int) -> None:
        self.total += n


def no_log(_: str) -> None:
    pass


@pytest.fixture(autouse=True)
def small_reads(monkeypatch: pytest.MonkeyPatch):
    """Reads of 5 items at a time, so that a corpus of a few dozen tokens is read in several chunks, some with
    every document kept, some with none, some mixed."""
    monkeypatch.setattr(packing, "_READ_ITEMS", 5)


# ----------------------------------------------------------------------------- hashing


def test_document_hash_is_the_top_63_bits_of_a_keyed_blake2b():
    # The definition the split of every cached corpus rests on: changing it moves documents between splits.
    text = "A document, with ünïcode."
    reference = hashlib.blake2b(text.encode(), digest_size=8, key=b"1337").digest()
    assert document_hash(text, 1337) == int.from_bytes(reference, "big") >> 1
    assert document_hash(text, 1337) == document_hash_bytes(text.encode("utf-8"), 1337)
    assert document_hash(text, 1337) != document_hash(text, 1338)


def test_hashes_fill_the_63_bit_space_so_validation_is_at_the_declared_fraction():
    hashes = np.array([document_hash(f"document {i}", 0) for i in range(4000)], dtype=np.int64)
    assert hashes.min() >= 0 and hashes.max() >= 2**62  # the top bit of 63 is used, the sign bit never
    lengths = np.full(len(hashes), 10)
    for fraction in (0.05, 0.2, 0.5):
        mask = assign_validation(hashes, lengths, fraction, block_size=9, where="x", log=no_log)
        assert mask is not None and abs(mask.mean() - fraction) < 0.025


def test_split_hashes_are_each_documents_hash_read_in_chunks(tmp_path: Path):
    texts = ["one", "second document", "", "ünïcode", "x" * 12, "last"]
    data = [t.encode() for t in texts]
    path = tmp_path / "text.bin"
    path.write_bytes(b"".join(data))
    progress = Counted()
    got = split_hashes(path, np.array([len(d) for d in data]), 99, progress)
    assert got.dtype == np.int64
    assert got.tolist() == [document_hash_bytes(d, 99) for d in data]
    assert progress.total == sum(len(d) for d in data)


# ----------------------------------------------------------------------------- assigning documents


def test_no_validation_needs_one_block_and_holds_out_nothing():
    with pytest.raises(DataError) as refused:
        assign_validation(np.arange(3), np.array([3, 3, 3]), 0.0, block_size=9, where="corpus.csv", log=no_log)
    assert str(refused.value) == (
        "corpus.csv: corpus has 9 tokens, fewer than one block of 10; give more data or a smaller --block_size"
    )
    mask = assign_validation(np.arange(3), np.array([3, 3, 4]), 0.0, block_size=9, where="x", log=no_log)
    assert mask is not None and mask.dtype == bool and mask.tolist() == [False, False, False]


def test_a_validation_split_needs_two_blocks():
    with pytest.raises(DataError) as refused:
        assign_validation(np.arange(2), np.array([10, 9]), 0.5, block_size=9, where="corpus.csv", log=no_log)
    assert str(refused.value) == (
        "corpus.csv: corpus has 19 tokens, too few for one training and one validation block of 10 each; "
        "give more data, a smaller --block_size, or --val_fraction 0"
    )
    # Exactly two blocks' worth, one document each: one trains, the other (lower hash) validates.
    mask = assign_validation(np.array([2**62 + 5, 1]), np.array([10, 10]), 0.5, block_size=9, where="x", log=no_log)
    assert mask is not None and mask.tolist() == [False, True]


def test_a_document_is_held_out_when_its_hash_is_below_the_fraction_of_the_space():
    half = 2**62  # val_fraction 0.5 of 2**63
    doc_hash = np.array([half - 1, half, half + 1, 0, 2**63 - 1], dtype=np.int64)
    lines: list[str] = []
    mask = assign_validation(doc_hash, np.full(5, 10), 0.5, block_size=9, where="x", log=lines.append)
    assert mask is not None and mask.tolist() == [True, False, False, True, False]
    assert lines == []  # the fraction gave a whole block: nothing to say


def test_exactly_one_validation_block_by_hash_is_not_raised():
    lines: list[str] = []
    doc_hash = np.array([1, 2**62, 2**62 + 5], dtype=np.int64)
    mask = assign_validation(doc_hash, np.array([10, 10, 10]), 0.1, block_size=9, where="x", log=lines.append)
    assert mask is not None and mask.tolist() == [True, False, False] and lines == []


def test_a_raised_threshold_takes_the_fewest_lowest_hashes_that_fill_a_block_and_says_so():
    doc_hash = np.array([40, 10, 30, 20, 50], dtype=np.int64) * 2**56
    lines: list[str] = []
    mask = assign_validation(doc_hash, np.array([4, 3, 4, 4, 30]), 0.01, block_size=9, where="x", log=lines.append)
    # By hash: 3 + 4 = 7 tokens, then + 4 = 11 >= 10. The document of hash 40 is not needed.
    assert mask is not None and mask.tolist() == [False, True, True, True, False]
    assert lines == [
        "data: val_fraction 0.01 gives less than one validation block of 10 tokens; "
        "holding out 3 document(s) (11 tokens) instead"
    ]


def test_too_few_documents_to_split_by_document_asks_for_the_token_stream():
    # A block of validation by hash leaves only 9 training tokens: not a block.
    doc_hash = np.array([1, 2**62], dtype=np.int64)
    assert assign_validation(doc_hash, np.array([11, 9]), 0.1, block_size=9, where="x", log=no_log) is None
    # One training block exactly is enough.
    mask = assign_validation(doc_hash, np.array([11, 10]), 0.1, block_size=9, where="x", log=no_log)
    assert mask is not None and mask.tolist() == [True, False]


@FAST
@given(
    lengths=st.lists(st.integers(1, 30), min_size=2, max_size=20),
    hashes=st.lists(st.integers(0, 2**63 - 1), min_size=20, max_size=20),
    fraction=st.sampled_from([0.01, 0.1, 0.3]),
)
def test_validation_is_whole_documents_of_the_lowest_hashes_holding_a_block(lengths, hashes, fraction):
    lengths_a = np.array(lengths)
    doc_hash = np.array(hashes[: len(lengths)], dtype=np.int64)
    try:
        mask = assign_validation(doc_hash, lengths_a, fraction, block_size=9, where="x", log=no_log)
    except DataError:
        assert lengths_a.sum() < 20
        return
    if mask is None:
        return
    val, train = int(lengths_a[mask].sum()), int(lengths_a[~mask].sum())
    assert val >= 10 and train >= 10
    if mask.any() and not mask.all():
        assert doc_hash[mask].max() < doc_hash[~mask].min()  # a threshold on the hash
    top = doc_hash[mask].max()
    if top >= fraction * 2**63:  # raised: without the highest hash taken, less than a block
        assert int(lengths_a[mask & (doc_hash < top)].sum()) < 10


# ----------------------------------------------------------------------------- packing by document


@pytest.mark.parametrize("dtype", [np.dtype(np.uint16), np.dtype(np.uint32)])
def test_pack_split_keeps_the_masked_documents_in_order_as_whole_blocks(tmp_path: Path, dtype: np.dtype):
    tokens, lengths = write_store(tmp_path, [3, 2, 6, 1, 4, 5, 2], dtype)
    # Read as documents 0-1 (some kept), 2 (all kept), 3-4 (none kept), 5 (all kept), 6 (none kept).
    mask = np.array([True, False, True, False, False, True, False])
    progress = Counted()
    stats = pack_split(tokens, dtype, lengths, mask, tmp_path / "out.bin", block_size=3, progress=progress)
    kept = [0, 1, 2, 5, 6, 7, 8, 9, 10, 16, 17, 18, 19, 20]  # documents 0, 2 and 5
    assert stats == SplitStats(documents=3, tokens=14, blocks=3, tokens_dropped=2)
    assert read(tmp_path / "out.bin", dtype).tolist() == kept[:12]
    assert progress.total == int(lengths.sum())  # every token is read once, kept or not


@FAST
@given(lengths=documents, keep=st.lists(st.booleans(), min_size=12, max_size=12), block_size=st.integers(1, 7))
def test_packing_loses_duplicates_and_reorders_nothing_but_the_declared_drop(
    tmp_path_factory: pytest.TempPathFactory, lengths: list[int], keep: list[bool], block_size: int
):
    folder = tmp_path_factory.mktemp("pack")
    tokens, lengths_a = write_store(folder, lengths, np.dtype(np.uint16))
    mask = np.array(keep[: len(lengths)])
    stats = pack_split(tokens, np.dtype(np.uint16), lengths_a, mask, folder / "out.bin", block_size)
    expected = np.concatenate([np.full(n, m, dtype=bool) for n, m in zip(lengths, mask)])
    everything = np.flatnonzero(expected)  # the masked documents' tokens, in corpus order
    got = read(folder / "out.bin", np.dtype(np.uint16))
    assert len(got) % (block_size + 1) == 0 and len(got) == stats.blocks * (block_size + 1)
    assert stats.tokens == len(everything) and stats.tokens_dropped == len(everything) - len(got)
    assert 0 <= stats.tokens_dropped <= block_size and stats.documents == int(mask.sum())
    assert got.tolist() == everything[: len(got)].tolist()


# ----------------------------------------------------------------------------- the token stream's tail


def test_the_tail_is_whole_blocks_and_a_straddling_document_counts_on_both_sides(tmp_path: Path):
    dtype = np.dtype(np.uint16)
    tokens, lengths = write_store(tmp_path, [10, 3, 9, 5], dtype)  # 27 tokens: 6 blocks of 4, 3 dropped
    progress = Counted()
    train, val = pack_token_split(
        tokens,
        dtype,
        lengths,
        tmp_path / "t.bin",
        tmp_path / "v.bin",
        block_size=3,
        val_fraction=0.2,
        progress=progress,
    )
    # One block of validation (0.2 of 6), cut at token 20, inside the third document (tokens 13..21).
    assert train == SplitStats(documents=3, tokens=20, blocks=5, tokens_dropped=0)
    assert val == SplitStats(documents=2, tokens=7, blocks=1, tokens_dropped=3)
    assert read(tmp_path / "t.bin", dtype).tolist() == list(range(20))
    assert read(tmp_path / "v.bin", dtype).tolist() == list(range(20, 24))
    assert progress.total == 27


def test_a_cut_on_a_document_boundary_counts_each_document_once(tmp_path: Path):
    dtype = np.dtype(np.uint32)
    tokens, lengths = write_store(tmp_path, [4, 4, 4, 4, 2], dtype)  # 18 tokens: 4 blocks of 4, 2 dropped
    train, val = pack_token_split(
        tokens, dtype, lengths, tmp_path / "t.bin", tmp_path / "v.bin", block_size=3, val_fraction=0.5
    )
    # Two blocks each side: the cut at token 8 ends the second document and starts the third.
    assert (train.blocks, val.blocks) == (2, 2)
    assert (train.documents, val.documents) == (2, 3)
    assert read(tmp_path / "v.bin", dtype).tolist() == list(range(8, 16))


@FAST
@given(lengths=st.lists(st.integers(1, 9), min_size=1, max_size=8), fraction=st.sampled_from([0.01, 0.3, 0.6, 0.99]))
def test_the_tail_split_loses_nothing_but_the_remainder(
    tmp_path_factory: pytest.TempPathFactory, lengths: list[int], fraction: float
):
    block_size = 2
    if sum(lengths) < 2 * (block_size + 1):
        return  # assign_validation refuses such a corpus before this is called
    folder = tmp_path_factory.mktemp("tail")
    tokens, lengths_a = write_store(folder, lengths, np.dtype(np.uint16))
    train, val = pack_token_split(
        tokens, np.dtype(np.uint16), lengths_a, folder / "t.bin", folder / "v.bin", block_size, fraction
    )
    blocks = sum(lengths) // 3
    assert val.blocks == max(1, int(fraction * blocks)) and train.blocks == blocks - val.blocks >= 1
    both = np.concatenate([read(folder / "t.bin", np.dtype(np.uint16)), read(folder / "v.bin", np.dtype(np.uint16))])
    assert both.tolist() == list(range(blocks * 3))
    assert train.tokens == train.blocks * 3 and train.tokens + val.tokens == sum(lengths)
    assert val.tokens_dropped == sum(lengths) - blocks * 3 and train.tokens_dropped == 0
    cut = train.tokens
    starts = np.cumsum([0, *lengths[:-1]])
    straddles = any(s < cut < s + n for s, n in zip(starts, lengths))
    assert train.documents + val.documents == len(lengths) + straddles


# ----------------------------------------------------------------------------- the token type


@pytest.mark.parametrize("vocab_size", [2, 50_257, 2**16, 2**16 + 1, 100_277])
def test_token_dtype_is_the_smallest_that_holds_every_id(vocab_size: int):
    dtype = token_dtype(vocab_size)
    assert np.iinfo(dtype).max >= vocab_size - 1 and np.iinfo(dtype).min == 0
    assert dtype == (np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32))
