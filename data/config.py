"""DataConfig: what corpus to read and how to turn it into training blocks."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The bundled sample, used when no data is given, so a fresh machine runs end to end offline.
SAMPLE_CSV = Path(__file__).resolve().parent / "sample" / "all_the_news_sample.csv"

# Text column used when `text_column` is None, per source format.
DEFAULT_TEXT_COLUMN = {"csv": "content", "json": "text", "jsonl": "text", "parquet": "text", "hf": "text"}

# More workers than this mostly add start-up and pickling cost on a single document stream.
MAX_DEFAULT_NUM_PROC = 8


def default_cache_dir() -> Path:
    """The project's cache folder when none is given: $GPT2S_CACHE, else ~/.cache/gpt2-strategies."""
    env = os.environ.get("GPT2S_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "gpt2-strategies"


def _help(text: str, **kwargs: Any) -> Any:
    return field(metadata={"help": text}, **kwargs)


@dataclass
class DataConfig:
    """Corpus, tokenizer, block size, validation split and cache of the input pipeline."""

    paths: list[str] = _help(
        "corpus files, folders or globs (.csv, .txt, .json, .jsonl, .parquet); none = the bundled sample; "
        "with --hf_dataset csv/json/parquet they are its data_files",
        default_factory=list,
    )
    hf_dataset: str | None = _help(
        "Hugging Face dataset name for datasets.load_dataset (or a folder written by save_to_disk)", default=None
    )
    hf_config: str | None = _help("configuration name of --hf_dataset", default=None)
    hf_split: str = _help("split of --hf_dataset to read", default="train")
    text_column: str | None = _help(
        "column holding the document text (none: content for CSV, text for JSON/JSONL/parquet/HF)", default=None
    )
    prepend_title: bool = _help(
        "document = the title column, a blank line, then the text (CSV, JSON, parquet, HF; not .txt)", default=False
    )
    clean: bool = _help("strip HTML tags, decode entities and normalise whitespace", default=True)
    strict_utf8: bool = _help(
        "refuse a .csv/.txt/.json/.jsonl file with bytes that are not UTF-8 (off: they are read as U+FFFD and counted)",
        default=False,
    )
    tokenizer: str | None = _help(
        "tokenizer hub name or folder (none: GPT-2's BPE, bundled and verified, offline)", default=None
    )
    block_size: int = _help("tokens per training sequence; blocks hold block_size+1 tokens", default=1024)
    val_fraction: float = _help("fraction of documents held out for validation (0 = no validation split)", default=0.05)
    split_seed: int = _help("seed of the train/validation assignment of documents", default=1234)
    cache_dir: str | None = _help(
        "where packed datasets (and the measured CPU peak FLOP/s) are cached (none: $GPT2S_CACHE or ~/.cache/gpt2-strategies)",
        default=None,
    )
    num_proc: int | None = _help(
        "worker processes for cleaning and tokenizing (none: min(CPU count, 8); 1 = no worker pool)", default=None
    )
    max_documents: int | None = _help(
        "use only the first N documents of the corpus, before empty ones are dropped (for quick runs)", default=None
    )

    def __post_init__(self) -> None:
        if isinstance(self.paths, (str, os.PathLike)):
            self.paths = [self.paths]  # a lone path is an easy slip from Python callers
        self.paths = [os.fspath(p) for p in self.paths]
        if self.block_size < 1:
            raise ValueError(f"--block_size must be >= 1, got {self.block_size}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"--val_fraction must be in [0, 1), got {self.val_fraction}")
        if self.num_proc is not None and self.num_proc < 1:
            raise ValueError(f"--num_proc must be >= 1, got {self.num_proc}")
        if self.max_documents is not None and self.max_documents < 1:
            raise ValueError(f"--max_documents must be >= 1, got {self.max_documents}")
        if self.text_column is not None and not self.text_column:
            raise ValueError("--text_column must not be empty")
        if not self.hf_split:
            raise ValueError("--hf_split must not be empty")
        if self.hf_dataset is None and (self.hf_config is not None):
            raise ValueError("--hf_config needs --hf_dataset")

    @property
    def uses_sample(self) -> bool:
        """True when neither files nor a HF dataset were given, so the bundled sample is read."""
        return not self.paths and self.hf_dataset is None

    def resolved_cache_dir(self) -> Path:
        """The cache folder: cache_dir, else $GPT2S_CACHE, else ~/.cache/gpt2-strategies."""
        if self.cache_dir:
            return Path(self.cache_dir).expanduser()
        return default_cache_dir()

    def resolved_num_proc(self) -> int:
        """Worker processes to use: num_proc, else min(CPU count, 8)."""
        if self.num_proc is not None:
            return self.num_proc
        # The CPUs this process may run on (a container or taskset may allow fewer than the machine has).
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return max(1, min(cpus, MAX_DEFAULT_NUM_PROC))
