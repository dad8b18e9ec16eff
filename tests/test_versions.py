"""Below the declared torch and accelerate bounds (requirements.txt; docs/compat.md says what breaks there), train.py,
the experiment driver and the notebook stop at start-up with one `error:` line naming the release found, the bound
and the command that installs a tested release of the installed torch's build, before any work. Above the newest
tested (training/versions.py's NEWEST_TESTED) the run goes on after one `warning:` line, and pip, given
requirements.txt, leaves the newer torch and accelerate as they are.

The releases are faked by package metadata, as an environment with them would report it: dist-info folders (and
torch's torch/version.py) first on the path, while the installed packages are what imports."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
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


def fake_packages(root: Path, cuda: str | None = None, hip: str | None = None, **releases: str) -> Path:
    """A folder that, first on the path, makes package metadata report these releases: a dist-info folder each
    and, for torch, the torch/version.py of a build for `cuda` (or ROCm's `hip`; neither: the CPU build)."""
    for name, version in releases.items():
        info = root / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if "torch" in releases:
        (root / "torch").mkdir()
        (root / "torch" / "version.py").write_text(
            f"from typing import Optional\n__version__ = {releases['torch']!r}\n"
            f"cuda: Optional[str] = {cuda!r}\nhip: Optional[str] = {hip!r}\nxpu: Optional[str] = None\n"
        )
    return root


def command_bounds(command: str) -> object:
    """The requirement a refusal's pip command installs (`pip install 'torch>=2.10,<2.15' ...`)."""
    return versions.parse(re.search(r"pip install '([^']+)'", command).group(1))


def wrapped_train(tmp_path: Path, packages: Path, env: dict[str, str], importable: bool) -> Path:
    """train.py run in an interpreter whose path starts with `packages` (their metadata is what it finds), with
    these launch variables; unless `importable`, torch and accelerate cannot be imported at all (an old torch may
    crash on import), so any line it prints came before either was."""
    wrapper = tmp_path / "train_beside_packages.py"
    wrapper.write_text(
        "import os, runpy, sys\n"
        f"sys.path[:0] = [{str(packages)!r}, {str(REPO)!r}]\n"
        + ("" if importable else "sys.modules['torch'] = sys.modules['accelerate'] = None  # import raises\n")
        + f"os.environ.update({env!r})\n"
        "sys.argv = ['train.py', *sys.argv[1:]]\n"
        f"runpy.run_path({str(REPO / 'train.py')!r}, run_name='__main__')\n"
    )
    return wrapper


def test_the_installed_releases_of_these_tests_are_in_range() -> None:
    assert versions.version_problem() is None


def test_requirements_txt_bounds_torch_and_accelerate_from_below_only() -> None:
    for name in versions.CHECKED:
        assert {spec.operator for spec in RANGES[name].specifier} == {">="}, RANGES[name]


@pytest.mark.parametrize("torch", ["2.5.1", "1.13.1", "2.9.1", None])
def test_a_torch_below_the_range_is_one_line_with_the_version_the_range_and_the_install(
    monkeypatch: pytest.MonkeyPatch, torch: str | None
) -> None:
    installed(monkeypatch, torch=torch)
    line = versions.version_problem()
    assert line is not None and "\n" not in line
    assert (f"torch {torch} is installed" if torch else "torch is not installed") in line
    assert f"runs on {TORCH_LINE} " in line
    # A tested release: from the declared minimum up to the newest tested series, nothing below or newer.
    wanted, newest = command_bounds(line).specifier, versions.NEWEST_TESTED["torch"]
    minimum = next(iter(RANGES["torch"].specifier)).version
    assert wanted.contains(minimum) and wanted.contains(f"{newest}.9") and not wanted.contains("2.9.1")
    assert not wanted.contains(f"{next_series(newest)}.0")


def next_series(series: str) -> str:
    major, minor = series.split(".")
    return f"{major}.{int(minor) + 1}"


@pytest.mark.parametrize(
    ("torch", "accelerate"),
    [("2.15.0", "1.17.0"), ("2.15.0.dev20261201+cu130", None), ("3.0.0", None), (None, "2.0.0")],
)
def test_a_release_newer_than_the_newest_tested_is_not_refused_but_named_in_one_warning(
    monkeypatch: pytest.MonkeyPatch, torch: str | None, accelerate: str | None
) -> None:
    installed(monkeypatch, **{k: v for k, v in {"torch": torch, "accelerate": accelerate}.items() if v})
    assert versions.version_problem() is None
    note = versions.untested_releases()
    assert note is not None and "\n" not in note and note.endswith("the run goes on")
    for name, found in (("torch", torch), ("accelerate", accelerate)):
        named = f"{name} {found} (newest tested: {versions.NEWEST_TESTED[name]})"
        assert (named in note) == bool(found), note


def test_the_newest_tested_series_itself_and_the_installed_releases_draw_no_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert versions.untested_releases() is None  # these tests' own torch and accelerate
    installed(monkeypatch, torch=f"{versions.NEWEST_TESTED['torch']}.9+cu130", accelerate="1.16.7")
    assert versions.untested_releases() is None


@pytest.mark.parametrize(
    ("cuda", "hip", "index"),
    [("12.8", None, "cu128"), ("13.0", None, "cu130"), ("11.8", None, "cu118"), (None, "6.2.41133-dd7f9", "rocm6.2")],
)
def test_the_install_command_is_for_the_build_of_the_installed_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cuda: str | None, hip: str | None, index: str
) -> None:
    """A CUDA torch gets the build for its CUDA version (never a CPU wheel, nor PyPI's default, which is built for
    another CUDA version and so another driver), ROCm's its ROCm; read from torch/version.py, not imported."""
    monkeypatch.syspath_prepend(str(fake_packages(tmp_path, cuda=cuda, hip=hip, torch="2.9.0")))
    line = versions.version_problem()
    assert line.startswith("torch 2.9.0 is installed")
    assert line.endswith(f" --index-url https://download.pytorch.org/whl/{index}")


