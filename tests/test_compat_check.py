"""lab/compat_check.py's parts that need no download: which pairs it takes and the line it prints per pair."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from training import versions

SCRIPT = Path(__file__).resolve().parent.parent / "lab" / "compat_check.py"
spec = importlib.util.spec_from_file_location("compat_check", SCRIPT)
compat_check = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = compat_check  # its dataclass looks its module up while being made
spec.loader.exec_module(compat_check)


@pytest.mark.parametrize("text", ["3.11", "2.13.0", "3.11:latest", "python3.11:2.13.0"])
def test_a_malformed_pair_is_one_error_line_and_exit_2(text: str, capsys) -> None:
    assert compat_check.main(["--pair", text]) == 2
    assert capsys.readouterr().err.startswith("error: --pair")


def test_the_default_pairs_lie_in_the_declared_range_and_include_its_minimum_and_colabs_python() -> None:
    (torch,) = [r for r in versions.requirements() if r.name == "torch"]
    pairs = [compat_check.Pair.parse(text) for text in compat_check.DEFAULT_PAIRS]
    assert all(versions.in_range(pair.torch, torch) for pair in pairs)
    lowest = min(pairs, key=lambda pair: tuple(map(int, pair.torch.split("."))))
    assert f">={'.'.join(lowest.torch.split('.')[:2])}" in str(torch.specifier)  # the table starts at the minimum
    assert {pair.python for pair in pairs} >= {"3.11", "3.12"}


def test_the_newest_tested_torch_is_the_newest_default_pair() -> None:
    """NEWEST_TESTED moves up only with a pair that compat_check runs (and docs/compat.md's table shows)."""
    torches = [compat_check.Pair.parse(text).torch for text in compat_check.DEFAULT_PAIRS]
    newest = max(torches, key=lambda torch: tuple(map(int, torch.split("."))))
    assert newest.rsplit(".", 1)[0] == versions.NEWEST_TESTED["torch"]


def test_docs_compat_md_has_a_dated_row_for_every_default_pair() -> None:
    table = (SCRIPT.parent.parent / "docs" / "compat.md").read_text()
    for pair in map(compat_check.Pair.parse, compat_check.DEFAULT_PAIRS):
        rows = re.findall(rf"^\| {re.escape(pair.python)} \| {re.escape(pair.torch)}\b.*$", table, re.MULTILINE)
        assert rows and all(re.search(r"\| 20\d\d-\d\d-\d\d\b", row) for row in rows), (pair, rows)


def test_the_first_error_is_pytests_first_failed_line(tmp_path: Path) -> None:
    log = tmp_path / "tests.log"
    log.write_text("..F.E\nE   AssertionError: x\nFAILED tests/a.py::t - AssertionError: x\nERROR tests/b.py::u\n")
    assert compat_check.first_error(log) == "FAILED tests/a.py::t - AssertionError: x"
    log.write_text("Collecting torch\nERROR: No matching distribution found for torch==9.9\n")
    assert compat_check.first_error(log) == "ERROR: No matching distribution found for torch==9.9"
