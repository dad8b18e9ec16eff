"""The user docs stay docs for users: README.md and every docs/*.md (the files directly in docs/) at most 400
lines each, with no time of day and no load average in them (a dated sitting belongs in lab/results/, a
derivation in docs/design/), and no markdown link, there or in docs/design/ and lab/results/, that points at
a file or a section that is not there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MAX_LINES = 400

# A time of day, 13:05 or 09:41:07 (also inside 2026-12-06T13:05Z), not a version pair such as 3.11:2.12.0, a
# port such as 10.0.0.1:29500, CUBLAS's :4096:8 or a ratio such as 2:1.
TIME_OF_DAY = re.compile(r"(?<![\d.:])(?:[01]?\d|2[0-3]):[0-5]\d(?::[0-5]\d(?:\.\d+)?)?(?![\d:]|\.\d)")
LOAD_AVERAGE = re.compile(r"\bload\s+average", re.IGNORECASE)  # also across a line break
LINK = re.compile(r"\[[^\[\]]*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")  # the text may span lines
FENCE = re.compile(r"^```.*?^```[^\n]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def user_docs() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def linked_docs() -> list[Path]:
    return [
        *user_docs(),
        *sorted((REPO / "docs" / "design").glob("*.md")),
        *sorted((REPO / "lab" / "results").glob("*.md")),
    ]


def _name(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def prose(text: str) -> str:
    """The text without its fenced code blocks and code spans (a command's output may show anything)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def lab_notebook_marks(text: str) -> list[str]:
    """What reads like a lab notebook, code included: each time of day and load average, with its line number."""
    marks = [m for pattern in (TIME_OF_DAY, LOAD_AVERAGE) for m in pattern.finditer(text)]
    return [f"line {text.count(chr(10), 0, m.start()) + 1}: {' '.join(m.group().split())}" for m in marks]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} (.+?)#*$", FENCE.sub("", text), flags=re.MULTILINE):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(path: Path, text: str) -> list[str]:
    """Every relative link of `text` (the file `path`) whose file, or whose section in a markdown file, is missing."""
    broken = []
    for target in LINK.findall(prose(text)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, flags=re.IGNORECASE):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        if not file_part:  # a section of this page
            if anchor not in anchors(text):
                broken.append(target)
            continue
        linked = (path.parent / file_part).resolve()
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text(encoding="utf-8")):
            broken.append(target)
    return broken


@pytest.mark.parametrize("path", user_docs(), ids=_name)
def test_a_user_doc_is_at_most_400_lines(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, (
        f"{_name(path)}: {lines} lines; derivations go to docs/design/, measurements to lab/results/"
    )


@pytest.mark.parametrize("path", user_docs(), ids=_name)
def test_a_user_doc_holds_no_time_of_day_or_load_average(path: Path) -> None:
    assert lab_notebook_marks(path.read_text(encoding="utf-8")) == [], (
        f"{_name(path)}: a sitting belongs in lab/results/"
    )


@pytest.mark.parametrize("path", linked_docs(), ids=_name)
def test_every_relative_link_reaches_its_file_and_section(path: Path) -> None:
    assert broken_links(path, path.read_text(encoding="utf-8")) == [], _name(path)


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    # Times of day, in prose and in a command's output, and a load average; not a ratio, a version pair or a port.
    for bad, found in [
        ("measured at 13:05 UTC", "13:05"),
        ("2026-12-06 09:41:07", "09:41:07"),
        ("2026-12-06T23:59Z", "23:59"),
        ("at 7:30.", "7:30"),
        ("2026-12-07T14:01:12.5Z", "14:01:12.5"),
        ("the load\nAverage was 3.1", "load Average"),
    ]:
        assert lab_notebook_marks(f"text\n{bad}\nmore") == [f"line 2: {found}"], bad
    for fine in (
        "a 2:1 ratio",
        "--pair 3.11:2.12.0",
        "10.0.0.1:29500",
        "CUBLAS_WORKSPACE_CONFIG=:4096:8",
        "16:9",
        "workload average",
    ):
        assert lab_notebook_marks(fine) == [], fine
    # A missing file, a missing section, a section of this page; a link in code is no link.
    (tmp_path / "there.md").write_text("# Title\n\n## The fit rule, and more\n", encoding="utf-8")
    page = tmp_path / "page.md"
    text = (
        "## Here\n[a](there.md) [b](there.md#the-fit-rule-and-more) [c](#here) [d](https://example.com/x)\n"
        "[e](gone.md) [f](there.md#what-was-verified) [g](#nowhere)\n`[h](gone.md)`\n```\n[i](gone.md)\n```\n[two\nlines](far.md)\n"
    )
    assert broken_links(page, text) == ["gone.md", "there.md#what-was-verified", "#nowhere", "far.md"]
    # A heading that repeats gets GitHub's -1 anchor.
    assert anchors("## Notes\ntext\n## Notes\n") == {"notes", "notes-1"}
    # The lists the checks run over hold the user docs, the design notes and the lab's results.
    names = {_name(p) for p in user_docs()}
    assert {"README.md", "docs/planning.md", "docs/faults.md"} <= names and not any("/design/" in n for n in names)
    assert {"docs/design/planning_model.md", "lab/results/planning_checks.md"} <= {_name(p) for p in linked_docs()}
    # The line limit: one line over is too long.
    long = tmp_path / "long.md"
    long.write_text("line\n" * (MAX_LINES + 1), encoding="utf-8")
    with pytest.raises(AssertionError):
        test_a_user_doc_is_at_most_400_lines(long)
