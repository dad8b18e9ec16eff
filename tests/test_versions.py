"""Outside the declared torch and accelerate ranges (requirements.txt, tested in docs/compat.md), train.py, the
experiment driver and the notebook stop at start-up with one `error:` line naming the release found, the range and
the install command, before any work."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from analysis import experiment
from notebooks import support
from tests.launch import REPO, run
from training import versions

RANGES = {r.name: r for r in versions.requirements() if r.name in versions.CHECKED}
# requirements.txt's torch line as written, which the error line and the docs repeat.
TORCH_LINE = next(
    line.split("#")[0].strip() for line in versions.REQUIREMENTS.read_text().splitlines() if line.startswith("torch")
)


def installed(monkeypatch: pytest.MonkeyPatch, **found: str | None) -> None:
    """Package metadata as an environment with these releases would report it."""
    real = versions.installed_version
    monkeypatch.setattr(versions, "installed_version", lambda name: found[name] if name in found else real(name))


def test_the_installed_releases_of_these_tests_are_in_range() -> None:
    assert versions.version_problem() is None


@pytest.mark.parametrize("torch", ["2.5.1", "1.13.1", "99.0.0", None])
def test_a_torch_outside_the_range_is_one_line_with_the_version_the_range_and_the_install(
    monkeypatch: pytest.MonkeyPatch, torch: str | None
) -> None:
    installed(monkeypatch, torch=torch)
    line = versions.version_problem()
    assert line is not None and "\n" not in line
    assert (f"torch {torch} is installed" if torch else "torch is not installed") in line
    assert f"runs on {TORCH_LINE} " in line and f"pip install '{TORCH_LINE}'" in line


def test_an_accelerate_outside_its_range_is_refused_too(monkeypatch: pytest.MonkeyPatch) -> None:
    installed(monkeypatch, accelerate="1.10.0")
    assert "accelerate 1.10.0 is installed" in versions.version_problem()


@pytest.mark.parametrize("build", ["+cu126", "+cpu", "a0+ecf3bae40a", ""])
def test_a_local_or_vendor_build_of_a_release_in_range_counts_as_that_release(
    monkeypatch: pytest.MonkeyPatch, build: str
) -> None:
    lowest = re.search(r">=([\d.]+)", str(RANGES["torch"].specifier)).group(1)
    installed(monkeypatch, torch=f"{lowest}.0{build}" if lowest.count(".") == 1 else f"{lowest}{build}")
    assert versions.version_problem() is None


def test_the_range_is_read_from_requirements_txt(tmp_path: Path) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("# the range\ntorch>=99  # none installed is this new\naccelerate>=0.1\n")
    assert "the project runs on torch>=99" in versions.version_problem(requirements)


def test_the_experiment_driver_stops_before_any_launch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    installed(monkeypatch, torch="2.5.1")
    launched = tmp_path / "launched"
    code = experiment.main(["--preset", "tiny", "--max_steps", "2", "--out", str(tmp_path / "out")], [str(launched)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == experiment.EXIT_SETUP and len(err) == 1 and err[0].startswith("error: torch 2.5.1 is installed")
    assert not (tmp_path / "out").exists()


def test_the_notebook_stops_with_the_line_and_installs_no_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    installed(monkeypatch, torch="2.5.1")
    monkeypatch.setattr(support, "_version", lambda name: "2.5.1" if name == "torch" else None)
    missing = support.missing_requirements()
    assert str(RANGES["torch"]) in missing
    with pytest.raises(support.OutsideRange) as refused:
        support.install(missing)
    (shown,) = refused.value._render_traceback_()  # what the notebook prints instead of a traceback
    assert shown.startswith("error: torch 2.5.1 is installed") and f"pip install '{TORCH_LINE}'" in shown
    assert shown.endswith(", then restart the kernel") and "\n" not in shown


@pytest.mark.parametrize("rank", ["0", "1"])
def test_train_py_under_a_too_old_torch_exits_2_with_one_line_before_any_step(tmp_path: Path, rank: str) -> None:
    """train.py itself, in an interpreter whose package metadata reports torch 2.5.1 and in which torch and
    accelerate cannot be imported at all (an old torch may crash on import): the line comes before either is
    imported, from the main process only (each process of a launch finds the same)."""
    wrapper = tmp_path / "old_torch_train.py"
    wrapper.write_text(
        "import importlib.metadata, os, runpy, sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "real = importlib.metadata.version\n"
        "importlib.metadata.version = lambda name: '2.5.1' if name == 'torch' else real(name)\n"
        "sys.modules['torch'] = sys.modules['accelerate'] = None  # importing either raises ImportError\n"
        f"os.environ['RANK'] = {rank!r}\n"
        "sys.argv = ['train.py', *sys.argv[1:]]\n"
        f"runpy.run_path({str(REPO / 'train.py')!r}, run_name='__main__')\n"
    )
    out = tmp_path / "run"
    result = run(
        [sys.executable, str(wrapper), "--preset", "tiny", "--max_steps", "2", "--output_dir", str(out)], False
    )
    assert result.returncode == 2, result.stderr[-2000:]
    told = [versions.refusal(RANGES["torch"], "2.5.1").join(["error: ", ""])] if rank == "0" else []
    assert result.stderr.strip().splitlines() == told
    assert result.stdout == "" and not out.exists()  # no step, no run folder


def test_a_requirements_file_that_cannot_be_read_is_one_line_too(tmp_path: Path) -> None:
    assert "cannot read the declared" in versions.version_problem(tmp_path / "missing.txt")
    broken = tmp_path / "requirements.txt"
    broken.write_text("-e .\ntorch>=2.10,<2.15\naccelerate>=1.16 ; python_version >\n")
    line = versions.version_problem(broken)
    assert line.startswith("cannot read the declared") and "\n" not in line


def test_a_version_that_is_no_pep_440_version_is_not_refused() -> None:
    assert versions.in_range("2.13.0-custom build", RANGES["torch"])
    assert not versions.in_range("2.15.0.dev20261201+cu130", RANGES["torch"])
    assert versions.in_range("2.14.1+cu130", RANGES["torch"])


@pytest.mark.parametrize("doc", ["README.md", "docs/compat.md"])
def test_the_docs_declare_requirements_txts_torch_range(doc: str) -> None:
    line = next(
        line.split("#")[0].strip()
        for line in versions.REQUIREMENTS.read_text().splitlines()
        if line.startswith("torch")
    )
    assert f"`{line}`" in (REPO / doc).read_text()
