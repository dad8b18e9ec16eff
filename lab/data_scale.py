"""The data pipeline at All the News's scale: wall time, tokens/s, memory high-water mark, and the
ratio to the bare tokenizer.

    python -m lab.data_scale --articles 143000 --dir /tmp/atn [--num_proc 2] [--reuse]

Builds (or, with --reuse, takes) a corpus of the given number of articles in --dir, shaped as Kaggle's
All the News: three CSVs articles1-3.csv with its header and about 4.6 KB of text per article (143,000
articles make about 660 MB). The text is sampled from the words of the bundled sample, with made-up
words, names and numbers mixed in, so that a tokenizer meets new words as it would in news rather
than the same few hundred again. Then `python -m data.prepare` runs on it in a child process with a
fresh cache, while this process samples the memory of the child and its workers (the sum of their
proportional set sizes, PSS, so pages that forked workers share count once). A second prepare with
another block size shows the re-pack from the cached tokenized documents. Last, the bare tokenizer's
tokens/s is measured in this process on the corpus's first articles: tiktoken as the pipeline runs
it, and transformers' GPT2TokenizerFast that the pipeline used before.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import resource
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil

from data.clean import clean_text
from data.config import SAMPLE_CSV
from data.tokenizer import load_document_tokenizer, load_tokenizer
from training.cli import run_main

REPO = Path(__file__).resolve().parents[1]
KAGGLE_HEADER = ["", "id", "title", "publication", "author", "date", "year", "month", "url", "content"]
ARTICLE_BYTES = 4_600  # All the News: about 661 MB over 143,000 articles
FILES = 3
_SYLLABLES = ["ka", "lo", "mi", "ren", "tu", "sa", "vel", "or", "an", "thi", "qu", "es", "dor", "pi", "ñe", "ü", "zé"]


# ----------------------------------------------------------------------------- the corpus


def _vocabulary(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Words and the cumulative sum of their Zipf-like weights: the bundled sample's words (punctuation attached, as in text),
    made-up words and names, and numbers."""
    with open(SAMPLE_CSV, newline="", encoding="utf-8") as f:
        sample = " ".join(clean_text(row["content"]) for row in csv.DictReader(f))
    counts = Counter(re.findall(r"\S+", sample))
    made_up = ["".join(rng.choice(_SYLLABLES, size=rng.integers(2, 5))) for _ in range(40_000)]
    names = [w.capitalize() for w in made_up[:8_000]]
    numbers = [str(n) for n in rng.integers(0, 100_000, size=4_000)]
    rare = np.array(made_up + names + numbers, dtype=object)
    rng.shuffle(rare)
    # The sample's words take the frequent ranks, in their own order of frequency; the rest, the tail.
    vocab = np.array([w for w, _ in counts.most_common()] + list(rare), dtype=object)
    weights = 1.0 / np.arange(1, len(vocab) + 1) ** 1.15
    return vocab, np.cumsum(weights / weights.sum())


def _words(rng: np.random.Generator, vocab: np.ndarray, cdf: np.ndarray, count: int) -> np.ndarray:
    return vocab[np.minimum(np.searchsorted(cdf, rng.random(count)), len(vocab) - 1)]


