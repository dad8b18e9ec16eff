"""build_datasets: corpus -> clean -> tokenize -> split by document -> pack into blocks -> cache.

A corpus of too few documents to split by document (one large file) is split in its token stream.

Only the packed token files are cached; everything before them is rebuilt on a miss. The cache key
covers every input that changes the packed result, so a hit is always safe to use.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import transformers

from data.cache import cache_key, publish, read_entry
from data.clean import CLEANING_VERSION, clean_text, is_empty
from data.config import DataConfig
from data.dataset import PackedDataset
from data.errors import DataError
from data.packing import (
    SplitStats,
    assign_validation,
    document_hash,
    pack_split,
    pack_token_split,
    record_batches,
    token_dtype,
)
from data.sources import Corpus, Sources, describe, read_corpus
from data.tokenizer import load_tokenizer, tokenizer_fingerprint

# Part of the cache key: bump when packing or the stored layout changes. 2: corpora of too few
# documents are split in their token stream (`split_by`), which entries of 1 neither did nor record.
PIPELINE_VERSION = 2
# How validation was held out (DataStats.split_by): whole documents by hash, or the token stream's tail.
SPLIT_BY_DOCUMENT = "document"
SPLIT_BY_TOKEN_STREAM = "token_stream"
# Below this many documents per worker, starting a pool costs more than it saves (default num_proc only).
_MIN_DOCS_PER_WORKER = 1000
_MAP_BATCH = 1000
# Below this many documents the map steps take well under a second and a progress bar is only noise
# (on stderr, where it would also bury the one-line error of a corpus that is too small).
_MIN_DOCS_FOR_PROGRESS = 10_000
# Files named in the warning about bytes that are not UTF-8 (and kept in the entry's metadata for it).
_NOT_UTF8_NAMED = 3

Log = Callable[[str], None]


@dataclass
class DataStats:
    """What was built (or reused) and from what; `to_dict()` is JSON-ready."""

    source: str
    train: SplitStats
    val: SplitStats
    block_size: int
    vocab_size: int
    eot_id: int
    documents_read: int  # rows read from the source, before empty documents were dropped
    documents_empty: int  # dropped because nothing was left after cleaning
    split_by: str  # SPLIT_BY_DOCUMENT, or SPLIT_BY_TOKEN_STREAM for a corpus of too few documents
    not_utf8_files: int  # files with bytes that are not UTF-8, read as U+FFFD
    not_utf8_bytes: int  # how many such bytes, in all
    cache_key: str
    cache_hit: bool
    cache_path: str
    build_time_s: float  # time this call spent (building, or finding and opening the cache)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> list[str]:
        """Human-readable lines for the log."""
        n = self.block_size + 1

        def line(name: str, s: SplitStats) -> str:
            return (
                f"data: {name:<5} {s.documents:,} documents, {s.tokens:,} tokens, {s.blocks:,} blocks of {n} "
                f"tokens, {s.tokens_dropped:,} tokens dropped"
            )

        tail = " (the tail of the token stream)" if self.split_by == SPLIT_BY_TOKEN_STREAM else ""
        return [line("train", self.train), line("val", self.val) + tail]


@dataclass
class PackedData:
    """The packed splits and how they came about."""

    train: PackedDataset
    val: PackedDataset
    stats: DataStats


# ----------------------------------------------------------------------------- map steps (top level: picklable)


def clean_batch(batch: dict[str, list], clean: bool, split_seed: int) -> dict[str, list]:
    """Clean a batch of documents, drop the empty ones, and key each survivor for the split."""
    texts = [clean_text(t) for t in batch["text"]] if clean else batch["text"]
    kept = [t for t in texts if not is_empty(t)]
    return {"text": kept, "split_hash": [document_hash(t, split_seed) for t in kept]}


def tokenize_batch(
    batch: dict[str, list], tokenizer: transformers.PreTrainedTokenizerFast, eot_id: int
) -> dict[str, list]:
    """Token ids of each document with the end-of-text id appended, so EOT separates documents."""
    ids = tokenizer(batch["text"], add_special_tokens=False, return_attention_mask=False)["input_ids"]
    for doc in ids:
        doc.append(eot_id)
    return {"input_ids": ids}


def _workers(config: DataConfig, documents: int) -> int:
    n = config.resolved_num_proc()
    if config.num_proc is None:
        n = min(n, max(1, documents // _MIN_DOCS_PER_WORKER))
    return max(1, min(n, documents))


def clean_documents(
    ds: datasets.Dataset, config: DataConfig, num_proc: int, cache_file: Path, fingerprint: str
) -> datasets.Dataset:
    """The pipeline's cleaning step: `text` cleaned (or kept, with --no-clean), empties dropped, `split_hash` added."""
    features = datasets.Features({"text": datasets.Value("large_string"), "split_hash": datasets.Value("int64")})
    return ds.map(
        clean_batch,
        batched=True,
        batch_size=_MAP_BATCH,
        fn_kwargs={"clean": config.clean, "split_seed": config.split_seed},
        features=features,
        num_proc=num_proc if num_proc > 1 else None,
        cache_file_name=str(cache_file),
        load_from_cache_file=False,
        new_fingerprint=fingerprint,  # skips hashing the function, which datasets would otherwise do
        desc="Cleaning" if config.clean else "Dropping empty documents",
    )


