"""What the launch-based tests share over a session: one corpus, one cache, and one run per strategy.

The data cache is keyed by content and the measured CPU peak FLOP/s lives in the same cache folder, so
with one folder for the session the corpus is tokenized once and the peak measured once. `shared_runs`
launches each registry entry at most once, when a test first asks for it (one for several machines as the
SLURM recipe does, its launch line once per "machine" on loopback); the strategy, FSDP-mode,
registry, planner and resume tests all read the same run folders; the jobs over several machines are
compared with `single_24`, a one-process run of their global batch.

The README's test line runs the suite in two pytest-xdist workers, one per core of a 2-core machine: a
single-process launch or an in-process test leaves the other core idle otherwise. The files go out to the
workers heaviest first (tests/schedule.py), so that both end together. The workers share these
folders (under one lock each), so each run is still launched once per session, whichever worker asks first.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from filelock import FileLock

from tests.launch import (
    BF16_EXTRA,
    FP16_ENV,
    FP16_EXTRA,
    FP16_HSDP_LAYOUT,
    FP16_STRATEGY_EXTRA,
    MACHINES,
    OFFLINE,
    PROCESSES_PER_MACHINE,
    fp16_overflow_step,
    run,
    shared_args,
    shared_flags,
    train,
    train_on_machines,
    write_news_csv,
)
from tests.schedule import file_seconds, heaviest_first
from training.distributed import registry

# The test process and every process it starts: offline for the hub, and no W&B login from the machine.
os.environ.update(OFFLINE)
os.environ["NETRC"] = os.devnull
for _name in ("WANDB_API_KEY", "WANDB_BASE_URL"):
    os.environ.pop(_name, None)
# glibc hands every freed block of 32 MiB or more back to the kernel, and the next such block faults its
# pages in again: with the 50,257-token logits of every micro-step that is about a third of a tiny launch's
# CPU time (measured: a 12-step single run 17.1 CPU-s, 12.7 with the heap kept). Keeping those blocks in the
# heap changes no figure a test checks (memory is counted per tensor, not from the process's pages).
os.environ.setdefault("MALLOC_MMAP_MAX_", "0")
os.environ.setdefault("MALLOC_TRIM_THRESHOLD_", str(2**32))


def pytest_configure(config: pytest.Config) -> None:
    # xdist's loadfile reorders files by their number of tests; tests/schedule.py orders them by seconds.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The heaviest files first (tests/schedule.py), so that the two workers end together."""
    root = config.rootpath
    paths = [item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else "" for item in items]
    items[:] = [items[i] for i in heaviest_first(paths, file_seconds())]


def _session_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder every worker of this session shares: under pytest-xdist each worker's basetemp is a
    folder of the session's own; without it the basetemp is the session's."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = _session_root(tmp_path_factory) / "shared"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session", autouse=True)
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache folder for every launch of the session ($GPT2S_CACHE for launches given no --cache_dir).

    Workers may fill it at once: data entries are published by an atomic rename and the peak by
    write_atomic, so a reader sees a whole entry or none."""
    cache = _session_root(tmp_path_factory) / "cache"
    cache.mkdir(exist_ok=True)
    os.environ["GPT2S_CACHE"] = str(cache)
    return cache


@pytest.fixture(scope="session")
def corpus(shared_dir: Path, machine_profile: Path) -> Path:
    """A small All the News CSV: about 60 validation blocks at --val_fraction 0.3, 9 steps per epoch. Every launch
    on it comes after the session's machine profile: none computes beside the measurement, or reads no peak."""
    path = shared_dir / "news.csv"
    with FileLock(shared_dir / "news.csv.lock"):
        if not path.exists():
            write_news_csv(path, articles=60, words=200)
    return path


