"""Tokenize once: the corpus streamed through cleaning and tokenizing into a store of tokenized documents.

The store is a cache entry of its own, keyed by what decides the documents and their ids (files,
tokenizer, cleaning, columns), not by how they are later split and packed: another block size,
validation fraction or split seed packs the same store again without tokenizing anything.

Documents flow in batches, in corpus order, through a pool of worker processes that clean and
tokenize them; the main process writes each batch's results to the store as it comes back, and at
most a few batches per worker are in flight. Memory therefore depends on the batch size and the
longest document, not on the size of the corpus.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pyarrow as pa

from data.clean import clean_text, is_empty
from data.errors import DataError
from data.tokenizer import DocumentTokenizer

# Documents per batch handed to a worker: large enough that pickling and scheduling cost little
# against cleaning and tokenizing, small enough that a few batches per worker stay a few MB.
BATCH_DOCUMENTS = 500
# Batches in flight per worker: one being worked on, one queued, so no worker waits for the reader.
_IN_FLIGHT_PER_WORKER = 2
# The store's files: token ids back to back (EOT-terminated documents), the cleaned text back to back
# (the split hash is taken from it, so a new split seed needs no re-tokenizing), and the lengths.
TOKENS_FILE = "tokens.bin"
TOKEN_LENGTHS_FILE = "token_lengths.bin"
TEXT_FILE = "text.bin"
TEXT_LENGTHS_FILE = "text_lengths.bin"
STORE_FILES = (TOKENS_FILE, TOKEN_LENGTHS_FILE, TEXT_FILE, TEXT_LENGTHS_FILE)
LENGTH_DTYPE = np.dtype("<i8")


@dataclass
class EncodedBatch:
    """One batch of documents, cleaned and tokenized: what a worker sends back."""

    documents_read: int
    text: bytes  # the kept documents' cleaned text as UTF-8, back to back
    text_lengths: np.ndarray  # bytes of each kept document
    tokens: np.ndarray  # their token ids, each document followed by the end-of-text id
    token_lengths: np.ndarray  # tokens of each kept document, EOT included
    clean_s: float
    tokenize_s: float


@dataclass
class StoreTotals:
    """What a store holds, and the time its stages took (clean and tokenize summed over workers)."""

    documents_read: int = 0
    documents: int = 0
    tokens: int = 0
    text_bytes: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: {"read": 0.0, "clean": 0.0, "tokenize": 0.0})

    def add(self, batch: EncodedBatch) -> None:
        self.documents_read += batch.documents_read
        self.documents += len(batch.token_lengths)
        self.tokens += len(batch.tokens)
        self.text_bytes += len(batch.text)
        self.seconds["clean"] += batch.clean_s
        self.seconds["tokenize"] += batch.tokenize_s


def clean_documents(texts: list[str], clean: bool) -> list[str]:
    """The documents cleaned (or kept as they are, with --no-clean), the empty ones dropped."""
    cleaned = [clean_text(t) for t in texts] if clean else texts
    return [t for t in cleaned if not is_empty(t)]


def encode_batch(texts: list[str], tokenizer: DocumentTokenizer, clean: bool, dtype: np.dtype) -> EncodedBatch:
    """Clean a batch, drop its empty documents and tokenize the rest, each followed by end-of-text."""
    start = time.process_time()  # CPU time: a busy machine's waits are not the stage's cost
    kept = clean_documents(texts, clean)
    cleaned = time.process_time()
    ids = tokenizer.encode(kept)
    eot = np.array([tokenizer.eot_id], dtype=dtype)
    tokens = np.concatenate([part for doc in ids for part in (doc.astype(dtype, copy=False), eot)] or [eot[:0]])
    encoded = [t.encode("utf-8") for t in kept]
    return EncodedBatch(
        documents_read=len(texts),
        text=b"".join(encoded),
        text_lengths=np.array([len(t) for t in encoded], dtype=LENGTH_DTYPE),
        tokens=tokens,
        token_lengths=np.array([len(doc) + 1 for doc in ids], dtype=LENGTH_DTYPE),
        clean_s=cleaned - start,
        tokenize_s=time.process_time() - cleaned,
    )


# ----------------------------------------------------------------------------- the worker pool

# Set in each worker by `_start_worker`, so the tokenizer travels to a worker once, not with every batch.
_worker_args: tuple[DocumentTokenizer, bool, np.dtype] | None = None


def _start_worker(tokenizer: DocumentTokenizer, clean: bool, dtype: np.dtype) -> None:
    global _worker_args
    _worker_args = (tokenizer, clean, dtype)


def _encode_in_worker(texts: list[str]) -> EncodedBatch:
    assert _worker_args is not None, "worker started without its tokenizer"
    return encode_batch(texts, *_worker_args)


def encoded_batches(
    batches: Iterable[list[str]], tokenizer: DocumentTokenizer, clean: bool, dtype: np.dtype, workers: int
) -> Iterator[EncodedBatch]:
    """Each batch cleaned and tokenized, in order, by `workers` processes (1: here, no pool).

    At most a few batches per worker are submitted ahead of the one being collected: a Pool's imap
    would read the whole corpus into its task queue as fast as the reader goes.
    """
    if workers == 1:
        yield from (encode_batch(texts, tokenizer, clean, dtype) for texts in batches)
        return
    # A transformers tokenizer's own thread pool in each worker would oversubscribe the cores.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with multiprocessing.Pool(workers, initializer=_start_worker, initargs=(tokenizer, clean, dtype)) as pool:
        pending: deque = deque()
        for texts in batches:
            pending.append(pool.apply_async(_encode_in_worker, (texts,)))
            if len(pending) >= _IN_FLIGHT_PER_WORKER * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


# ----------------------------------------------------------------------------- writing and reading a store


def text_batches(tables: Iterable[pa.Table], seconds: dict[str, float]) -> Iterator[list[str]]:
    """The `text` column of a stream of tables, re-cut into batches of BATCH_DOCUMENTS documents; the
    CPU time this thread spends producing the tables (reading the corpus) is added to seconds["read"]."""
    buffer: list[str] = []
    start = time.thread_time()
    for table in tables:
        buffer += table.column("text").to_pylist()
        seconds["read"] += time.thread_time() - start
        while len(buffer) >= BATCH_DOCUMENTS:
            yield buffer[:BATCH_DOCUMENTS]
            buffer = buffer[BATCH_DOCUMENTS:]
        start = time.thread_time()
    seconds["read"] += time.thread_time() - start
    if buffer:
        yield buffer


def write_store(folder: Path, batches: Iterable[EncodedBatch], totals: StoreTotals) -> None:
    """Append each batch to the store's files in `folder`, in order, and count it in `totals`."""
    files: dict[str, BinaryIO] = {name: open(folder / name, "wb") for name in STORE_FILES}
    try:
        for batch in batches:
            files[TOKENS_FILE].write(batch.tokens.tobytes())
            files[TOKEN_LENGTHS_FILE].write(batch.token_lengths.tobytes())
            files[TEXT_FILE].write(batch.text)
            files[TEXT_LENGTHS_FILE].write(batch.text_lengths.tobytes())
            totals.add(batch)
    finally:
        for f in files.values():
            f.close()


