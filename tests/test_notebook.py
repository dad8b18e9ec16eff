"""notebooks/compare_strategies.ipynb: saved clean, and run top to bottom on CPU with papermill.

The run takes the notebook's CPU path (tiny preset, every strategy, DDP and FSDP over gloo) with W&B at
its default, which goes offline here: the environment is cleared of W&B credentials first.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.launch import REPO

NOTEBOOK = REPO / "notebooks" / "compare_strategies.ipynb"
# A bound, not a measurement: a hung kernel or launch fails the test instead of stalling CI. The CPU run
# takes a few minutes; 20 minutes leaves room for a loaded machine.
RUN_TIMEOUT_S = 1200

# What a committed notebook must not carry: a W&B key is 40 hex digits; the rest are the usual shapes of
# tokens and of a key written into code.
SECRET_PATTERNS = {
    "40+ hex digits (a W&B API key)": re.compile(r"(?<![0-9a-fA-F])[0-9a-fA-F]{40,}(?![0-9a-fA-F])"),
    "a key assigned to WANDB_API_KEY": re.compile(r"WANDB_API_KEY\W{0,6}[=:]\s*\\?['\"]?[A-Za-z0-9_-]{8,}"),
    "wandb login with a key": re.compile(r"wandb\s+login\s+(--\S+\s+)*[0-9a-fA-F]{16,}"),
    "a Hugging Face token": re.compile(r"\bhf_[A-Za-z0-9]{20,}"),
    "a GitHub token": re.compile(r"\b(ghp|gho|ghs|github_pat)_[A-Za-z0-9_]{20,}"),
    "a Kaggle key": re.compile(r"['\"]key['\"]\s*:\s*['\"][0-9a-f]{32}['\"]"),
}


def test_saved_notebook_has_no_outputs_and_no_secrets() -> None:
    text = NOTEBOOK.read_text(encoding="utf-8")
    notebook = json.loads(text)
    code = [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]
    assert code
    for cell in code:
        assert cell["outputs"] == [], cell["id"]
        assert cell["execution_count"] is None, cell["id"]
    assert "papermill" not in notebook["metadata"] and "widgets" not in notebook["metadata"]
    assert all(
        "papermill" not in cell["metadata"] and "execution" not in cell["metadata"] for cell in notebook["cells"]
    )
    for what, pattern in SECRET_PATTERNS.items():
        assert not pattern.search(text), f"the notebook holds {what}"

    (parameters,) = [cell for cell in code if "parameters" in cell["metadata"].get("tags", [])]
    names = {m.group(1) for m in re.finditer(r"^(\w+)\s*=", "".join(parameters["source"]), re.MULTILINE)}
    assert {"preset", "max_steps", "data"} <= names


def test_secret_patterns_find_what_they_are_for() -> None:
    key = "0123456789abcdef" * 2 + "01234567"
    for leak in (
        f"key {key}",
        f'os.environ["WANDB_API_KEY"] = "{key[:12]}"',
        f"WANDB_API_KEY={key[:12]}",
        f"!wandb login {key}",
    ):
        assert any(p.search(leak) for p in SECRET_PATTERNS.values()), leak
    assert not any(
        p.search("a secret named `WANDB_API_KEY`; os.environ[SECRET_NAME] = key.strip()")
        for p in SECRET_PATTERNS.values()
    )


def _clean_env(tmp: Path, cache: Path) -> dict[str, str]:
    """No W&B credentials (so the default mode is offline), no GPU (the CPU path), a kernel of this Python;
    the session's cache (tests/conftest.py), where the sample is tokenized and the CPU peak measured once."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    kernels = tmp / "jupyter" / "kernels" / "gpt2s-test"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "gpt2-strategies test",
                "language": "python",
            }
        )
    )
    env.update(
        {
            "NETRC": str(tmp / "no-netrc"),  # a developer's `wandb login` must not be used
            "CUDA_VISIBLE_DEVICES": "",
            "JUPYTER_PATH": os.pathsep.join(filter(None, [str(tmp / "jupyter"), env.get("JUPYTER_PATH")])),
            "GPT2S_CACHE": str(cache),
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    return env


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path) -> tuple[dict, Path]:
    """The notebook run once, as `-p preset tiny -p max_steps 4`: (the executed notebook, its out_dir)."""
    import papermill  # noqa: F401 - in requirements.txt: a missing or broken install fails, never skips

    tmp = tmp_path_factory.mktemp("notebook")
    executed_path, out_dir = tmp / "executed.ipynb", tmp / "out"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "papermill",
            str(NOTEBOOK),
            str(executed_path),
            "-p",
            "preset",
            "tiny",
            "-p",
            "max_steps",
            "4",
            "-p",
            "out_dir",
            str(out_dir),
            "-k",
            "gpt2s-test",
            "--cwd",
            str(NOTEBOOK.parent),
            "--no-progress-bar",
        ],
        env=_clean_env(tmp, shared_cache),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    if result.returncode != 0:
        tail = _outputs_text(json.loads(executed_path.read_text())) if executed_path.exists() else ""
        pytest.fail(f"papermill exited {result.returncode}:\n{result.stderr[-3000:]}\n{tail[-4000:]}")
    return json.loads(executed_path.read_text(encoding="utf-8")), out_dir


def test_papermill_is_installed() -> None:
    # requirements.txt lists papermill; without it the notebook test cannot run, which is a failure.
    import papermill

    assert papermill.__version__


def _outputs(notebook: dict) -> list[dict]:
    return [output for cell in notebook["cells"] if cell["cell_type"] == "code" for output in cell["outputs"]]


def _outputs_text(notebook: dict) -> str:
    parts = []
    for output in _outputs(notebook):
        parts.append("".join(output.get("text", "")))
        data = output.get("data", {})
        parts.append("".join(data.get("text/markdown", "")) + "".join(data.get("text/plain", "")))
    return "\n".join(parts)


@pytest.mark.multiprocess
def test_notebook_runs_every_strategy_on_cpu_and_shows_the_comparison(executed: tuple[dict, Path]) -> None:
    notebook, out_dir = executed
    markdown = [
        ("".join(o["data"]["text/markdown"])) for o in _outputs(notebook) if "text/markdown" in o.get("data", {})
    ]
    (table,) = [text for text in markdown if text.startswith("| run | strategy |")]
    rows = [line.split("|")[2].strip() for line in table.splitlines()[2:]]
    assert rows == ["single", "ddp", "fsdp"]
    assert any("Loss curves agree within noise" in text for text in markdown)  # the report's reading
    images = [o for o in _outputs(notebook) if "image/png" in o.get("data", {})]
    assert images and all(len(o["data"]["image/png"]) > 10_000 for o in images)

    text = _outputs_text(notebook)
    assert "all-reduce over 2 processes: ok" in text
    assert "using the bundled sample" in text
    # W&B at its default without credentials: offline runs, and the command to upload them later.
    assert "W&B: offline" in text and "wandb sync " in text
    (experiment,) = out_dir.iterdir()
    for strategy in ("single", "ddp", "fsdp"):
        assert list((experiment / "runs" / strategy / "wandb").glob("offline-run-*")), strategy