def _article(rng: np.random.Generator, vocab: np.ndarray, cdf: np.ndarray) -> str:
    words = _words(rng, vocab, cdf, int(rng.integers(350, 1250)))
    cuts = np.cumsum(rng.integers(40, 120, size=len(words) // 40 + 1))
    paragraphs = [" ".join(words[a:b]) for a, b in zip([0, *cuts[:-1]], cuts) if a < len(words)]
    return "\n\n".join(p[:1].upper() + p[1:] + "." for p in paragraphs if p)


def write_corpus(folder: Path, articles: int, seed: int = 0) -> list[Path]:
    """Three All the News-shaped CSVs of `articles` articles in all."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    vocab, cdf = _vocabulary(rng)
    paths, start = [], 0
    for i in range(FILES):
        count = articles // FILES + (1 if i < articles % FILES else 0)
        paths.append(folder / f"articles{i + 1}.csv")
        with open(paths[-1], "w", newline="", encoding="utf-8") as f:
            out = csv.writer(f, lineterminator="\n")
            out.writerow(KAGGLE_HEADER)
            for row in range(start, start + count):
                title = " ".join(_words(rng, vocab, cdf, 8)).capitalize()
                date = f"2016-{row % 12 + 1:02d}-{row % 28 + 1:02d}"
                out.writerow(
                    [
                        row,
                        17283 + row,
                        title,
                        "The Synthetic Times",
                        "A. Writer",
                        date,
                        "2016.0",
                        "1.0",
                        "",
                        _article(rng, vocab, cdf),
                    ]
                )
        start += count
    return paths


# ----------------------------------------------------------------------------- measuring prepare


@dataclass
class Run:
    wall_s: float
    cpu_s: float  # user + system time of the process and its workers: what a busy machine does not inflate
    peak_pss: int  # bytes: the highest sum of PSS over the process and its workers, sampled
    peak_rss_one: int  # bytes: the highest RSS of any one of them (the kernel's own high-water mark)
    stats: dict


def _tree_pss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


def run_prepare(args: list[str], interval_s: float = 0.2) -> Run:
    """`python -m data.prepare ARGS` in a child process, its wall time and memory high-water marks."""
    start = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = subprocess.Popen(
        [sys.executable, "-m", "data.prepare", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    peak = [0]

    def sample() -> None:
        proc = psutil.Process(child.pid)
        while child.poll() is None:
            try:
                peak[0] = max(peak[0], _tree_pss(proc))
            except psutil.NoSuchProcess:
                return
            time.sleep(interval_s)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = child.communicate()
    wall = time.perf_counter() - start
    sampler.join()
    if child.returncode != 0:
        raise SystemExit(f"error: data.prepare failed ({child.returncode}): {err.strip().splitlines()[-1:]}")
    # The log comes first on stdout, then the statistics as JSON.
    log, _, stats = out.partition("\n{")
    print("\n".join(f"  {line}" for line in log.splitlines() if line.startswith("data: built in")))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    rss_one = after.ru_maxrss * 1024
    return Run(wall_s=wall, cpu_s=cpu, peak_pss=peak[0], peak_rss_one=rss_one, stats=json.loads("{" + stats))


# ----------------------------------------------------------------------------- the bare tokenizer


def _first_articles(path: Path, count: int) -> list[str]:
    with open(path, newline="", encoding="utf-8") as f:
        rows = csv.DictReader(f)
        return [clean_text(next(rows)["content"]) for _ in range(count)]


def bare_tokens_per_s(texts: list[str], seconds: float = 5.0) -> dict[str, float]:
    """Tokens per CPU second of each tokenizer alone, one process, one thread, on `texts` (passes repeated
    for `seconds`); per CPU second, as the pipeline's figure it is compared with, so that a busy
    machine weighs on neither."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    fast, hf = load_document_tokenizer(), load_tokenizer()
    encoders = {
        "tiktoken": lambda: sum(len(ids) for ids in fast.encode(texts)),
        "transformers": lambda: sum(len(ids) for ids in hf(texts, add_special_tokens=False)["input_ids"]),
    }
    rates = {}
    for name, encode in encoders.items():
        tokens, start = 0, time.process_time()
        while time.process_time() - start < seconds:
            tokens += encode()
        rates[name] = tokens / (time.process_time() - start)
    return rates


# ----------------------------------------------------------------------------- the report


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--articles", type=int, default=143_000, help="articles in the corpus (All the News: 143,000)")
    parser.add_argument("--dir", required=True, help="folder of the corpus (and of the cache, under cache/)")
    parser.add_argument("--num_proc", type=int, default=2, help="worker processes of data.prepare")
    parser.add_argument(
        "--reuse", action="store_true", help="take the articles*.csv already in --dir instead of writing them"
    )
    parser.add_argument("--bare_articles", type=int, default=2_000, help="articles the bare tokenizers run on")
    parser.add_argument(
        "--bare_seconds", type=float, default=5.0, help="CPU seconds each bare tokenizer runs (a rate, not a count)"
    )
    args = parser.parse_args()

    folder = Path(args.dir)
    if args.reuse:
        paths = sorted(folder.glob("articles*.csv"))
    else:
        start = time.perf_counter()
        paths = write_corpus(folder, args.articles)
        print(f"corpus: wrote {len(paths)} CSVs in {time.perf_counter() - start:.0f} s")
    size = sum(p.stat().st_size for p in paths)
    print(f"corpus: {', '.join(map(str, paths))}: {size / 1e6:,.0f} MB")
    cache = folder / "cache"
    subprocess.run(["rm", "-rf", str(cache)], check=True)
    common = ["--data", *map(str, paths), "--cache_dir", str(cache), "--num_proc", str(args.num_proc)]
    print(f"prepare: {' '.join(common)}")
    full = run_prepare(common)
    tokens = full.stats["train"]["tokens"] + full.stats["val"]["tokens"]
    repack = run_prepare([*common, "--block_size", "128"])
    bare = bare_tokens_per_s(_first_articles(paths[0], args.bare_articles), args.bare_seconds)
    rate = tokens / full.wall_s
    rows = [
        ("articles", f"{full.stats['documents_read']:,}"),
        ("corpus", f"{size / 1e6:,.0f} MB in {len(paths)} CSVs"),
        ("tokens", f"{tokens:,}"),
        (f"prepare, {args.num_proc} workers: wall time", f"{full.wall_s:.1f} s"),
        ("prepare: CPU time, all processes", f"{full.cpu_s:.1f} s"),
        ("prepare: tokens/s (wall)", f"{rate:,.0f}"),
        ("prepare: tokens per CPU second", f"{tokens / full.cpu_s:,.0f}"),
        ("prepare: peak memory, sum of PSS over the processes", _gib(full.peak_pss)),
        ("prepare: peak RSS of the largest process", _gib(max(full.peak_rss_one, repack.peak_rss_one))),
        ("re-pack at block size 128: wall time", f"{repack.wall_s:.1f} s"),
        ("bare tiktoken, 1 process: tokens per CPU second", f"{bare['tiktoken']:,.0f}"),
        ("bare transformers, 1 process: tokens per CPU second", f"{bare['transformers']:,.0f}"),
        ("prepare / bare tiktoken, per CPU second", f"{tokens / full.cpu_s / bare['tiktoken']:.1%}"),
        ("prepare (wall) / (bare tiktoken x workers)", f"{rate / (bare['tiktoken'] * args.num_proc):.1%}"),
    ]
    print("\n| measure | value |\n| --- | --- |")
    for name, value in rows:
        print(f"| {name} | {value} |")


if __name__ == "__main__":
    run_main(main)