def tokenize_documents(
    ds: datasets.Dataset,
    tokenizer: transformers.PreTrainedTokenizerFast,
    num_proc: int,
    cache_file: Path,
    fingerprint: str,
) -> datasets.Dataset:
    """The pipeline's tokenize step: `text` -> `input_ids` (int32, EOT-terminated), other columns kept."""
    # With a worker pool each worker is one tokenizing process; the tokenizer's own thread pool on top
    # would oversubscribe the cores, and once used it makes every later fork (DataLoader workers) warn.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    features = ds.features.copy()
    del features["text"]
    features["input_ids"] = datasets.Sequence(datasets.Value("int32"))  # Sequence: datasets 3.x has no List
    return ds.map(
        tokenize_batch,
        batched=True,
        batch_size=_MAP_BATCH,
        fn_kwargs={"tokenizer": tokenizer, "eot_id": tokenizer.eos_token_id},
        remove_columns=["text"],
        features=features,
        num_proc=num_proc if num_proc > 1 else None,
        cache_file_name=str(cache_file),
        load_from_cache_file=False,
        new_fingerprint=fingerprint,
        desc="Tokenizing",
    )


# ----------------------------------------------------------------------------- build and load


@contextlib.contextmanager
def _progress_bars(show: bool) -> Iterator[None]:
    """Show or hide datasets' progress bars for the block, restoring the previous setting after it."""
    was_enabled = datasets.utils.logging.is_progress_bar_enabled()
    (datasets.enable_progress_bars if show else datasets.disable_progress_bars)()
    try:
        yield
    finally:
        (datasets.enable_progress_bars if was_enabled else datasets.disable_progress_bars)()


def _write_arrow(table: pa.Table, path: Path) -> datasets.Dataset:
    """Write the corpus where workers can memory-map it, rather than pickle it to each of them."""
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=_MAP_BATCH)
    return datasets.Dataset.from_file(str(path))


def _build(
    tmp: Path,
    config: DataConfig,
    sources: Sources,
    tokenizer: transformers.PreTrainedTokenizerFast,
    key: str,
    key_parts: dict[str, Any],
    log: Log,
) -> dict[str, Any]:
    """Build the packed splits into folder `tmp` and return the entry's metadata."""
    work = tmp / "work"
    work.mkdir()
    read = read_corpus(sources, config)
    documents_read, tokens = _clean_and_tokenize(read, work, config, sources.description, tokenizer, key, log)
    dtype = token_dtype(len(tokenizer))
    split_by, packed, documents_kept = _split_and_pack(tokens, tmp, dtype, config, sources.description, log)
    del tokens  # its Arrow file is memory-mapped: released before the folder goes
    shutil.rmtree(work)  # intermediate Arrow files; only the packed blocks are kept
    return {
        "pipeline_version": PIPELINE_VERSION,
        "key": key,
        "key_parts": key_parts,
        "source": sources.description,
        "block_size": config.block_size,
        "dtype": dtype.name,
        "vocab_size": len(tokenizer),
        "eot_id": tokenizer.eos_token_id,
        "documents_read": documents_read,
        "documents_empty": documents_read - documents_kept,
        "split_by": split_by,
        "splits": {
            name: {**asdict(stats), "bytes": stats.blocks * (config.block_size + 1) * dtype.itemsize}
            for name, stats in zip(("train", "val"), packed)
        },
        "not_utf8": _not_utf8_report(read),
    }


