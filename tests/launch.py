"""Launching train.py (or a probe script) with accelerate, as a user would, for the multi-process tests."""

from __future__ import annotations

import csv
import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "accelerate_configs"
LAUNCH_TIMEOUT_S = 600


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_env() -> dict[str, str]:
    """The environment of a user without a W&B login: W&B at its default ("auto") logs offline.

    Whatever the machine running the tests is logged into is hidden, so no test uploads a run; tests
    that turn W&B off say so with --wandb_mode disabled, next to a twin that keeps the default.
    """
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "NETRC": os.devnull}
    for name in ("RANK", "WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        env.pop(name, None)
    return env


def accelerate_command(config: Path, script: str, args: list[str], launch_args: list[str] = ()) -> list[str]:
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
            "--main_process_port", str(free_port()), *launch_args, script, *args]


def run(command: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, cwd=REPO, env=launch_env(), capture_output=True, text=True,
                            timeout=LAUNCH_TIMEOUT_S)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(command)} exited {result.returncode}:\n{result.stderr[-4000:]}")
    return result


def train(config_name: str, output_dir: Path, args: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    command = accelerate_command(CONFIGS / config_name, "train.py", [*args, "--output_dir", str(output_dir)])
    return run(command, check=check)


def train_lines(output_dir: Path) -> dict[int, dict[str, Any]]:
    lines = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {line["step"]: line for line in lines if line["kind"] == "train"}


def summary(output_dir: Path) -> dict[str, Any]:
    return json.loads((output_dir / "summary.json").read_text())


_WORDS = ("council budget river station election market school hospital storm league court harbor "
          "senator village factory museum bridge festival report officials residents said on monday").split()


def write_news_csv(path: Path, articles: int, words: int) -> None:
    """A small corpus in the All the News CSV layout (the `content` column holds the text)."""
    rng = random.Random(5)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["", "id", "title", "publication", "author", "date", "year", "month", "url", "content"])
        for i in range(articles):
            body = " ".join(rng.choice(_WORDS) for _ in range(words))
            writer.writerow([i, 17000 + i, f"Story {i}", "Test Gazette", "A. Writer", "2016-05-01", 2016, 5,
                             f"https://example.org/{i}", body])


def plan_errors(output_dir: Path) -> list[dict[str, float]]:
    """Per rank: the planner's error in percent on each figure the run measured (analysis.plan --run)."""
    from analysis.plan import compare_run

    entry = compare_run(output_dir)
    assert len(entry["ranks"]) == summary(output_dir)["world_size"]
    return [rank["error_pct"] for rank in entry["ranks"]]
