"""Stand-ins for planner/measure.py's workers, importable by the processes it spawns (tests/test_measure.py)."""

from __future__ import annotations

import time


def fail_first_wait_others(rank: int, seconds: float) -> int:
    """Rank 0 fails at once; every other rank would wait `seconds` (as in a barrier the failed one never reaches)."""
    if rank == 0:
        raise RuntimeError("out of memory, say")
    time.sleep(seconds)
    return rank


def rank_squared(rank: int) -> int:
    return rank * rank
