"""Facts about the device: peak FLOP/s for MFU, and peak memory readings."""

from __future__ import annotations

import resource
import sys
import time
from dataclasses import dataclass

import torch

# Dense (no sparsity) peak tensor-core TFLOP/s from the vendors' data sheets; fp32 is plain FP32 math
# (PyTorch leaves TF32 matmuls off by default). H100/H200 are the SXM parts.
_PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H200", {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0}),
    ("H100", {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5}),
    ("A10G", {"bf16": 70.0, "fp16": 70.0, "fp32": 31.2}),
    ("L4", {"bf16": 121.0, "fp16": 121.0, "fp32": 30.3}),
    ("V100", {"fp16": 125.0, "fp32": 15.7}),
    # The T4 has fp16 tensor cores but none for bf16, which it emulates at about fp32 speed.
    ("T4", {"fp16": 65.0, "fp32": 8.1, "bf16": 8.1}),
    ("P100", {"fp16": 18.7, "fp32": 9.3}),
)


@dataclass(frozen=True)
class PeakFlops:
    flops_per_s: float  # per device
    source: str  # which table entry or measurement


def peak_flops(device: torch.device, precision: str, cache_dir: object = None) -> PeakFlops:
    """Peak FLOP/s of one device at the training precision (fp32 | fp16 | bf16)."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, table in _PEAK_TFLOPS:
            if key in name and precision in table:
                return PeakFlops(table[precision] * 1e12, f"table: {key} {precision} {table[precision]} TFLOP/s")
        return PeakFlops(float("nan"), f"no table entry for {name!r} at {precision}: MFU not computed")
    return measure_cpu_matmul_flops()


def measure_cpu_matmul_flops(n: int = 512, seconds: float = 0.3) -> PeakFlops:
    """A measured fp32 matmul rate for this process's threads, standing in for a CPU's peak."""
    a = torch.randn(n, n)
    b = torch.randn(n, n)
    torch.mm(a, b)  # warm-up: thread pool and caches
    count, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        torch.mm(a, b)
        count += 1
    rate = 2 * n**3 * count / elapsed
    return PeakFlops(rate, f"measured: fp32 {n}x{n} matmul on CPU, {torch.get_num_threads()} thread(s), "
                           f"{rate / 1e9:.1f} GFLOP/s")


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so a perf_counter difference measures the work itself."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


MIB = 2**20


def peak_memory_mib(device: torch.device) -> tuple[float, float]:
    """(peak allocated, peak reserved) in MiB since the last reset.

    On CPU both are the process's peak resident set size, which the OS cannot reset: on CPU the
    per-epoch figure is the peak since the process started.
    """
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / MIB, torch.cuda.max_memory_reserved(device) / MIB
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss_bytes = rss if sys.platform == "darwin" else rss * 1024  # Linux reports KiB, macOS bytes
    return rss_bytes / MIB, rss_bytes / MIB
