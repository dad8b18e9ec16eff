"""Which (Python, torch) pairs the project runs on: a fresh virtual environment per pair, the project's
requirements installed beside that torch, the core tests run in it, one line per pair.

Run by hand before a change that touches torch APIs (it downloads a torch per pair; CI does not run it),
and put its lines in docs/compat.md:

    python lab/compat_check.py                          # the pairs of docs/compat.md's table
    python lab/compat_check.py --pair 3.12:2.14.1       # one pair
    python lab/compat_check.py --install-only           # the downloads alone (network and disk)
    python lab/compat_check.py --test-only              # the tests alone, in the environments made before

Python X.Y is the `pythonX.Y` on PATH or a pyenv installation of it. torch comes from --torch-index:
the package index by default: the CUDA builds Kaggle and Colab install (several GB a version with their
nvidia-* packages; the tests run them on the CPU), or PyTorch's CPU index (about 200 MB a version) where
it can be reached.
pip's cache stays on, so a second run fetches nothing again. Exit status: 0 when every pair passed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The core tests: the model, one step, checkpoints, every strategy, resume and the checks a run does at start.
CORE_TESTS = (
    "tests/test_model.py",
    "tests/test_train_step.py",
    "tests/test_checkpoint.py",
    "tests/test_strategies.py",
    "tests/test_fsdp_modes.py",
    "tests/test_resume_anywhere.py",
    "tests/test_speed_levers.py",
    "tests/test_hardware.py",
    "tests/test_strategy_guard.py",
    "tests/test_export_check.py",
    "tests/test_train_run.py",
    "tests/test_versions.py",
)
# docs/compat.md's table: every release series from the declared minimum to the newest tested (training/versions.py's
# NEWEST_TESTED, which the newest pair here must be), CI's 2.13 among them, and Colab's Python.
DEFAULT_PAIRS = ("3.11:2.10.0", "3.11:2.11.0", "3.11:2.12.0", "3.11:2.13.0", "3.11:2.14.1", "3.12:2.14.1")
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


@dataclass(frozen=True)
class Pair:
    python: str  # "3.11"
    torch: str  # "2.13.0"

    @classmethod
    def parse(cls, text: str) -> Pair:
        python, sep, torch = text.partition(":")
        if not sep or not re.fullmatch(r"3\.\d+", python) or not re.fullmatch(r"\d+\.\d+(\.\d+)?", torch):
            raise ValueError(f"--pair {text!r}: expected PYTHON:TORCH, such as 3.11:2.13.0")
        return cls(python, torch)

    @property
    def name(self) -> str:
        return f"py{self.python}-torch{self.torch}"


def find_python(version: str) -> Path | None:
    """`pythonX.Y` on PATH when it runs (a pyenv shim of a version not selected does not), else pyenv's copy."""
    exe = shutil.which(f"python{version}")
    if exe and subprocess.run([exe, "--version"], capture_output=True).returncode == 0:
        return Path(exe)
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    for candidate in sorted(pyenv_root.glob(f"versions/{version}.*/bin/python{version}"), reverse=True):
        return candidate
    return None


def run_logged(cmd: list[str], log: Path, **kwargs: object) -> int:
    print("+ " + " ".join(cmd), flush=True)
    with log.open("a") as out:
        out.write("+ " + " ".join(cmd) + "\n")
        out.flush()
        return subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, **kwargs).returncode


def first_error(log: Path) -> str:
    """The first FAILED/ERROR line of pytest's summary, or else the last `error`-looking line of the log."""
    lines = log.read_text(errors="replace").splitlines()
    for line in lines:
        if line.startswith(("FAILED ", "ERROR ")):
            return line
    for line in reversed(lines):
        if re.search(r"error", line, re.IGNORECASE):
            return line.strip()
    return lines[-1] if lines else "(empty log)"


def install(pair: Pair, venv: Path, index: str) -> str | None:
    """A fresh environment with that torch and the requirements; None, or why it could not be made."""
    python = find_python(pair.python)
    if python is None:
        return f"no python{pair.python} on PATH or in pyenv"
    shutil.rmtree(venv, ignore_errors=True)
    venv.mkdir(parents=True)
    log = venv / "install.log"
    if run_logged([str(python), "-m", "venv", str(venv)], log):
        return f"venv failed: {first_error(log)}"
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    torch_source = [] if index == "pypi" else ["--index-url", index, "--extra-index-url", "https://pypi.org/simple"]
    if run_logged([*pip, f"torch=={pair.torch}", *torch_source], log):
        return f"torch {pair.torch} install failed: {first_error(log)}"
    # The requirements beside that torch, held to it: a torch below requirements.txt's bound fails here, not replaced.
    held = venv / "torch-constraint.txt"
    held.write_text(f"torch=={pair.torch}\n")
    if run_logged([*pip, "-r", str(ROOT / "requirements.txt"), "-c", str(held)], log):
        return f"requirements install failed: {first_error(log)}"
    return None


def test(pair: Pair, venv: Path) -> str:
    """The core tests in that environment; one line: passed or failed, with pytest's counts and the first error."""
    python = venv / "bin" / "python"
    if not python.exists():
        return "failed: no environment (run without --test-only first)"
    log = venv / "tests.log"
    log.unlink(missing_ok=True)
    found = subprocess.run(
        [str(python), "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True
    )
    if found.returncode:
        return f"failed: torch does not import: {found.stderr.strip().splitlines()[-1:]}"
    code = run_logged(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile", *CORE_TESTS], log
    )
    lines = log.read_text(errors="replace").splitlines()
    counts = next((line.strip("= ") for line in reversed(lines) if re.search(r"\d+ (passed|failed|error)", line)), "")
    installed = f"torch {found.stdout.strip()}"
    if code == 0:
        return f"passed ({installed}; {counts})"
    return f"failed ({installed}; {counts}): {first_error(log)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", action="append", help="PYTHON:TORCH, such as 3.11:2.13.0 (repeatable)")
    parser.add_argument("--venvs", type=Path, default=ROOT / ".compat", help="where the environments are made")
    parser.add_argument(
        "--torch-index", default="pypi", help=f"`pypi` (CUDA builds) or an index URL, such as {CPU_INDEX}"
    )
    phase = parser.add_mutually_exclusive_group()
    phase.add_argument("--install-only", action="store_true")
    phase.add_argument("--test-only", action="store_true")
    args = parser.parse_args(argv)
    try:
        pairs = [Pair.parse(text) for text in (args.pair or DEFAULT_PAIRS)]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    results: list[tuple[Pair, str]] = []
    for pair in pairs:
        venv = args.venvs.resolve() / pair.name
        problem = None if args.test_only else install(pair, venv, args.torch_index)
        if problem:
            results.append((pair, f"failed: {problem}"))
        elif args.install_only:
            results.append((pair, f"installed in {venv}"))
        else:
            results.append((pair, test(pair, venv)))
        print(f"python {pair.python}  torch {pair.torch}  {results[-1][1]}", flush=True)
    print("\nsummary:")
    for pair, line in results:
        print(f"python {pair.python}  torch {pair.torch}  {line}")
    return 0 if all(line.startswith(("passed", "installed")) for _, line in results) else 1


if __name__ == "__main__":
    sys.exit(main())
