"""Split documents into train/validation and pack each split into fixed-size blocks of tokens.

A split is decided per document from a keyed hash of its (cleaned) text, so it is stable across
runs, machines and ranks, needs no shared random state, and identical documents always land on the
same side: no text is trained on and then validated on. A corpus of too few documents for that (one
large file) is split inside its token stream instead: validation is the tail.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data.documents import chunks_of
from data.errors import DataError

# 63 bits, so the hash fits Arrow/numpy int64 without sign trouble.
_HASH_SPACE = 2**63
# Tokens (or text bytes) read from the store at a time: 16M uint16 ids are 32 MB, whatever the corpus size.
_READ_ITEMS = 16 * 2**20


Progress = Callable[[int], None]


def _no_progress(n: int) -> None:
    pass


@dataclass
class SplitStats:
    """Size of one split: documents assigned to it, their tokens (EOT included), the blocks cut and
    the tokens left over after the last full block."""

    documents: int = 0
    tokens: int = 0
    blocks: int = 0
    tokens_dropped: int = 0


def document_hash(text: str, seed: int) -> int:
    """A 63-bit keyed hash of a document, the same in every process (unlike Python's `hash`)."""
    return document_hash_bytes(text.encode("utf-8"), seed)


def document_hash_bytes(utf8: bytes, seed: int) -> int:
    """`document_hash` of a document given as its UTF-8 bytes."""
    digest = hashlib.blake2b(utf8, digest_size=8, key=str(seed).encode()).digest()
    return int.from_bytes(digest, "big") >> 1


def assign_validation(
    doc_hash: np.ndarray,
    lengths: np.ndarray,
    val_fraction: float,
    block_size: int,
    where: str,
    log: Callable[[str], None],
) -> np.ndarray | None:
    """Boolean mask of the documents held out for validation, or None to split the token stream.

    A document goes to validation when its hash falls in the lowest `val_fraction` of the hash space.
    Choice for small corpora: when that gives fewer tokens than one block, the threshold is raised to
    take the documents with the lowest hashes until validation holds one block, and this is logged;
    an empty validation split only ever comes from `val_fraction == 0`.

    When no such set of whole documents leaves a training block besides (too few documents: one book,
    a play, a dump), None tells the caller to hold out the tail of the token stream instead
    (`pack_token_split`). Only a corpus with fewer tokens than the blocks it needs is a DataError.
    """
    need = block_size + 1
    total = int(lengths.sum())
    if val_fraction == 0:
        if total < need:
            raise DataError(
                f"{where}: corpus has {total} tokens, fewer than one block of {need}; "
                "give more data or a smaller --block_size"
            )
        return np.zeros(len(lengths), dtype=bool)
    if total < 2 * need:
        raise DataError(
            f"{where}: corpus has {total} tokens, too few for one training and one validation block of {need} "
            "each; give more data, a smaller --block_size, or --val_fraction 0"
        )
    mask = doc_hash < np.int64(min(int(val_fraction * _HASH_SPACE), _HASH_SPACE - 1))
    raised = int(lengths[mask].sum()) < need
    if raised:
        order = np.argsort(doc_hash, kind="stable")
        # total >= need, so some prefix of the documents by hash holds a block: k < len(order).
        k = int(np.searchsorted(np.cumsum(lengths[order]), need))
        # Compare on the hash value, not the rank, so duplicate documents stay together.
        mask = doc_hash <= doc_hash[order[k]]
    if total - int(lengths[mask].sum()) < need:
        return None
    if raised:
        log(
            f"data: val_fraction {val_fraction} gives less than one validation block of {need} tokens; "
            f"holding out {int(mask.sum())} document(s) ({int(lengths[mask].sum())} tokens) instead"
        )
    return mask


def split_hashes(text_path: Path, text_lengths: np.ndarray, seed: int, progress: Progress = _no_progress) -> np.ndarray:
    """`document_hash` of every stored document, from the store's cleaned text read in chunks;
    `progress(n)` is told the bytes of each chunk done."""
    hashes = np.empty(len(text_lengths), dtype=np.int64)
    for first, last, chunk in chunks_of(text_path, text_lengths, np.dtype(np.uint8), _READ_ITEMS):
        progress(len(chunk))
        data = chunk.tobytes()
        ends = np.cumsum(text_lengths[first:last]).tolist()
        for i, (a, b) in enumerate(zip([0, *ends[:-1]], ends)):
            hashes[first + i] = document_hash_bytes(data[a:b], seed)
    return hashes


def pack_split(
    tokens_path: Path,
    dtype: np.dtype,
    lengths: np.ndarray,
    mask: np.ndarray,
    path: Path,
    block_size: int,
    progress: Progress = _no_progress,
) -> SplitStats:
    """Concatenate the masked documents' tokens in corpus order into `path`, as whole blocks.

    Streams chunk by chunk from the store's token file (`progress(n)` is told the tokens of each
    chunk read), then truncates to a multiple of block_size+1: the remainder is dropped (and
    counted), never padded.
    """
    stats = SplitStats(documents=int(mask.sum()))
    with open(path, "wb") as f:
        for first, last, chunk in chunks_of(tokens_path, lengths, dtype, _READ_ITEMS):
            progress(len(chunk))
            keep = mask[first:last]
            if keep.all():
                kept = chunk
            elif keep.any():
                kept = chunk[np.repeat(keep, lengths[first:last])]
            else:
                continue
            f.write(kept.tobytes())
            stats.tokens += len(kept)
        per_block = block_size + 1
        stats.blocks = stats.tokens // per_block
        stats.tokens_dropped = stats.tokens - stats.blocks * per_block
        f.truncate(stats.blocks * per_block * dtype.itemsize)
    return stats


def pack_token_split(
    tokens_path: Path,
    dtype: np.dtype,
    lengths: np.ndarray,
    train_path: Path,
    val_path: Path,
    block_size: int,
    val_fraction: float,
    progress: Progress = _no_progress,
) -> tuple[SplitStats, SplitStats]:
    """Pack every document into one stream and hold out its last `val_fraction` of blocks (at least
    one) for validation, as nanoGPT holds out the tail of its token stream.

    For corpora of too few documents to split by document. The cut falls on a block boundary, so
    no block mixes the splits, but a document may straddle it: such a document counts in both
    splits' `documents`. The remainder after the last full block lies in validation's part and is
    counted there as dropped.
    """
    everything = np.ones(len(lengths), dtype=bool)
    stream = pack_split(tokens_path, dtype, lengths, everything, train_path, block_size, progress)
    assert stream.blocks >= 2, "assign_validation lets only corpora of two blocks or more through"
    val_blocks = max(1, int(val_fraction * stream.blocks))  # val_fraction < 1: at most blocks - 1
    cut = (stream.blocks - val_blocks) * (block_size + 1)  # first token of validation
    itemsize = dtype.itemsize
    with open(train_path, "r+b") as train, open(val_path, "wb") as val:
        train.seek(cut * itemsize)
        shutil.copyfileobj(train, val)
        train.truncate(cut * itemsize)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    train_stats = SplitStats(documents=int((starts < cut).sum()), tokens=cut, blocks=stream.blocks - val_blocks)
    val_stats = SplitStats(
        documents=int((ends > cut).sum()),
        tokens=stream.tokens - cut,
        blocks=val_blocks,
        tokens_dropped=stream.tokens_dropped,
    )
    return train_stats, val_stats


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned type that holds every id: uint16 for GPT-2's 50,257, halving disk and I/O."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)
