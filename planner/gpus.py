"""The planner's GPUs: memory, the link between two of them, and the datasheet peak each is planned at.

The peaks themselves are training/records/gpu_peaks.py's, which MFU reads too.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PlannerGpu:
    key: str  # what --gpu takes
    device_name: str  # exact torch.cuda.get_device_name(), for the datasheet peak
    memory_gib: float  # the device's total memory in GiB (2^30), as CUDA reports it where known
    memory_source: str  # where memory_gib comes from: a usable-memory plan is only as good as this
    link: str  # how two of them in one machine usually talk
    link_gb_s: float  # assumed all-reduce bus bandwidth between two of them, GB/s (10^9 bytes)


# memory_gib: what a training process can address, not the marketing figure. Where it is known, it is
# torch.cuda.get_device_properties(0).total_memory, which PyTorch's out-of-memory message prints as "GPU 0
# has a total capacity of X GiB": less than nvidia-smi's total, which also counts what the driver keeps.
# The figures found in public out-of-memory reports are cited beside each; where none was found, nvidia-smi's
# total (MiB / 1024), which is an upper bound, and the source says so. The fit margin in planner/plan.py
# (CUDA_RESERVE_GIB, ALLOCATOR_SLACK) is then what the CUDA context, cuBLAS workspaces, NCCL's buffers and the
# caching allocator's fragmentation take out of this total.
# link_gb_s: the bus bandwidth NCCL's all_reduce_perf reaches between two GPUs, which is about 70-80% of
# the link's one-way peak: PCIe 3.0 x16 peaks at 15.75 GB/s; cloud T4 pairs (Kaggle, Colab, AWS g4dn)
# have no peer-to-peer path and go through host memory, which NCCL users measure at 5-8 GB/s, so 6 is
# assumed; PCIe 4.0 x16 peaks at 31.5 GB/s (L4, A10G: 20 assumed); NVLink 3 (A100 SXM) 300 GB/s one way
# per GPU (230 assumed), NVLink 4 (H100/H200 SXM) 450 (360 assumed). These are assumptions stated, not
# measurements: pass --link_gb_s with a figure measured on your machines.
# The lower of the T4's reported totals (below).
T4_USABLE_GIB = 14.56
_SMI = "nvidia-smi total, an upper bound: CUDA's total_memory not found in a public report"
PLANNER_GPUS: dict[str, PlannerGpu] = {
    gpu.key: gpu
    for gpu in (
        # Colab's T4: total_memory=15102MB in torch's device properties, printed as "total capacity of 14.75 GiB"
        # (github.com/hpcaitech/Open-Sora/issues/697). Newer drivers (GCP) report 14.56-14.58 GiB
        # (github.com/Zheng-Chong/CatVTON/issues/133, github.com/QwenLM/Qwen3-VL/issues/1046): 0.2 GiB less.
        # The plan takes the lower figure: a plan that fits 14.56 GiB fits 14.75 too, not the other way round.
        PlannerGpu(
            "T4",
            "Tesla T4",
            T4_USABLE_GIB,
            "CUDA total_memory with newer drivers ('total capacity of 14.56 GiB'); "
            "Colab/Kaggle report 14.75 GiB (15102 MiB)",
            "PCIe 3.0 through host memory (no peer-to-peer)",
            6.0,
        ),
        PlannerGpu("L4", "NVIDIA L4", 22.5, _SMI, "PCIe 4.0", 20.0),
        PlannerGpu("A10G", "NVIDIA A10G", 22.5, _SMI, "PCIe 4.0", 20.0),
        # "GPU 0 has a total capacity of 39.50 GiB" on an A100 40GB (github.com/TianheWu/CoSeR/issues/10).
        PlannerGpu(
            "A100-40GB",
            "NVIDIA A100-SXM4-40GB",
            39.50,
            "CUDA total_memory, 'total capacity of 39.50 GiB'",
            "NVLink 3",
            230.0,
        ),
        # "GPU 0 has a total capacity of 79.14 GiB" on an A100 80GB (github.com/lianqi1008/Control-GIC/issues/6).
        PlannerGpu(
            "A100-80GB",
            "NVIDIA A100-SXM4-80GB",
            79.14,
            "CUDA total_memory, 'total capacity of 79.14 GiB'",
            "NVLink 3",
            230.0,
        ),
        PlannerGpu("H100", "NVIDIA H100 80GB HBM3", 79.6, _SMI, "NVLink 4", 360.0),
        PlannerGpu("H200", "NVIDIA H200", 143771 / 1024, _SMI + " (143,771 MiB)", "NVLink 4", 360.0),
    )
}


def planner_gpu(key: str) -> PlannerGpu:
    """The planner GPU named `key` (case-insensitive); ValueError naming the known ones."""
    for gpu in PLANNER_GPUS.values():
        if gpu.key.casefold() == key.strip().casefold():
            return gpu
    raise ValueError(f"unknown --gpu {key!r}; known: {', '.join(PLANNER_GPUS)} (or give --gpu_memory_gib)")
