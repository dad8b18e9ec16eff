"""lab/data_scale.py end to end on a corpus of a few dozen articles: the table it prints is the one
lab/results/data_scale.md quotes, so every row must be there, and its figures must agree with the prepare they measure."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.launch import REPO, launch_env


def _table(output: str) -> dict[str, str]:
    return dict(re.findall(r"^\| (.+?) \| (.+?) \|$", output, flags=re.M))


def test_the_data_scale_benchmark_prints_its_whole_table(tmp_path: Path) -> None:
    argv = ["--articles", "40", "--dir", str(tmp_path), "--num_proc", "1", "--bare_articles", "5"]
    result = subprocess.run(
        [sys.executable, "-m", "lab.data_scale", *argv, "--bare_seconds", "0.2"],
        cwd=REPO,
        env=launch_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    table = _table(result.stdout)
    assert table["articles"] == "40"
    assert table["corpus"].endswith("in 3 CSVs") and len(list(tmp_path.glob("articles*.csv"))) == 3
    # The token count is the prepared cache's own, train and validation together, at both block sizes.
    packed = [json.loads(p.read_text()) for p in (tmp_path / "cache" / "packed").glob("*/meta.json")]
    assert sorted(m["block_size"] for m in packed) == [128, 1024]
    counted = int(table["tokens"].replace(",", ""))
    assert all(sum(split["tokens"] for split in m["splits"].values()) == counted for m in packed), packed
    assert all(m["documents_read"] == 40 for m in packed)
    for row in ("prepare: tokens/s (wall)", "bare tiktoken, 1 process: tokens per CPU second"):
        assert float(table[row].replace(",", "")) > 0, row
    assert table["prepare / bare tiktoken, per CPU second"].endswith("%")
    assert result.stderr.count("Traceback") == 0