@pytest.fixture(scope="session")
def machine_profile(shared_cache: Path) -> Path:
    """This machine's profile, as `python -m planner measure` writes it at its defaults, measured once per session
    into the session's cache: the CPU peak every launch divides its MFU by, and what `planner --run` predicts
    from. Measured before the first launch, so no launch computes beside it."""
    done = shared_cache / "machine_profile.path"
    with FileLock(shared_cache / "machine_profile.lock"):
        if not done.exists():
            result = run([sys.executable, "-m", "planner", "measure", "--cache_dir", str(shared_cache)])
            done.write_text(result.stdout.strip().splitlines()[-1].removeprefix("machine profile: "), encoding="utf-8")
    return Path(done.read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def base_args(corpus: Path, shared_cache: Path) -> list[str]:
    return shared_args(corpus, shared_cache)


class SharedRuns:
    """Run folders by strategy name (or a SHARED_VARIANTS name); each launched once per session, on first use.

    What a launch printed is kept beside its folder (not in it: the run's own files are checked), and its
    presence says the launch finished, so another worker reads the run instead of launching it again."""

    def __init__(self, root: Path, args: list[str]) -> None:
        self.root, self.args = root, args
        root.mkdir(exist_ok=True)

    def __getitem__(self, name: str) -> Path:
        strategy, extra = shared_flags(name)
        return self.launch(name, strategy, extra)

    def launch(
        self,
        key: str,
        name: str,
        extra: list[str],
        launch_args: list[str] = (),
        env: dict[str, str] | None = None,
        layout: tuple[int, int] = (MACHINES, PROCESSES_PER_MACHINE),
    ) -> Path:
        """The run `key`: registry entry `name` with `extra` flags (and accelerate's `launch_args`, and `env` added
        to the environment), once. A strategy for several machines runs as the SLURM recipe launches it, `layout`
        "machines" x processes on loopback."""
        out, printed = self.root / key, self.root / f"{key}.console"
        with FileLock(self.root / f"{key}.lock"):
            if not printed.exists():
                entry = registry.get(name)
                args = [*self.args, "--strategy", name, *extra]
                if entry.multi_machine:
                    result = train_on_machines(entry.config_file, out, args, *layout, env=env)
                else:
                    result = train(entry.config_file, out, args, launch_args=launch_args, env=env)
                printed.write_text(result.stdout + result.stderr)
        return out

    def console(self, name: str) -> str:
        """What the launch of `name` printed, stdout then stderr (launching it first if needed)."""
        self[name]
        return (self.root / f"{name}.console").read_text()


@pytest.fixture(scope="session")
def shared_runs(shared_dir: Path, base_args: list[str]) -> SharedRuns:
    return SharedRuns(shared_dir / "runs", base_args)


BF16_STRATEGIES = ("single", "fsdp")


@pytest.fixture(scope="session")
def bf16_runs(shared_runs: SharedRuns) -> dict[str, Path]:
    """single and FSDP in bf16 (tests/launch.py BF16_EXTRA), each launched once per session on first use."""
    return {
        name: shared_runs.launch(f"{name}-bf16", name, BF16_EXTRA, ["--mixed_precision", "bf16"])
        for name in BF16_STRATEGIES
    }


FP16_STRATEGIES = ("single", "ddp", "fsdp", "fsdp_zero2", "fsdp_offload", "hsdp")


class Fp16Runs:
    """The shared fp16 runs by strategy (tests/launch.py FP16_*), each launched once per session on first use, as
    SharedRuns' own: a file that needs two of them launches those two."""

    def __init__(self, shared_runs: SharedRuns) -> None:
        self.shared_runs = shared_runs

    def __getitem__(self, name: str) -> Path:
        return self.shared_runs.launch(
            f"{name}-fp16",
            name,
            [*FP16_EXTRA, *FP16_STRATEGY_EXTRA.get(name, [])],
            env={**FP16_ENV, "GPT2S_FAULT": f"inf_grad:step={fp16_overflow_step(name)}"},
            layout=FP16_HSDP_LAYOUT,
        )

    def items(self) -> Iterator[tuple[str, Path]]:
        return ((name, self[name]) for name in FP16_STRATEGIES)


@pytest.fixture(scope="session")
def fp16_runs(shared_runs: SharedRuns) -> Fp16Runs:
    """Every strategy on the GPU's fp16 path on the CPU, with an overflow (tests/launch.py FP16_*), each launched
    once per session on first use."""
    return Fp16Runs(shared_runs)
