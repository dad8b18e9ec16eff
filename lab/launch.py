"""Launching train.py with accelerate as a user would, on a small synthetic corpus: what the lab's benchmarks
and the test suite both launch with."""

from __future__ import annotations

import csv
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "accelerate_configs"
# A hang guard, not a performance bound: the longest launch here takes well under a minute on 2 cores.
LAUNCH_TIMEOUT_S = 600
# No launch here needs the network: a hub lookup must fail at once, never wait (tests/conftest.py sets these
# for the test process too).
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


# Ports for launches come from below the kernel's ephemeral range (32768-60999 by default), so no socket the
# kernel numbers itself can take one between the check and the launch, and each pytest-xdist worker has a
# range of its own, so the two workers never hand out the same port. Within a worker, each port once.
_PORTS_PER_WORKER = 2000
_FIRST_PORT = 20000
_ports_given: set[int] = set()


def free_port() -> int:
    """A port no other test of this session has been given and nothing listens on now."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    first = _FIRST_PORT + _PORTS_PER_WORKER * (int(worker) if worker.isdigit() else 0)
    for port in range(first, first + _PORTS_PER_WORKER):
        if port in _ports_given:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # taken by another program of the machine
        _ports_given.add(port)
        return port
    raise RuntimeError(f"no free port in {first}-{first + _PORTS_PER_WORKER - 1}")


def launch_env() -> dict[str, str]:
    """The environment of a user without a W&B login: W&B at its default ("auto") logs offline.

    Whatever the machine running the tests is logged into is hidden, so no test uploads a run; tests
    that turn W&B off say so with --wandb_mode disabled, next to a twin that keeps the default. The test-only
    switches (fp16 on the CPU, injected faults) are dropped too: a test that wants one passes it in `env`, and
    one exported in the shell would otherwise reach every launch.
    """
    from training.distributed.faults import FAULT_VARIABLE
    from training.distributed.strategy import CPU_FP16_VARIABLE

    env = {**os.environ, **OFFLINE, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "NETRC": os.devnull}
    # The commands a user types (`python`, `accelerate`) are this interpreter's, as in an activated venv,
    # also when the tests were started by the venv's python without activating it.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    for name in ("RANK", "WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL", CPU_FP16_VARIABLE, FAULT_VARIABLE):
        env.pop(name, None)
    return env


def accelerate_command(
    config: Path, script: str, args: list[str], launch_args: list[str] = (), port: int | None = None
) -> list[str]:
    """`accelerate launch` of `script`, on `port` (machines of one job share it) or a free one."""
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(config),
        "--main_process_port",
        str(port or free_port()),
        *launch_args,
        script,
        *args,
    ]


def run(command: list[str], check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`command` in the launch environment, with `env` added."""
    result = subprocess.run(
        command, cwd=REPO, env={**launch_env(), **(env or {})}, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S
    )
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(command)} exited {result.returncode}:\n{result.stderr[-4000:]}")
    return result


_WORDS = (
    "council budget river station election market school hospital storm league court harbor "
    "senator village factory museum bridge festival report officials residents said on monday"
).split()


def write_news_csv(path: Path, articles: int, words: int) -> None:
    """A small corpus in the All the News CSV layout (the `content` column holds the text)."""
    rng = random.Random(5)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["", "id", "title", "publication", "author", "date", "year", "month", "url", "content"])
        for i in range(articles):
            body = " ".join(rng.choice(_WORDS) for _ in range(words))
            writer.writerow(
                [
                    i,
                    17000 + i,
                    f"Story {i}",
                    "Test Gazette",
                    "A. Writer",
                    "2016-05-01",
                    2016,
                    5,
                    f"https://example.org/{i}",
                    body,
                ]
            )
