"""The torch and accelerate releases the project runs on, and the one line that stops it outside them.

The ranges are requirements.txt's (docs/compat.md shows them tested): a run, the experiment driver and the
notebook check the installed releases at start-up, before any work, rather than crash after step N on an
API the installed torch lacks. Reads package metadata only: nothing is imported.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

REQUIREMENTS = Path(__file__).resolve().parent.parent / "requirements.txt"
CHECKED = ("torch", "accelerate")  # the two whose APIs the project calls beyond their stable surface


def parse(line: str) -> Any:
    """One requirement line as a packaging Requirement (packaging comes with accelerate, and pip carries a copy)."""
    try:
        from packaging.requirements import Requirement
    except ImportError:
        from pip._vendor.packaging.requirements import Requirement
    return Requirement(line)


def requirements(path: Path = REQUIREMENTS) -> list[Any]:
    """requirements.txt's lines as Requirements, comments, blank lines and pip's own options (`-e .`) left out."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [parse(line) for line in lines if line and not line.startswith("-")]


def installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def in_range(version: str, requirement: Any) -> bool:
    """Whether `version` is in the requirement's range, judged by its release: a local build (2.13.0+cu126) or a
    vendor's pre-release of a release (NVIDIA's containers ship 2.7.0a0+<commit>) counts as that release."""
    try:
        from packaging.version import Version
    except ImportError:
        from pip._vendor.packaging.version import Version
    try:
        release = Version(version).base_version
    except ValueError:  # not a PEP 440 version (a hand-made build's own tag): nothing to judge it by
        return True
    return requirement.specifier.contains(release, prereleases=True)


def version_problem(path: Path = REQUIREMENTS) -> str | None:
    """None when the installed torch and accelerate lie in requirements.txt's ranges, else refusal()'s line (or
    the one line saying why the ranges cannot be read)."""
    try:
        declared = requirements(path)
    except (OSError, ValueError) as exc:  # a missing file, or a line packaging cannot read (InvalidRequirement)
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__  # packaging's points at the column
        return f"cannot read the declared torch and accelerate ranges from {path}: {reason}"
    for requirement in declared:
        found = installed_version(requirement.name)
        if requirement.name in CHECKED and (found is None or not in_range(found, requirement)):
            return refusal(requirement, found)
    return None


def shown(requirement: Any) -> str:
    """`torch>=2.7,<2.15` as requirements.txt writes it (packaging's str puts the upper bound first)."""
    return requirement.name + ",".join(sorted(map(str, requirement.specifier), key=lambda spec: spec[0] != ">"))


def refusal(requirement: Any, found: str | None) -> str:
    """One line: the release found, the range and the command that installs a tested release."""
    have = f"{requirement.name} {found} is installed" if found else f"{requirement.name} is not installed"
    return (
        f"{have}; the project runs on {shown(requirement)} (tested: docs/compat.md); "
        f"install a tested release: pip install '{shown(requirement)}'"
    )
