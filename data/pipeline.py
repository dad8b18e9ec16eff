"""build_datasets: corpus -> clean -> tokenize -> split by document -> pack into blocks -> cache.

A corpus of too few documents to split by document (one large file) is split in its token stream.

Two stages, each cached: the tokenized documents (data/documents.py), keyed by what decides them,
and the packed splits, keyed by those documents plus block size, validation fraction and split
seed. A change to the packing alone re-packs the stored documents; any other change tokenizes again.
Each key covers every input that changes its result, so a hit is always safe to use.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from data.cache import cache_key, publish, read_entry
from data.clean import CLEANING_VERSION
from data.config import DataConfig
from data.dataset import PackedDataset
from data.documents import (
    TEXT_FILE,
    TEXT_LENGTHS_FILE,
    TOKEN_LENGTHS_FILE,
    TOKENS_FILE,
    StoreTotals,
    encoded_batches,
    read_lengths,
    require_documents,
    store_file_sizes,
    text_batches,
    write_store,
)
from data.packing import (
    Progress,
    SplitStats,
    assign_validation,
    pack_split,
    pack_token_split,
    split_hashes,
    token_dtype,
)
from data.sources import ReadReport, Sources, describe, iter_documents
from data.tokenizer import DocumentTokenizer, describe_tokenizer, load_document_tokenizer

# Part of the cache key: bump when packing or the stored layout changes. 2: corpora of too few
# documents are split in their token stream (`split_by`), which entries of 1 neither did nor record.
# 3: packed from a store of tokenized documents, keyed by that store.
PIPELINE_VERSION = 3
# Part of the store's key: bump when the tokenized documents or their layout change.
DOCUMENTS_VERSION = 1
# How validation was held out (DataStats.split_by): whole documents by hash, or the token stream's tail.
SPLIT_BY_DOCUMENT = "document"
SPLIT_BY_TOKEN_STREAM = "token_stream"
# Below this much text per worker, starting a pool costs more than it saves (default num_proc only).
_MIN_BYTES_PER_WORKER = 4 * 2**20
# Below this much text tokenizing takes a few seconds and a progress bar is only noise (on stderr,
# where it would also bury the one-line error of a corpus that is too small).
_MIN_BYTES_FOR_PROGRESS = 32 * 2**20
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
    # Seconds per stage of this call (hash, read, clean, tokenize, split, pack, total; clean and tokenize
    # are CPU time summed over `workers` processes), only those that ran: a hit has hash and total.
    stage_seconds: dict[str, float] = field(default_factory=dict)

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
        return [line("train", self.train), line("val", self.val) + tail, self.timing()]

    def timing(self) -> str:
        """One line with the time each stage took."""
        s = self.stage_seconds
        parts = [f"{name} {s[name]:.1f} s" for name in ("hash", "read", "split", "pack") if name in s]
        if "tokenize" in s:
            parts.insert(
                2,
                f"clean {s['clean']:.1f} s and tokenize {s['tokenize']:.1f} s of CPU "
                f"in {int(s['workers'])} process(es)",
            )
        built = "built" if not self.cache_hit else "reused"
        return f"data: {built} in {s.get('total', self.build_time_s):.1f} s: " + ", ".join(parts)


@dataclass
class PackedData:
    """The packed splits and how they came about."""

    train: PackedDataset
    val: PackedDataset
    stats: DataStats


# ----------------------------------------------------------------------------- stage 1: tokenized documents


def _workers(config: DataConfig, source_bytes: int) -> int:
    n = config.resolved_num_proc()
    if config.num_proc is None:  # chosen by default: fewer for a small corpus, where a pool costs more than it saves
        n = min(n, max(1, source_bytes // _MIN_BYTES_PER_WORKER))
    return max(1, n)


def _source_bytes(sources: Sources) -> int:
    """The corpus's size: its files', or a Hugging Face dataset's Arrow data."""
    if sources.hf_dataset is not None:
        return int(sources.hf_dataset.data.nbytes)
    return sum(f.path.stat().st_size for f in sources.files)


def _progress(show: bool, total: int, unit: str, desc: str) -> Any:
    """A bar with the rate and the time left on stderr (a no-op when not shown)."""
    divisor = 1024 if unit == "B" else 1000
    return tqdm(total=total, unit=unit, unit_scale=True, unit_divisor=divisor, desc=desc, disable=not show)


