"""Real A/A splits pool only runs of one set-up: pooling runs of other presets, steps, world sizes, devices
or experiments would count their differences as false verdicts."""

from __future__ import annotations

import pytest

from analysis.calibration import pool_mismatch
from tests.test_statistics import make_run


def test_runs_of_one_set_up_pool() -> None:
    assert pool_mismatch([make_run("ddp", name=f"r{k}", world_size=2) for k in range(4)]) is None


@pytest.mark.parametrize("key", ["world_size", "device_name"])
def test_runs_that_differ_in_a_pooled_fact_do_not_pool(key: str) -> None:
    runs = [make_run("ddp", name=f"r{k}", world_size=2) for k in range(4)]
    runs[-1].summary[key] = 1 if key == "world_size" else "other-cpu"
    runs[-1].__dict__.pop("record", None)  # a cached record would still hold the old summary
    assert pool_mismatch(runs) is not None