def _clean_and_tokenize(
    read: Corpus,
    work: Path,
    config: DataConfig,
    description: str,
    tokenizer: transformers.PreTrainedTokenizerFast,
    key: str,
    log: Log,
) -> tuple[int, datasets.Dataset]:
    """Clean and tokenize the documents read, through Arrow files in `work`: how many were read, and the
    tokens of the non-empty ones."""
    corpus = _write_arrow(read.table, work / "corpus.arrow")
    num_proc = _workers(config, len(corpus))
    log(f"data: {len(corpus):,} documents read; cleaning and tokenizing with {num_proc} process(es)")
    with _progress_bars(len(corpus) >= _MIN_DOCS_FOR_PROGRESS):
        cleaned = clean_documents(corpus, config, num_proc, work / "cleaned.arrow", f"{key}-clean")
        if len(cleaned) == 0:
            raise DataError(f"{description}: no non-empty documents after cleaning; check --text_column")
        tokens = tokenize_documents(cleaned, tokenizer, num_proc, work / "tokens.arrow", f"{key}-tokens")
    return len(corpus), tokens


def _split_and_pack(
    tokens: datasets.Dataset, tmp: Path, dtype: np.dtype, config: DataConfig, description: str, log: Log
) -> tuple[str, tuple[SplitStats, SplitStats], int]:
    """Hold out validation (whole documents, else the token stream's tail) and pack both splits into `tmp`.

    Returns how the split was made (SPLIT_BY_*), the two splits' stats and the number of documents packed.
    """
    table = tokens.data.table
    lengths = pc.list_value_length(table.column("input_ids")).to_numpy().astype(np.int64)
    doc_hash = table.column("split_hash").to_numpy()
    is_val = assign_validation(doc_hash, lengths, config.val_fraction, config.block_size, description, log)
    batches = record_batches(table.select(["input_ids"]))
    if is_val is not None:
        packed = (
            pack_split(batches, ~is_val, tmp / "train.bin", dtype, config.block_size),
            pack_split(batches, is_val, tmp / "val.bin", dtype, config.block_size),
        )
        return SPLIT_BY_DOCUMENT, packed, len(lengths)
    train, val = pack_token_split(
        batches, lengths, tmp / "train.bin", tmp / "val.bin", dtype, config.block_size, config.val_fraction
    )
    log(
        f"data: {len(lengths):,} document(s) cannot be split by document into a training and a validation "
        f"block of {config.block_size + 1} tokens each; holding out the tail of the token stream instead: "
        f"the last {val.blocks:,} of {train.blocks + val.blocks:,} blocks (val_fraction {config.val_fraction})"
    )
    return SPLIT_BY_TOKEN_STREAM, (train, val), len(lengths)


def _not_utf8_report(read: Corpus) -> dict[str, Any]:
    """What the warning about bytes that are not UTF-8 says, kept with the entry so a hit says it too."""
    return {
        "files": len(read.not_utf8),
        "bytes": sum(n for _, n in read.not_utf8),
        "files_read": read.files_read,
        "named": [name for name, _ in read.not_utf8[:_NOT_UTF8_NAMED]],
    }


def _not_utf8_warning(report: dict[str, Any]) -> str:
    more = report["files"] - len(report["named"])
    named = ", ".join(report["named"]) + (f" and {more:,} more" if more else "")
    return (
        f"warning: {report['files']:,} of {report['files_read']:,} files had bytes that are not UTF-8 "
        f"({report['bytes']:,} bytes, decoded as U+FFFD): {named}; --strict_utf8 refuses such files instead"
    )