def tokenize_documents(
    folder: Path, config: DataConfig, sources: Sources, tokenizer: DocumentTokenizer, dtype: np.dtype, log: Log
) -> dict[str, Any]:
    """Read, clean and tokenize the corpus in one streamed pass into a store in `folder`; its metadata."""
    report = ReadReport()
    totals = StoreTotals()
    size = _source_bytes(sources)
    workers = _workers(config, size)
    log(f"data: reading, cleaning and tokenizing with {workers} process(es), {describe_tokenizer(tokenizer)}")
    texts = text_batches(iter_documents(sources, config, report), totals.seconds)
    encoded = encoded_batches(texts, tokenizer, config.clean, dtype, workers)
    show = size >= _MIN_BYTES_FOR_PROGRESS
    unit = "B" if sources.hf_dataset is None else "documents"
    with _progress(show, 0, unit, "Reading, cleaning, tokenizing") as bar:
        write_store(folder, _tracked(encoded, report, bar), totals)
    require_documents(totals, sources.description)
    return {
        "documents_version": DOCUMENTS_VERSION,
        "files": store_file_sizes(totals, dtype),
        "dtype": dtype.name,
        "documents_read": totals.documents_read,
        "documents": totals.documents,
        "tokens": totals.tokens,
        "not_utf8": _not_utf8_report(report),
        "seconds": {**totals.seconds, "workers": workers},
    }


def _tracked(batches: Iterator[Any], report: ReadReport, bar: Any) -> Iterator[Any]:
    """The batches, moving the bar to how far reading has come as each one is written."""
    for batch in batches:
        bar.total = report.total
        bar.update(report.done - bar.n)
        yield batch


def _documents(
    root: Path, config: DataConfig, sources: Sources, tokenizer: DocumentTokenizer, key: str, log: Log
) -> tuple[Path, dict[str, Any], bool]:
    """The store of tokenized documents for `key`: reused when present, else built; its folder,
    metadata and whether it was reused."""
    folder = root / "documents"
    meta = read_entry(folder, key)
    if meta is not None:
        log(f"data: reusing tokenized documents {folder / key}; packing them only")
        return folder / key, meta, True
    log(f"data: no tokenized documents {key}; building them under {folder}")
    dtype = token_dtype(tokenizer.vocab_size)
    meta = publish(folder, key, lambda tmp: tokenize_documents(tmp, config, sources, tokenizer, dtype, log))
    return folder / key, meta, False


# ----------------------------------------------------------------------------- stage 2: split and pack


def _build(
    store: Path, store_meta: dict[str, Any], tmp: Path, config: DataConfig, description: str, log: Log
) -> dict[str, Any]:
    """Split the stored documents and pack both splits into folder `tmp`; the entry's metadata."""
    dtype = np.dtype(store_meta["dtype"])
    lengths = read_lengths(store, TOKEN_LENGTHS_FILE)
    text_lengths = read_lengths(store, TEXT_LENGTHS_FILE)
    show = int(text_lengths.sum()) >= _MIN_BYTES_FOR_PROGRESS
    start = time.perf_counter()
    with _progress(show, int(text_lengths.sum()), "B", "Splitting") as bar:
        doc_hash = split_hashes(store / TEXT_FILE, text_lengths, config.split_seed, bar.update)
    is_val = assign_validation(doc_hash, lengths, config.val_fraction, config.block_size, description, log)
    split_s = time.perf_counter() - start
    passes = 1 if is_val is None else 2  # one pass over the tokens per split written from them
    with _progress(show, passes * int(lengths.sum()), " tokens", "Packing") as bar:
        split_by, packed = _pack(store / TOKENS_FILE, dtype, lengths, is_val, tmp, config, log, bar.update)
    return {
        "pipeline_version": PIPELINE_VERSION,
        "block_size": config.block_size,
        "dtype": dtype.name,
        "documents_read": store_meta["documents_read"],
        "documents_empty": store_meta["documents_read"] - store_meta["documents"],
        "split_by": split_by,
        "splits": {
            name: {**asdict(stats), "bytes": stats.blocks * (config.block_size + 1) * dtype.itemsize}
            for name, stats in zip(("train", "val"), packed)
        },
        "not_utf8": store_meta["not_utf8"],
        "seconds": {"split": split_s, "pack": time.perf_counter() - start - split_s},
    }


