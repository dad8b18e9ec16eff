"""Mutation score of one module: how many small deliberate bugs in it the given tests catch.

    python lab/mutation_score.py data/packing.py --tests tests/test_data_packing_properties.py tests/test_data_packing.py

Copies the project's files as they are in the working tree (tracked ones and new ones git does not ignore)
to a scratch folder, writes a mutmut 3 configuration there that mutates only MODULE and runs only the named
test files, runs `mutmut run` one mutant at a time at the lowest CPU priority, then prints a table line
(mutants, killed, survived, no tests, timeout, other, score = killed / mutants) and writes each surviving
mutant's diff to a file it names. The scratch folder is kept, so `mutmut show NAME` or `mutmut browse` can be
run there afterwards. lab/results/mutation_scores.md holds the scores and the equivalent mutants.

mutmut is a developer tool, not a requirement of the project: `pip install mutmut==3.8.1`.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from the repository root

from training.cli import OneLineParser, run_main  # noqa: E402

# Files beside the packages that the tests read (the launcher's configs, the training entry point, the docs' sample report).
EXTRA_COPIES = ("train.py", "accelerate_configs", "pyproject.toml", "docs")
# mutmut's names for the outcomes of one mutant, as `mutmut results --all true` prints them.
STATUSES = ("killed", "survived", "no tests", "timeout")


@dataclass(frozen=True)
class Score:
    """Outcomes of a module's mutants; `other` counts anything mutmut reports beyond STATUSES
    (segfault, suspicious, not checked)."""

    module: str
    counts: Counter[str]
    survivors: list[str]

    @property
    def mutants(self) -> int:
        return sum(self.counts.values())

    @property
    def score(self) -> float:
        return self.counts["killed"] / self.mutants if self.mutants else 0.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("module", type=Path, help="the module to mutate, e.g. data/packing.py")
    parser.add_argument("--tests", nargs="+", required=True, type=Path, help="test files to run against each mutant")
    parser.add_argument(
        "--marker",
        default="not multiprocess",
        help="pytest -m expression for every run (default: %(default)s; launches cost minutes per mutant)",
    )
    parser.add_argument(
        "--functions",
        nargs="+",
        default=[],
        help="mutate and count only these functions of MODULE (a method as Class.method): for a module that "
        "mixes pure logic with code only a launch runs",
    )
    parser.add_argument("--work", type=Path, help="scratch folder (default: a new one under the system's temp)")
    parser.add_argument("--survivors", type=Path, help="where the survivors' diffs go (default: in the scratch folder)")
    return parser.parse_args(argv)


def tracked_files(repo: Path) -> list[Path]:
    """The working tree's files that git tracks or would track (not ignored), as they are now: a new test
    file or an uncommitted edit is measured too."""
    listing = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    out = subprocess.run(listing, cwd=repo, capture_output=True, check=True).stdout
    return [Path(p.decode()) for p in out.split(b"\0") if p]


def copy_tree(repo: Path, work: Path) -> None:
    for rel in tracked_files(repo):
        source = repo / rel
        if source.is_file():  # a tracked file deleted in the working tree is left out
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, work / rel)


def packages(work: Path) -> list[str]:
    return sorted(p.parent.name for p in work.glob("*/__init__.py") if p.parent.name != "tests")


def write_config(work: Path, module: Path, tests: list[Path], marker: str = "not multiprocess") -> None:
    """setup.cfg's [mutmut] section; pyproject.toml must not hold a [tool.mutmut] table, or mutmut reads that."""
    package = module.parts[0]
    also = [p for p in packages(work) if p != package] + [p for p in EXTRA_COPIES if (work / p).exists()]

    def lines(values: list[str]) -> str:
        return "".join(f"\n    {v}" for v in values)

    (work / "setup.cfg").write_text(
        "[mutmut]\n"
        f"source_paths = {package}\n"
        f"only_mutate = {module.as_posix()}\n"
        f"also_copy ={lines(also)}\n"
        f"pytest_add_cli_args_test_selection ={lines([t.as_posix() for t in tests])}\n"
        + (f"pytest_add_cli_args ={lines(['-m', marker])}\n" if marker else "")
    )


