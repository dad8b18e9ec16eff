"""Peak FLOP/s for MFU: GPU figures only for the exact product."""

from __future__ import annotations

import math

import pytest

from training import hardware
from training.hardware import PeakFlops, gpu_peak_flops

# --- GPUs -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "precision", "tflops"), [
    ("NVIDIA L4", "bf16", 121.0),
    ("NVIDIA L40S", "bf16", 362.05),
    ("NVIDIA L40", "bf16", 181.05),
    ("NVIDIA L4", "fp32", 30.3),
    ("NVIDIA L40S", "fp32", 91.6),
    ("NVIDIA H100 80GB HBM3", "bf16", 989.5),  # SXM
    ("NVIDIA H100 PCIe", "bf16", 756.5),
    ("NVIDIA H100 NVL", "bf16", 835.5),
    ("NVIDIA H100 80GB HBM3", "fp32", 67.0),
    ("NVIDIA H100 PCIe", "fp32", 51.0),
    ("NVIDIA H100 NVL", "fp32", 60.0),
    ("NVIDIA H200", "fp16", 989.5),
    ("NVIDIA H200 NVL", "fp16", 835.5),
    ("NVIDIA A10", "bf16", 125.0),
    ("NVIDIA A10G", "bf16", 70.0),
    ("NVIDIA A100 80GB PCIe", "fp16", 312.0),
    ("Tesla T4", "fp16", 65.0),
    ("Tesla V100-PCIE-32GB", "fp16", 112.0),
    ("Tesla V100-SXM2-16GB", "fp16", 125.0),
])
def test_each_gpu_gets_its_own_exact_entry(name: str, precision: str, tflops: float) -> None:
    peak = gpu_peak_flops(name, precision)
    assert peak.flops_per_s == pytest.approx(tflops * 1e12, rel=1e-12)
    assert peak.source.startswith(f"table: {name} {precision} ") and peak.source.endswith(")")  # names its source
    assert peak.spread is None and not peak.cached


def test_t4_bf16_is_its_fp32_figure() -> None:
    # No bf16 tensor cores on Turing: bf16 runs at about the fp32 rate, not at the fp16 tensor rate.
    assert gpu_peak_flops("Tesla T4", "bf16").flops_per_s == gpu_peak_flops("Tesla T4", "fp32").flops_per_s == 8.1e12


@pytest.mark.parametrize(("name", "precision"), [
    ("NVIDIA H100", "bf16"),
    ("NVIDIA GeForce RTX 4090 D", "bf16"),  # a longer name holding a known one
    ("NVIDIA A100", "fp16"),
    ("AMD Instinct MI300X", "bf16"),
    ("NVIDIA  L4", "bf16"),  # inner whitespace is part of the name
    ("NVIDIA L4", "fp8"),  # a known part at a precision the table lacks
    ("", "fp32"),
])
def test_unknown_name_or_precision_gives_nan_and_says_so(name: str, precision: str) -> None:
    peak = gpu_peak_flops(name, precision)
    assert math.isnan(peak.flops_per_s)
    assert peak.source == (f"no peak-FLOP/s entry for {name!r} at {precision}: MFU not computed "
                           "(add it to training/hardware.py)")
    assert "\n" not in peak.source


@pytest.mark.parametrize("spelling", ["nvidia l40s", "  NVIDIA L40S\n", "Nvidia L40s\t"])
def test_names_are_normalised_for_case_and_surrounding_whitespace(spelling: str) -> None:
    assert gpu_peak_flops(spelling, "fp16").flops_per_s == gpu_peak_flops("NVIDIA L40S", "fp16").flops_per_s == 362.05e12


def test_every_table_entry_is_complete_and_plausible() -> None:
    names = [name for _, parts in hardware._GPU_FAMILIES for name in parts]
    assert len(names) == len(set(n.strip().casefold() for n in names)) == len(hardware._GPU_PEAK_TFLOPS)
    for name in names:
        figures = {p: gpu_peak_flops(name, p).flops_per_s for p in ("fp32", "fp16", "bf16")}
        assert all(math.isfinite(v) and v > 0 for v in figures.values()), name
        assert figures["fp32"] < figures["fp16"], name  # every listed part has faster fp16 than fp32
        assert figures["fp32"] <= figures["bf16"] <= figures["fp16"], name


def test_peak_flops_is_a_frozen_record() -> None:
    peak = PeakFlops(1.0, "x")
    assert peak.spread is None and not peak.cached and peak.relative_spread is None
    with pytest.raises(AttributeError):
        peak.flops_per_s = 2.0  # type: ignore[misc]