def _pack(
    tokens: Path,
    dtype: np.dtype,
    lengths: np.ndarray,
    is_val: np.ndarray | None,
    tmp: Path,
    config: DataConfig,
    log: Log,
    progress: Progress,
) -> tuple[str, tuple[SplitStats, SplitStats]]:
    """Pack both splits into `tmp`: whole documents by `is_val`, or (None) the token stream's tail as validation."""
    if is_val is not None:
        return SPLIT_BY_DOCUMENT, (
            pack_split(tokens, dtype, lengths, ~is_val, tmp / "train.bin", config.block_size, progress),
            pack_split(tokens, dtype, lengths, is_val, tmp / "val.bin", config.block_size, progress),
        )
    train, val = pack_token_split(
        tokens, dtype, lengths, tmp / "train.bin", tmp / "val.bin", config.block_size, config.val_fraction, progress
    )
    log(
        f"data: {len(lengths):,} document(s) cannot be split by document into a training and a validation "
        f"block of {config.block_size + 1} tokens each; holding out the tail of the token stream instead: "
        f"the last {val.blocks:,} of {train.blocks + val.blocks:,} blocks (val_fraction {config.val_fraction})"
    )
    return SPLIT_BY_TOKEN_STREAM, (train, val)


def _not_utf8_report(read: ReadReport) -> dict[str, Any]:
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


def _document_key_parts(config: DataConfig, sources: Sources, tokenizer: DocumentTokenizer) -> dict[str, Any]:
    """Every input that changes the tokenized documents; paths and worker counts are left out on purpose."""
    return {
        "documents_version": DOCUMENTS_VERSION,
        "sources": sources.key,
        # The implementation is part of it (tiktoken and transformers fingerprint differently), though
        # both give GPT-2 the same ids: an entry says which one made it.
        "tokenizer": tokenizer.fingerprint(),
        "clean": config.clean,
        # A strict run must fail on a corpus that a lenient run read with U+FFFD, not reuse its entry.
        "strict_utf8": config.strict_utf8,
        "cleaning_version": CLEANING_VERSION if config.clean else None,
        "text_column": config.text_column,
        "prepend_title": config.prepend_title,
        "max_documents": config.max_documents,
    }


def _key_parts(config: DataConfig, documents_key: str) -> dict[str, Any]:
    """The packed entry's inputs: the tokenized documents, and how they are split and packed."""
    return {
        "pipeline_version": PIPELINE_VERSION,
        "documents": documents_key,
        "block_size": config.block_size,
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
    seconds = {"hash": time.perf_counter() - start}
    _log_source(config, sources, log)
    tokenizer = load_document_tokenizer(config.tokenizer)
    documents_key = cache_key(_document_key_parts(config, sources, tokenizer))
    key = cache_key(_key_parts(config, documents_key))
    packed_root = root / "packed"
    meta = read_entry(packed_root, key)
    cache_hit = meta is not None
    if meta is None:
        store, store_meta, reused = _documents(root, config, sources, tokenizer, documents_key, log)
        log(f"data: no cache entry {key}; packing it under {packed_root}")
        meta = publish(packed_root, key, lambda tmp: _build(store, store_meta, tmp, config, sources.description, log))
        seconds.update({} if reused else store_meta["seconds"])
        seconds.update(meta["seconds"])
    else:
        log(f"data: reusing cache entry {packed_root / key}")
    seconds["total"] = time.perf_counter() - start
    data = _open_entry(packed_root / key, meta, tokenizer, sources.description, cache_hit, seconds)
    if data.stats.not_utf8_files:
        log(_not_utf8_warning(meta["not_utf8"]))
    for line in data.stats.summary():
        log(line)
    return data


def _open_entry(
    folder: Path,
    meta: dict[str, Any],
    tokenizer: DocumentTokenizer,
    description: str,
    cache_hit: bool,
    seconds: dict[str, float],
) -> PackedData:
    """The datasets of a published packed entry, and their statistics."""
    splits = {
        name: PackedDataset(folder / f"{name}.bin", meta["block_size"], meta["splits"][name]["blocks"], meta["dtype"])
        for name in ("train", "val")
    }
    split_stats = {
        name: SplitStats(**{k: v for k, v in meta["splits"][name].items() if k != "bytes"}) for name in splits
    }
    stats = DataStats(
        source=description,
        train=split_stats["train"],
        val=split_stats["val"],
        block_size=meta["block_size"],
        vocab_size=tokenizer.vocab_size,
        eot_id=tokenizer.eot_id,
        documents_read=meta["documents_read"],
        documents_empty=meta["documents_empty"],
        split_by=meta["split_by"],
        not_utf8_files=meta["not_utf8"]["files"],
        not_utf8_bytes=meta["not_utf8"]["bytes"],
        cache_key=folder.name,
        cache_hit=cache_hit,
        cache_path=str(folder),
        build_time_s=seconds["total"],
        stage_seconds=seconds,
    )
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
