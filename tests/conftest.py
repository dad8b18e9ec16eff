"""What the launch-based tests share over a session: one corpus, one cache, and one run per strategy.

The data cache is keyed by content and the measured CPU peak FLOP/s lives in the same cache folder, so
with one folder for the session the corpus is tokenized once and the peak measured once. `shared_runs`
launches each registry entry at most once, when a test first asks for it (one for several machines as the
SLURM recipe does, its launch line once per "machine" on loopback); the strategy, FSDP-mode,
registry, planner and resume tests all read the same run folders.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.launch import OFFLINE, SHARED_EXTRA, shared_args, train, train_on_machines, write_news_csv
from training import registry

# The test process and every process it starts: offline for the hub, and no W&B login from the machine.
os.environ.update(OFFLINE)
os.environ["NETRC"] = os.devnull
for _name in ("WANDB_API_KEY", "WANDB_BASE_URL"):
    os.environ.pop(_name, None)


@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shared")


@pytest.fixture(scope="session", autouse=True)
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache folder for every launch of the session ($GPT2S_CACHE for launches given no --cache_dir)."""
    cache = tmp_path_factory.mktemp("cache")
    os.environ["GPT2S_CACHE"] = str(cache)
    return cache


@pytest.fixture(scope="session")
def corpus(shared_dir: Path) -> Path:
    """A small All the News CSV: about 60 validation blocks at --val_fraction 0.3, 9 steps per epoch."""
    path = shared_dir / "news.csv"
    write_news_csv(path, articles=60, words=200)
    return path


@pytest.fixture(scope="session")
def base_args(corpus: Path, shared_cache: Path) -> list[str]:
    return shared_args(corpus, shared_cache)


class SharedRuns:
    """Run folders by strategy name; each registry entry launched once, on first use."""

    def __init__(self, root: Path, args: list[str]) -> None:
        self.root, self.args = root, args
        self.dirs: dict[str, Path] = {}
        self.consoles: dict[str, str] = {}  # what each launch printed, stdout then stderr

    def __getitem__(self, name: str) -> Path:
        if name not in self.dirs:
            entry = registry.get(name)
            out = self.root / name
            # A strategy for several machines runs as the SLURM recipe launches it, 2 "machines" on loopback.
            launch = train_on_machines if entry.multi_machine else train
            result = launch(entry.config_file, out, [*self.args, "--strategy", name, *SHARED_EXTRA.get(name, [])])
            self.dirs[name], self.consoles[name] = out, result.stdout + result.stderr
        return self.dirs[name]

    def console(self, name: str) -> str:
        """What the launch of `name` printed (launching it first if needed)."""
        self[name]
        return self.consoles[name]


@pytest.fixture(scope="session")
def shared_runs(shared_dir: Path, base_args: list[str]) -> SharedRuns:
    return SharedRuns(shared_dir / "runs", base_args)