def _key_parts(config: DataConfig, sources: Sources, tokenizer_fp: str) -> dict[str, Any]:
    """Every input that changes the packed result; paths and worker counts are left out on purpose."""
    return {
        "pipeline_version": PIPELINE_VERSION,
        "sources": sources.key,
        "tokenizer": tokenizer_fp,
        "block_size": config.block_size,
        "clean": config.clean,
        # A strict run must fail on a corpus that a lenient run packed with U+FFFD, not reuse its entry.
        "strict_utf8": config.strict_utf8,
        "cleaning_version": CLEANING_VERSION if config.clean else None,
        "text_column": config.text_column,
        "prepend_title": config.prepend_title,
        "max_documents": config.max_documents,
        "val_fraction": config.val_fraction,
        "split_seed": config.split_seed,
    }


def _log_source(config: DataConfig, sources: Sources, log: Log) -> None:
    if config.uses_sample:
        log(
            f"data: no --data given, using the bundled sample ({sources.files[0].path}): a few dozen short "
            "fictional articles, enough to check that everything runs, not to train a model. "
            "For real training point at the All the News CSVs: --data path/to/articles*.csv"
        )
    else:
        log(f"data: using {sources.description}")


def _load_or_build(config: DataConfig, log: Log) -> PackedData:
    start = time.perf_counter()
    root = config.resolved_cache_dir()
    sources = describe(config, root / "hf")  # first: a wrong path should fail before anything slow
    _log_source(config, sources, log)
    tokenizer = load_tokenizer(config.tokenizer)
    key_parts = _key_parts(config, sources, tokenizer_fingerprint(tokenizer))
    key = cache_key(key_parts)
    packed_root = root / "packed"
    meta = read_entry(packed_root, key)
    cache_hit = meta is not None
    if meta is None:
        log(f"data: no cache entry {key}; building it under {packed_root}")
        meta = publish(packed_root, key, lambda tmp: _build(tmp, config, sources, tokenizer, key, key_parts, log))
    else:
        log(f"data: reusing cache entry {packed_root / key}")
    folder = packed_root / key
    splits = {
        name: PackedDataset(folder / f"{name}.bin", meta["block_size"], meta["splits"][name]["blocks"], meta["dtype"])
        for name in ("train", "val")
    }
    split_stats = {
        name: SplitStats(**{k: v for k, v in meta["splits"][name].items() if k != "bytes"}) for name in splits
    }
    stats = DataStats(
        source=sources.description,
        train=split_stats["train"],
        val=split_stats["val"],
        block_size=meta["block_size"],
        vocab_size=meta["vocab_size"],
        eot_id=meta["eot_id"],
        documents_read=meta["documents_read"],
        documents_empty=meta["documents_empty"],
        split_by=meta["split_by"],
        not_utf8_files=meta["not_utf8"]["files"],
        not_utf8_bytes=meta["not_utf8"]["bytes"],
        cache_key=key,
        cache_hit=cache_hit,
        cache_path=str(folder),
        build_time_s=time.perf_counter() - start,
    )
    if stats.not_utf8_files:
        log(_not_utf8_warning(meta["not_utf8"]))
    for line in stats.summary():
        log(line)
    return PackedData(train=splits["train"], val=splits["val"], stats=stats)


def build_datasets(
    config: DataConfig,
    main_process_first: Callable[[], AbstractContextManager] | None = None,
    log: Log = print,
) -> PackedData:
    """Build (or reuse from the cache) the packed train and validation datasets of `config`.

    Under several processes pass `main_process_first=accelerator.main_process_first`: the main
    process then builds the cache while the others wait, and they open the same entry after it, so
    every rank gets identical data. The cache folder must be shared by the processes that wait.
    """
    with main_process_first() if main_process_first is not None else contextlib.nullcontext():
        return _load_or_build(config, log)