def mutmut(work: Path, *args: str) -> str:
    """Runs mutmut in `work` at the lowest priority; its output."""
    command = ["nice", "-n", "19", sys.executable, "-m", "mutmut", *args]
    done = subprocess.run(command, cwd=work, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: mutmut {' '.join(args)} exited with status {done.returncode} in {work}")
    return done.stdout


def mutant_patterns(module: Path, functions: list[str]) -> list[str]:
    """mutmut's names of the mutants of `functions` (fnmatch patterns): `pkg.mod.x_name__mutmut_3`, and
    `pkg.mod.xǁClassǁmethod__mutmut_3` for a method."""
    dotted = module.with_suffix("").as_posix().replace("/", ".")
    return [f"{dotted}.x{'ǁ' + f.replace('.', 'ǁ') if '.' in f else '_' + f}__mutmut_*" for f in functions]


def one_thread_env() -> dict[str, str]:
    """The environment with torch's OpenMP and MKL pools at one thread. mutmut forks a child per mutant from a
    process that has run the tests; a pool's lock held at the fork stays held in the child, which then waits
    forever (seen with the checkpoint tests: children asleep on a futex, no CPU time, so no timeout either)."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def run_mutants(work: Path, patterns: list[str] | None = None) -> None:
    """`mutmut run`, one mutant at a time (those matching `patterns`, or all). Its progress spinner is one
    endless line, so its output goes to a log file, read only when the run fails (a test that fails
    unmutated, a test file not found)."""
    log = work / "mutmut-run.log"
    command = ["nice", "-n", "19", sys.executable, "-m", "mutmut", "run", "--max-children", "1", *(patterns or [])]
    with open(log, "w") as out:
        done = subprocess.run(command, cwd=work, stdout=out, stderr=subprocess.STDOUT, env=one_thread_env())
    if done.returncode != 0:
        raise SystemExit(f"error: mutmut run exited with status {done.returncode}; its output is in {log}")


def read_results(text: str, module: Path, patterns: list[str] | None = None) -> Score:
    """Counts `mutmut results --all true` lines ("    data.packing.x_f__mutmut_3: survived"), of the mutants
    matching `patterns` when given."""
    counts: Counter[str] = Counter()
    survivors = []
    for line in text.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if not sep or (patterns and not any(fnmatch.fnmatchcase(name, p) for p in patterns)):
            continue
        counts[status if status in STATUSES else "other"] += 1
        if status == "survived":
            survivors.append(name)
    return Score(module.as_posix(), counts, survivors)


def write_survivors(work: Path, score: Score, path: Path) -> None:
    diffs = [mutmut(work, "show", name) for name in score.survivors]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(diffs))


def table(score: Score) -> str:
    """A header and one row: module, mutants, each outcome, score."""
    columns = ["mutants", *STATUSES, "other", "score"]
    counts = [score.mutants, *(score.counts[s] for s in STATUSES), score.counts["other"]]
    row = [f"{n:>{len(c)}}" for n, c in zip(counts, columns)] + [f"{score.score:.0%}"]
    return f"{'module':<28} {' '.join(columns)}\n{score.module:<28} {' '.join(row)}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for path in [args.module, *args.tests]:
        if not (REPO / path).is_file():
            print(f"error: {path} is not a file of the project (give paths relative to {REPO})", file=sys.stderr)
            return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="mutation-"))
    if work.exists() and any(work.iterdir()):
        print(f"error: scratch folder {work} is not empty", file=sys.stderr)
        return 2
    work.mkdir(parents=True, exist_ok=True)
    copy_tree(REPO, work)
    write_config(work, args.module, args.tests, args.marker)
    patterns = mutant_patterns(args.module, args.functions)
    run_mutants(work, patterns)
    score = read_results(mutmut(work, "results", "--all", "true"), args.module, patterns)
    survivors = args.survivors or work / "survivors.txt"
    write_survivors(work, score, survivors)
    print(table(score))
    print(f"surviving mutants' diffs: {survivors} (scratch folder: {work})")
    return 0


if __name__ == "__main__":
    run_main(main)
