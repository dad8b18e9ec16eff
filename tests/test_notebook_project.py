"""The notebook's first step, finding the project: where it looks, and the one line it stops with when
nothing holds the project. Cheap: the search runs before any install or training."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_notebook import NOTEBOOK, _clean_env

FIND_CELL = 4  # "Set-up": finds the project, then installs


def _finder() -> dict:
    """The set-up cell's functions, without running its search (everything before `ROOT = ...`)."""
    source = "".join(json.loads(NOTEBOOK.read_text())["cells"][FIND_CELL]["source"])
    assert "ROOT = find_project(project)" in source
    namespace: dict = {}
    exec(source.split("ROOT = find_project(project)")[0], namespace)  # noqa: S102 - the notebook's own code
    return namespace


def _fake_project(folder: Path) -> Path:
    (folder / "training" / "distributed").mkdir(parents=True)
    (folder / "train.py").write_text("")
    (folder / "training" / "distributed" / "registry.py").write_text("")
    return folder


def test_a_folder_or_the_folder_inside_it_is_found(tmp_path: Path) -> None:
    finder = _finder()
    project = _fake_project(tmp_path / "upload" / "gpt2-strategies")
    assert finder["find_project"](str(project)) == project.resolve()
    # A Kaggle dataset made from a zip holds the repository one folder down.
    assert finder["find_project"](str(tmp_path / "upload")) == project.resolve()


def test_the_current_folder_and_its_parents_are_searched(tmp_path: Path, monkeypatch) -> None:
    finder = _finder()
    project = _fake_project(tmp_path / "repo")
    (project / "notebooks").mkdir()
    monkeypatch.chdir(project / "notebooks")
    assert finder["find_project"]("") == project.resolve()


def test_a_folder_without_the_project_says_what_to_do_in_one_line(tmp_path: Path) -> None:
    finder = _finder()
    with pytest.raises(finder["ProjectNotFound"]) as caught:
        finder["find_project"](str(tmp_path))
    (line,) = caught.value._render_traceback_()
    assert line.startswith(f"project not found: {tmp_path} holds no train.py") and "set project" in line


def test_without_a_project_source_the_notebook_stops_with_one_line(tmp_path: Path) -> None:
    import papermill  # noqa: F401 - in requirements.txt

    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(NOTEBOOK, alone / NOTEBOOK.name)  # away from the project: nothing above it holds train.py
    executed = tmp_path / "executed.ipynb"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "papermill",
            str(alone / NOTEBOOK.name),
            str(executed),
            "-k",
            "gpt2s-test",
            "--cwd",
            str(alone),
            "--no-progress-bar",
        ],
        env=_clean_env(tmp_path, tmp_path / "cache"),  # stops before any use of it
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    cells = json.loads(executed.read_text())["cells"]
    failed = [
        i
        for i, c in enumerate(cells)
        if c["cell_type"] == "code" and any(o["output_type"] == "error" for o in c["outputs"])
    ]
    (at,) = failed
    (error,) = [o for o in cells[at]["outputs"] if o["output_type"] == "error"]
    (line,) = error["traceback"]  # no traceback: the one line
    assert line.startswith("project not found: not in this folder or above") and "set project" in line
    # It stopped there: nothing after the set-up cell ran.
    assert "ROOT = find_project(project)" in "".join(cells[at]["source"])
    later = [c for c in cells[at + 1 :] if c["cell_type"] == "code"]
    assert later and all(c["execution_count"] is None and not c["outputs"] for c in later)
