"""tests/schedule.py: the files go out to the workers heaviest first, each file's tests together and in order."""

from __future__ import annotations

from pathlib import Path

from tests.schedule import DEFAULT_S, heaviest_first, seconds_from_junit


def test_the_heaviest_file_goes_first_and_each_file_keeps_its_tests_in_order() -> None:
    paths = ["tests/a.py", "tests/a.py", "tests/b.py", "tests/new.py", "tests/c.py", "tests/b.py"]
    seconds = {"tests/a.py": 1.0, "tests/b.py": 90.0, "tests/c.py": DEFAULT_S + 1}
    assert heaviest_first(paths, seconds) == [2, 5, 4, 3, 0, 1]  # b, c, the unknown file at DEFAULT_S, a


def test_the_table_is_refreshed_from_a_junit_report_summed_per_file(tmp_path: Path) -> None:
    xml = tmp_path / "suite.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_x" name="test_1" time="1.25"/>'
        '<testcase classname="tests.test_y.SomeCase" name="runTest" time="3.0"/>'
        '<testcase classname="tests.test_x" name="test_2" time="0.5"/>'
        "</testsuite></testsuites>"
    )
    assert seconds_from_junit(xml) == {"tests/test_y.py": 3.0, "tests/test_x.py": 1.8}
