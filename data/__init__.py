"""The input pipeline: read a corpus, clean it, tokenize, split by document, pack into blocks, cache."""

from data.config import DataConfig
from data.dataset import PackedDataset
from data.errors import DataError
from data.pipeline import DataStats, PackedData, build_datasets
from data.tokenizer import load_tokenizer, tokenizer_fingerprint

__all__ = [
    "DataConfig",
    "DataError",
    "DataStats",
    "PackedData",
    "PackedDataset",
    "build_datasets",
    "load_tokenizer",
    "tokenizer_fingerprint",
]
