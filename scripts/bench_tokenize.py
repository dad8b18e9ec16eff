"""Benchmark (not a test): tokens/s of the pipeline's tokenize step against the bare tokenizer.

    python scripts/bench_tokenize.py [--data PATH ...] [--min_tokens 2000000] [--repeats 3]

Both run in this one process on the same documents, with the tokenizer's own thread pool off, so the
figures are per process; the pipeline runs with num_proc workers of one process each. The ratio shows
what `datasets.map` (batching, Arrow conversion, writing the cache file) costs on top of `tok(batch)`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ["TOKENIZERS_PARALLELISM"] = "false"  # per-process figures: no hidden extra threads
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, to run as a file

import datasets  # noqa: E402
import pyarrow as pa  # noqa: E402

from data import DataConfig, load_tokenizer  # noqa: E402
from data.clean import clean_text, is_empty  # noqa: E402
from data.config import SAMPLE_CSV  # noqa: E402
from data.pipeline import _write_arrow, tokenize_batch, tokenize_documents  # noqa: E402
from data.sources import describe, read_documents  # noqa: E402

BATCH = 1000


def corpus_texts(paths: list[str], min_tokens: int, tokenizer) -> list[str]:
    """Cleaned documents of the corpus, repeated until they hold at least `min_tokens` tokens."""
    config = DataConfig(paths=paths)
    with tempfile.TemporaryDirectory() as tmp:
        texts = read_documents(describe(config, Path(tmp)), config).column("text").to_pylist()
    texts = [t for t in (clean_text(x) for x in texts) if not is_empty(t)]
    per_pass = sum(len(ids) for ids in tokenizer(texts)["input_ids"])
    return texts * max(1, -(-min_tokens // per_pass))


def bench_bare(tokenizer, texts: list[str]) -> tuple[int, float]:
    start = time.perf_counter()
    tokens = 0
    for i in range(0, len(texts), BATCH):
        tokens += sum(len(ids) for ids in tokenizer(texts[i : i + BATCH])["input_ids"])
    return tokens, time.perf_counter() - start


def bench_pipeline(tokenizer, texts: list[str], num_proc: int) -> tuple[int, float]:
    with tempfile.TemporaryDirectory() as tmp:
        # File-backed, as in the pipeline, so workers memory-map the text instead of receiving it pickled.
        ds = _write_arrow(pa.table({"text": pa.array(texts, pa.large_string())}), Path(tmp) / "corpus.arrow")
        start = time.perf_counter()
        out = tokenize_documents(ds, tokenizer, num_proc, Path(tmp) / "tokens.arrow", f"bench-{time.time_ns()}")
        elapsed = time.perf_counter() - start
        # Count without the EOT the pipeline appends, to compare like with like.
        tokens = int(pa.compute.sum(pa.compute.list_value_length(out.data.table.column("input_ids"))).as_py()) - len(
            out
        )
    return tokens, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", nargs="*", default=[], help=f"corpus (default: the bundled sample {SAMPLE_CSV.name})")
    parser.add_argument("--min_tokens", type=int, default=2_000_000, help="repeat the corpus up to this many tokens")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each; the best is reported")
    parser.add_argument("--num_proc", type=int, default=1, help="pipeline worker processes")
    args = parser.parse_args()

    datasets.disable_progress_bars()
    tokenizer = load_tokenizer()
    texts = corpus_texts(args.data, args.min_tokens, tokenizer)
    tokenize_batch({"text": texts[:BATCH]}, tokenizer, tokenizer.eos_token_id)  # warm the BPE cache for both
    # Alternate the two, so a change in machine load during the run weighs on both alike.
    runs = [
        (bench_bare(tokenizer, texts), bench_pipeline(tokenizer, texts, args.num_proc)) for _ in range(args.repeats)
    ]
    bare = min((r[0] for r in runs), key=lambda r: r[1])
    pipe = min((r[1] for r in runs), key=lambda r: r[1])
    assert bare[0] == pipe[0], f"token counts differ: bare {bare[0]}, pipeline {pipe[0]}"
    bare_rate = bare[0] / bare[1]
    pipe_rate = pipe[0] / pipe[1] / args.num_proc
    print(f"documents: {len(texts):,}  tokens: {bare[0]:,}  cpus: {os.cpu_count()}")
    print(f"bare tokenizer   tok(batch):         {bare_rate:>12,.0f} tokens/s per process")
    print(f"pipeline step    tokenize_documents: {pipe_rate:>12,.0f} tokens/s per process (num_proc={args.num_proc})")
    print(f"pipeline / bare: {pipe_rate / bare_rate:.1%}")


if __name__ == "__main__":
    main()