def store_file_sizes(totals: StoreTotals, dtype: np.dtype) -> dict[str, int]:
    """The byte size of each store file, which the cache checks before trusting an entry."""
    return {
        TOKENS_FILE: totals.tokens * dtype.itemsize,
        TOKEN_LENGTHS_FILE: totals.documents * LENGTH_DTYPE.itemsize,
        TEXT_FILE: totals.text_bytes,
        TEXT_LENGTHS_FILE: totals.documents * LENGTH_DTYPE.itemsize,
    }


def read_lengths(folder: Path, name: str) -> np.ndarray:
    return np.fromfile(folder / name, dtype=LENGTH_DTYPE)


def chunks_of(
    path: Path, lengths: np.ndarray, dtype: np.dtype, max_items: int
) -> Iterator[tuple[int, int, np.ndarray]]:
    """(first, last, items) for runs of whole documents first..last-1 of at most `max_items` items
    together (or one longer document), read from file `path` in order.

    Read, not memory-mapped: pages of a mapped file would count toward the process's memory as they
    are touched, so packing a large store would look (and, under a limit, be) as large as the store.
    """
    ends = np.cumsum(lengths)
    first = 0
    with open(path, "rb") as f:
        while first < len(lengths):
            done = int(ends[first - 1]) if first else 0
            last = max(first + 1, int(np.searchsorted(ends, done + max_items, side="right")))
            count = int(ends[last - 1]) - done
            yield first, last, np.fromfile(f, dtype=dtype, count=count)
            first = last


def require_documents(totals: StoreTotals, description: str) -> None:
    if totals.documents == 0:
        raise DataError(f"{description}: no non-empty documents after cleaning; check --text_column")
