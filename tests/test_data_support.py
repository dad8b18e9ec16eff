"""Helpers shared by the data tests (no tests here): configs that never touch the user's cache,
and small corpora in the exact All the News CSV layout."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from data import DataConfig

KAGGLE_HEADER = ["", "id", "title", "publication", "author", "date", "year", "month", "url", "content"]


def config(tmp_path: Path, **overrides: Any) -> DataConfig:
    """A DataConfig with a private cache under tmp_path and no worker pool, unless overridden."""
    values: dict[str, Any] = {"cache_dir": str(tmp_path / "cache"), "num_proc": 1}
    values.update(overrides)
    return DataConfig(**values)


def article(i: int, words: int = 60) -> str:
    """A distinct document: it starts with a unique marker word, so tests can tell documents apart."""
    body = " ".join(f"word{(i * 7 + k) % 97}" for k in range(words))
    return f"Marker{i:04d} says: {body}."


def write_kaggle_csv(path: Path, contents: list[str], titles: list[str] | None = None) -> Path:
    """Write rows exactly as Kaggle's articles*.csv (pandas to_csv: unnamed index, minimal quoting)."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(KAGGLE_HEADER)
        for i, content in enumerate(contents):
            title = titles[i] if titles else f"Title {i}"
            w.writerow(
                [i, 1000 + i, title, "The Test Gazette", "A. Writer", "2017-01-01", "2017.0", "1.0", "", content]
            )
    return path


def log_sink() -> tuple[list[str], Any]:
    """A list that collects log lines, and the `log` callable that appends to it."""
    lines: list[str] = []
    return lines, lines.append
