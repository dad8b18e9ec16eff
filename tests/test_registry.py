"""Every entry of the strategy registry launches with its own config and runs what the entry claims.

The launches are driven by the registry itself, so a new entry is tested by construction: its config
file must exist, start the number of processes it claims, put the wrapper it names around the model,
shard (or not) as it says, with the FSDP mode it says, and hold the model state the planner predicts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.launch import (
    CONFIGS,
    MACHINES,
    PROCESSES_PER_MACHINE,
    SHARED_STEPS,
    assert_planned_exactly,
    config_processes,
    summary,
)
from training.distributed import registry
from training.distributed.registry import STRATEGIES, FsdpMode, Strategy, Wrapper

STEPS = SHARED_STEPS


def test_names_are_unique_and_lookups_agree() -> None:
    assert len(set(registry.names())) == len(STRATEGIES)
    assert len({s.config_file for s in STRATEGIES}) == len(STRATEGIES)
    for position, entry in enumerate(STRATEGIES):
        assert registry.get(entry.name) is entry and registry.order(entry.name) == position
        assert registry.shards(entry.name) == (entry.fsdp is not None)
    assert registry.find("no-such-strategy") is None and registry.order("no-such-strategy") == len(STRATEGIES)
    with pytest.raises(ValueError, match="unknown strategy 'no-such-strategy'; choose from single, ddp"):
        registry.get("no-such-strategy")


def test_fsdp_modes_name_their_entry_or_are_spelled_out() -> None:
    for entry in STRATEGIES:
        if entry.fsdp is not None:
            assert registry.fsdp_mode_name(entry.fsdp) == entry.name
    unnamed = registry.fsdp_mode_name(FsdpMode(reshard_after_forward=False, offload_params=True))
    assert registry.find(unnamed) is None and registry.shards(unnamed)
    assert registry.shards(registry.fsdp_mode_name(None))


def test_the_unsharded_entries_are_one_single_process_and_one_replicating() -> None:
    single, replicated = registry.unsharded(multi_process=False), registry.unsharded(multi_process=True)
    assert not single.multi_process and single.wrapper is Wrapper.NONE
    assert replicated.multi_process and replicated.wrapper is Wrapper.DDP
    assert registry.by_wrapper(Wrapper.DDP.value) is replicated
    assert registry.by_wrapper(Wrapper.FSDP.value) is None  # several entries: the FSDP mode tells them apart


def test_reference_strategies_come_first_in_the_registry_order() -> None:
    reference = registry.reference_names()
    assert reference == registry.names()[: len(reference)] and len(reference) == 3


@pytest.fixture(scope="module")
def walked(shared_runs) -> dict[str, Path]:
    """One launch per registry entry with the entry's own config file and --strategy: the shared runs
    (tests/conftest.py), at the defaults (W&B offline without a login, the export on)."""
    for entry in STRATEGIES:
        assert (CONFIGS / entry.config_file).is_file(), entry.name
    return {entry.name: shared_runs[entry.name] for entry in STRATEGIES}


@pytest.mark.multiprocess
@pytest.mark.parametrize("entry", STRATEGIES, ids=lambda s: s.name)
def test_each_entry_runs_what_it_claims(walked: dict[str, Path], entry: Strategy) -> None:
    s = summary(walked[entry.name])
    assert s["strategy"] == entry.name and s["complete"] is True and s["steps"] == STEPS
    if entry.multi_machine:  # its launch, not its config's example, sets the processes
        assert (s["world_size"], s["num_machines"]) == (MACHINES * PROCESSES_PER_MACHINE, MACHINES)
    else:
        assert s["world_size"] == config_processes(entry.config_file) == (2 if entry.multi_process else 1)
    assert s["wrapper"] == (entry.wrapper.value if entry.wrapper is not Wrapper.NONE else "GPT2")
    assert s["params_sharded"] is entry.shards
    if entry.fsdp is None:
        assert s["fsdp_reshard_after_forward"] is None and s["fsdp_offload_params"] is None
    else:
        assert s["fsdp_reshard_after_forward"] is entry.fsdp.reshard_after_forward
        assert s["fsdp_offload_params"] is entry.fsdp.offload_params
        observed = s["sharding_observed"]
        assert observed["grads"] == "sharded"
        assert observed["block_params_between_forward_and_backward"] == (
            "sharded" if entry.fsdp.reshard_after_forward else "whole"
        )


@pytest.mark.multiprocess
@pytest.mark.parametrize("entry", STRATEGIES, ids=lambda s: s.name)
def test_each_entry_holds_the_model_state_its_plan_counts(walked: dict[str, Path], entry: Strategy) -> None:
    assert_planned_exactly(walked[entry.name])  # model state byte for byte, the step peak within 0.05%
