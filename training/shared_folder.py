"""Whether every machine of a job sees the one output folder, checked at start-up, before anything is written.

A job over several machines writes one run folder: rank 0 writes the records, every rank its checkpoint
shards, and a resume reads all of them on every rank. With a folder of each machine's own (a node-local disk
at the same path, or another --output_dir per machine) the job would train to its end, and then
`complete.json` would list machine 0's files only and no other machine could read the checkpoint back. So rank
0 writes a probe file of a name no other launch uses, every rank looks for it, and the ranks that cannot
see it are named, by machine, in one line. The same path on two machines proves nothing; the probe's name,
drawn at random, does.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from training.errors import RunError

PROBE_PREFIX = ".shared-folder-probe-"
# A shared file system may show another machine's new file a moment late; a folder that is not shared never
# shows it, so this wait is spent only on the way to the error.
SEE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Sighting:
    """What one rank found: whether it sees rank 0's probe, and where it runs."""

    rank: int
    node: int  # the machine's rank in the job (torchrun's GROUP_RANK)
    host: str
    seen: bool


def write_probe(out: Path) -> tuple[Path, bool]:
    """Rank 0's probe in `out`: its path (the name is its content) and whether this created `out`."""
    created = not out.exists()
    probe = out / f"{PROBE_PREFIX}{uuid.uuid4().hex}"
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe.write_text(probe.name)
    except OSError as exc:
        raise RunError(f"--output_dir {out} cannot be written: {exc}") from None
    return probe, created


def sees(probe: Path, timeout_s: float = SEE_TIMEOUT_S) -> bool:
    """Whether this process finds rank 0's probe (by name and content) within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if probe.read_text() == probe.name:
                return True
        except OSError:
            pass  # not there (yet)
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def own_sighting(rank: int, probe: Path, timeout_s: float = SEE_TIMEOUT_S) -> Sighting:
    return Sighting(rank, int(os.environ.get("GROUP_RANK", "0")), socket.gethostname(), sees(probe, timeout_s))


def unshared_error(out: Path, sightings: list[Sighting]) -> str | None:
    """The one line naming the machines that cannot see rank 0's probe in `out`; None when every rank sees it."""
    blind = [s for s in sightings if not s.seen]
    if not blind:
        return None
    writer = next(s for s in sightings if s.rank == 0)
    nodes = sorted({s.node for s in blind})
    machines = ", ".join(_machine(node, [s for s in blind if s.node == node]) for node in nodes)
    return (
        f"--output_dir {out} is not one folder that every machine of the job sees: rank 0 (machine "
        f"{writer.node}, host {writer.host}) wrote a probe file there that {machines} cannot see. Give an "
        f"--output_dir on a file system every machine mounts at the same path; for a folder of each machine's "
        f"own, run each machine as a job of its own"
    )


def _machine(node: int, blind: list[Sighting]) -> str:
    ranks = ", ".join(str(s.rank) for s in sorted(blind, key=lambda s: s.rank))
    return f"machine {node} (host {blind[0].host}, rank{'s' if len(blind) > 1 else ''} {ranks})"


def remove_probe(probe: Path, created: bool, shared: bool) -> None:
    """Rank 0 removes its probe once every rank has looked, and the folder too when it made it for a job that
    is refused: a refused launch leaves nothing behind."""
    probe.unlink(missing_ok=True)
    if created and not shared:
        try:
            probe.parent.rmdir()
        except OSError:
            pass  # something else was put there meanwhile: left as it is
