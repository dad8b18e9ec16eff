"""The input pipeline: read a corpus, clean it, tokenize, split by document, pack into blocks, cache."""

from data.errors import DataError
from data.tokenizer import load_tokenizer, tokenizer_fingerprint

__all__ = ["DataError", "load_tokenizer", "tokenizer_fingerprint"]
