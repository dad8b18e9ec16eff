"""The order in which the suite's files go out to the xdist workers: the heaviest first.

With `--dist loadfile` a worker takes a whole file at a time, in the order of the collection (conftest.py turns
xdist's own reordering by number of tests off). Files that launch training take minutes and an in-process
file seconds, so handing out the long ones first and the short ones last lets both workers end together
instead of one finishing a long file alone. tests/file_seconds.json holds each file's seconds from a whole
run; a file not in it (new since) counts DEFAULT_S. The order changes no test, only when it runs.

Refresh the table after a change that moves the figures (from the repository root, on a quiet machine):

    python -m pytest -q -n 2 --dist loadfile --junitxml=/tmp/suite.xml
    python -m tests.schedule /tmp/suite.xml > tests/file_seconds.json
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

TABLE = Path(__file__).with_name("file_seconds.json")
DEFAULT_S = 10.0  # a file the table does not know yet: between the launching files and the in-process ones


def file_seconds(table: Path = TABLE) -> dict[str, float]:
    """Seconds per test file, keyed by its path from the repository root ("tests/test_x.py")."""
    return json.loads(table.read_text()) if table.exists() else {}


def heaviest_first(paths: Sequence[str], seconds: dict[str, float]) -> list[int]:
    """Indexes of `paths` (one per test, the file it is in) ordered by its file's seconds, most first.

    Stable: the tests of one file keep their order and stay together, and files of equal weight keep theirs."""
    return sorted(range(len(paths)), key=lambda i: -seconds.get(paths[i], DEFAULT_S))


def seconds_from_junit(xml: Path) -> dict[str, float]:
    """Seconds per test file summed over the test cases of a pytest --junitxml report, most first."""
    totals: dict[str, float] = defaultdict(float)
    for case in ET.parse(xml).iter("testcase"):
        module = case.get("classname", "").split(".")  # tests.test_x or tests.test_x.SomeClass
        if len(module) >= 2 and module[0] == "tests":
            totals[f"tests/{module[1]}.py"] += float(case.get("time", 0))
    return {name: round(s, 1) for name, s in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))}


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m tests.schedule JUNIT_XML > tests/file_seconds.json", file=sys.stderr)
        return 2
    print(json.dumps(seconds_from_junit(Path(argv[0])), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