def test_a_cpu_torch_gets_the_cpu_build_and_a_missing_torch_the_platforms_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(fake_packages(tmp_path, torch="2.9.0+cpu")))
    assert versions.version_problem().endswith(" --index-url https://download.pytorch.org/whl/cpu")
    installed(monkeypatch, torch=None)
    monkeypatch.setattr(versions, "torch_build", lambda: None)  # no torch: no build to match
    line = versions.version_problem()
    assert line.startswith("torch is not installed") and "--index-url" not in line


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
    monkeypatch.setattr(versions, "torch_build", lambda: "cu124")  # Kaggle's image of 2025
    missing = support.missing_requirements()
    assert str(RANGES["torch"]) in missing
    with pytest.raises(support.OutsideRange) as refused:
        support.install(missing)
    (shown,) = refused.value._render_traceback_()  # what the notebook prints instead of a traceback
    assert shown.startswith("error: torch 2.5.1 is installed") and f"pip install '{TORCH_LINE}," in shown
    assert "--index-url https://download.pytorch.org/whl/cu124, then restart the kernel" in shown
    assert shown.endswith(", then restart the kernel") and "\n" not in shown


def test_the_notebook_keeps_a_newer_torch_and_says_so_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    assert support.release_note() is None
    installed(monkeypatch, torch="2.15.0")
    monkeypatch.setattr(
        support, "_version", lambda name: "2.15.0" if name == "torch" else versions.installed_version(name)
    )
    assert "torch>=" not in " ".join(support.missing_requirements())  # nothing to install: it stays
    assert support.release_note() == f"warning: {versions.untested_releases()}"
    assert "torch 2.15.0 (newest tested" in support.release_note()


# Rank 0's process; another process on rank 0's machine; the first process of the second machine.
LAUNCHES = {
    "rank 0": ({"RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0"}, ""),
    "rank 1 beside it": ({"RANK": "1", "LOCAL_RANK": "1", "GROUP_RANK": "0"}, None),
    "machine 1": ({"RANK": "2", "LOCAL_RANK": "0", "GROUP_RANK": "1"}, f"machine 1 ({socket.gethostname()}), rank 2: "),
}


@pytest.mark.parametrize("launch", LAUNCHES)
def test_train_py_under_torch_2_9_exits_2_with_one_line_installing_its_cuda_build(tmp_path: Path, launch: str) -> None:
    """train.py itself, where package metadata reports torch 2.9.0 built for CUDA 12.8 and torch and accelerate
    cannot be imported: exit 2 before either is imported, no step and no run folder, and one line, whose command
    installs the CUDA 12.8 build, from rank 0 and from the first process of every other machine, which names
    itself (each process of a launch finds the same)."""
    env, prefix = LAUNCHES[launch]
    packages = fake_packages(tmp_path / "packages", cuda="12.8", torch="2.9.0")
    out = tmp_path / "run"
    wrapper = wrapped_train(tmp_path, packages, env, importable=False)
    result = run(
        [sys.executable, str(wrapper), "--preset", "tiny", "--max_steps", "2", "--output_dir", str(out)], False
    )
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    if prefix is None:
        assert lines == []
    else:
        (line,) = lines
        assert line.startswith(f"error: {prefix}torch 2.9.0 is installed; the project runs on {TORCH_LINE} ")
        assert line.endswith(" --index-url https://download.pytorch.org/whl/cu128")
        assert not command_bounds(line).specifier.contains("2.9.0")
    assert result.stdout == "" and not out.exists()


