"""The torch and accelerate releases the project runs on: the one line that stops it below them, and the one
that warns above the newest tested.

requirements.txt declares lower bounds only, so that pip never replaces a user's newer torch or accelerate (a
newer torch replaced by pip is a multi-GB download that may not fit the machine's driver). Below a bound is
known breakage (docs/compat.md says which): a run, the experiment driver and the notebook stop at start-up, before
any work, rather than crash after step N on an API the installed torch lacks. Above NEWEST_TESTED nothing is
known to break: the run goes on after one warning line. Reads package metadata and files only: nothing is
imported.
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REQUIREMENTS = Path(__file__).resolve().parent.parent / "requirements.txt"
CHECKED = ("torch", "accelerate")  # the two whose APIs the project calls beyond their stable surface
# The newest release series docs/compat.md's table passed with (torch: lab/compat_check.py's newest pair).
# A later one is untested, not refused: one warning line, and the run goes on.
NEWEST_TESTED = {"torch": "2.14", "accelerate": "1.16"}
# PyTorch's own wheel index, one folder per build (cu128, rocm6.4, xpu, cpu), as its install selector gives it.
TORCH_INDEX = "https://download.pytorch.org/whl"


def parse(line: str) -> Any:
    """One requirement line as a packaging Requirement (packaging comes with accelerate, and pip carries a copy)."""
    try:
        from packaging.requirements import Requirement
    except ImportError:
        from pip._vendor.packaging.requirements import Requirement
    return Requirement(line)


def _version_class() -> Any:
    try:
        from packaging.version import Version
    except ImportError:
        from pip._vendor.packaging.version import Version
    return Version


def requirements(path: Path = REQUIREMENTS) -> list[Any]:
    """requirements.txt's lines as Requirements, comments, blank lines and pip's own options (`-e .`) left out."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [parse(line) for line in lines if line and not line.startswith("-")]


def installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def release(version: str) -> Any:
    """The release a version is a build of: a local build (2.13.0+cu126) or a vendor's pre-release of a release
    (NVIDIA's containers ship 2.7.0a0+<commit>) counts as that release. None when it is no PEP 440 version
    (a hand-made build's own tag): nothing to judge it by."""
    version_class = _version_class()
    try:
        return version_class(version_class(version).base_version)
    except ValueError:
        return None


def in_range(version: str, requirement: Any) -> bool:
    """Whether `version`'s release satisfies the requirement (a version that is no PEP 440 version does)."""
    found = release(version)
    return found is None or requirement.specifier.contains(found, prereleases=True)


def version_problem(path: Path = REQUIREMENTS) -> str | None:
    """None when the installed torch and accelerate satisfy requirements.txt's lower bounds, else refusal()'s
    line (or the one line saying why the bounds cannot be read)."""
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


def untested_releases() -> str | None:
    """One line naming each installed torch or accelerate newer than NEWEST_TESTED's series, with the newest
    tested beside it; None when there is none (a version that is no PEP 440 version is not judged)."""
    newer = []
    for name in CHECKED:
        found = installed_version(name)
        tested = _version_class()(NEWEST_TESTED[name])
        have = release(found) if found else None
        if have is not None and have.release[:2] > tested.release[:2]:
            newer.append(f"{name} {found} (newest tested: {tested})")
    if not newer:
        return None
    return f"untested releases: {', '.join(newer)}; docs/compat.md lists what was tested; the run goes on"


def shown(requirement: Any) -> str:
    """`torch>=2.10` as requirements.txt writes it (packaging's str puts an upper bound first)."""
    return requirement.name + ",".join(sorted(map(str, requirement.specifier), key=lambda spec: spec[0] != ">"))


def tested_range(requirement: Any) -> str:
    """`torch>=2.10,<2.15`: the requirement held below the release series after NEWEST_TESTED's."""
    major, minor = _version_class()(NEWEST_TESTED[requirement.name]).release[:2]
    return f"{shown(requirement)},<{major}.{minor + 1}"


def torch_build() -> str | None:
    """The build of the installed torch as PyTorch's index names its folders: `cu128` for one built with CUDA 12.8,
    `rocm6.4`, `xpu`, or `cpu`; None when torch is not installed or its build cannot be read.

    Read from the package's torch/version.py (torch.version.cuda and the others) without importing it: a torch
    the project refuses may not import at all. PyPI's Linux builds carry no local label (`2.9.0`), so the
    version alone does not tell."""
    try:
        text = Path(importlib.metadata.distribution("torch").locate_file("torch/version.py")).read_text()
    except (importlib.metadata.PackageNotFoundError, OSError):
        return None
    value = {
        key: found.group(1) if (found := re.search(rf"^{key}\b[^=\n]*=\s*['\"]([^'\"]+)['\"]", text, re.M)) else None
        for key in ("cuda", "hip", "xpu")
    }
    if value["cuda"]:
        return "cu" + "".join(value["cuda"].split(".")[:2])
    if value["hip"]:
        return "rocm" + ".".join(value["hip"].split(".")[:2])
    return "xpu" if value["xpu"] else "cpu"


def install_command(requirement: Any) -> str:
    """The pip command that installs the newest tested release; for torch, of the installed torch's build
    (a CUDA torch gets the build for its CUDA version, never a CPU wheel nor PyPI's default for another driver)."""
    build = torch_build() if requirement.name == "torch" else None
    index = f" --index-url {TORCH_INDEX}/{build}" if build else ""
    return f"pip install '{tested_range(requirement)}'{index}"


def refusal(requirement: Any, found: str | None) -> str:
    """One line: the release found, the bound and the command that installs a tested release."""
    have = f"{requirement.name} {found} is installed" if found else f"{requirement.name} is not installed"
    return (
        f"{have}; the project runs on {shown(requirement)} (tested up to {NEWEST_TESTED[requirement.name]}: "
        f"docs/compat.md); install a tested release: {install_command(requirement)}"
    )


def told_by(kind: str, message: str, env: Mapping[str, str], host: str) -> str | None:
    """The `kind: message` line (error, warning) this process of a launch prints of one every process finds:
    rank 0's as it is, the first process of every other machine's with its machine and rank (that machine's
    packages need not be rank 0's, and torchrun would show only its exit code), None for the others."""
    rank, local_rank = env.get("RANK", "0"), env.get("LOCAL_RANK", "0")
    if rank == "0":
        return f"{kind}: {message}"
    if local_rank == "0":
        return f"{kind}: machine {env.get('GROUP_RANK', '?')} ({host}), rank {rank}: {message}"
    return None