def test_pip_leaves_a_newer_torch_and_accelerate_as_they_are(tmp_path: Path) -> None:
    """pip's dry run of requirements.txt, where package metadata says torch 2.15.0 and accelerate 1.17.0 (beside
    this environment's other packages), would install nothing; with an upper bound it would replace that torch.
    No index: pip answers from what is installed, its configuration and the machine's constraints left out."""
    packages = fake_packages(tmp_path / "packages", torch="2.15.0", accelerate="1.17.0")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PYTHONPATH=str(packages), PIP_CONFIG_FILE=os.devnull)

    def dry_run(requirements: Path) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "-q", "--report", "-"]
        return subprocess.run([*command, "-r", str(requirements)], env=env, capture_output=True, text=True, timeout=300)

    kept = dry_run(versions.REQUIREMENTS)
    assert kept.returncode == 0, kept.stderr[-2000:]
    report = json.loads(kept.stdout)
    assert report["install"] == [], [item["metadata"]["name"] for item in report["install"]]
    capped = tmp_path / "requirements.txt"
    capped.write_text(versions.REQUIREMENTS.read_text().replace(f"{TORCH_LINE}\n", f"{TORCH_LINE},<2.15\n"))
    replaced = dry_run(capped)  # finds no other torch to put in its place (no index), or would install one
    assert replaced.returncode != 0 or json.loads(replaced.stdout)["install"], replaced.stdout[-2000:]


def test_a_tiny_run_under_a_newer_torch_and_accelerate_warns_once_and_resumes(tmp_path: Path) -> None:
    """python train.py where package metadata says torch 2.15.0 and accelerate 1.17.0: one warning line, naming
    both, then the run as usual: stopped after its step-2 checkpoint, exit 0; resumed from it, exit 0, done."""
    packages = fake_packages(tmp_path / "packages", torch="2.15.0", accelerate="1.17.0")
    wrapper = wrapped_train(tmp_path, packages, {}, importable=True)
    out = tmp_path / "run"
    args = ["--preset", "tiny", "--max_steps", "4", "--checkpoint_interval", "2", "--wandb_mode", "disabled"]
    args += ["--no-export_hf", "--global_batch_tokens", "256", "--micro_batch_size", "4", "--output_dir", str(out)]
    for then in (["--stop_after_steps", "2"], ["--resume"]):
        result = run([sys.executable, str(wrapper), *args, *then], False)
        assert result.returncode == 0, result.stderr[-3000:]
        warned = [line for line in result.stderr.splitlines() if line.startswith("warning:") or "untested" in line]
        assert warned == [f"warning: {untested_line()}"], result.stderr[-3000:]
    assert f"resumed from {out / 'checkpoints' / 'step_0000002'} at step 2" in result.stdout
    assert "done: 4 of 4 steps" in result.stdout


def untested_line() -> str:
    return (
        f"untested releases: torch 2.15.0 (newest tested: {versions.NEWEST_TESTED['torch']}), accelerate 1.17.0 "
        f"(newest tested: {versions.NEWEST_TESTED['accelerate']}); docs/compat.md lists what was tested; "
        "the run goes on"
    )


def test_told_by_gives_rank_0_the_line_and_every_other_machine_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    for env, prefix in LAUNCHES.values():
        expected = None if prefix is None else f"warning: {prefix}m"
        assert versions.told_by("warning", "m", env, socket.gethostname()) == expected
    assert versions.told_by("error", "m", {}, "h") == "error: m"  # python train.py: no launch variables


def test_a_requirements_file_that_cannot_be_read_is_one_line_too(tmp_path: Path) -> None:
    assert "cannot read the declared" in versions.version_problem(tmp_path / "missing.txt")
    broken = tmp_path / "requirements.txt"
    broken.write_text("-e .\ntorch>=2.10,<2.15\naccelerate>=1.16 ; python_version >\n")
    line = versions.version_problem(broken)
    assert line.startswith("cannot read the declared") and "\n" not in line


def test_a_version_that_is_no_pep_440_version_is_not_refused() -> None:
    assert versions.in_range("2.13.0-custom build", RANGES["torch"])
    assert not versions.in_range("2.9.0.dev20250801+cu128", RANGES["torch"])
    assert versions.in_range("2.14.1+cu130", RANGES["torch"])


@pytest.mark.parametrize("doc", ["README.md", "docs/compat.md"])
def test_the_docs_declare_requirements_txts_torch_range(doc: str) -> None:
    line = next(
        line.split("#")[0].strip()
        for line in versions.REQUIREMENTS.read_text().splitlines()
        if line.startswith("torch")
    )
    assert f"`{line}`" in (REPO / doc).read_text()
