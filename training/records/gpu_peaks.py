"""Datasheet peak FLOP/s by exact product name, without torch.

training/records/peaks.py reads the peaks for MFU; the planner (planner/gpus.py) reads them for its GPUs' speed.
"""

from __future__ import annotations

# Dense (no 2:4 sparsity) peak TFLOP/s, keyed on the exact name torch.cuda.get_device_name() reports.
# fp16 and bf16 are tensor-core rates with fp32 accumulation (what PyTorch's matmuls use); fp32 is plain
# FP32 math, not TF32 (PyTorch leaves TF32 matmuls off by default). Datasheets that print only figures
# "with sparsity" are halved. A part missing here, or a precision missing from its entry, gets no figure
# (nan): a wrong peak would make a wrong MFU look right.
_GPU_FAMILIES: tuple[tuple[str, dict[str, dict[str, float]]], ...] = (
    # NVIDIA H100 Tensor Core GPU datasheet (SXM, PCIe and NVL columns; bf16/fp16 printed with sparsity:
    # SXM 1,979, PCIe 1,513, NVL 1,671). "H100 80GB HBM3" is the SXM5 part.
    (
        "NVIDIA H100 datasheet",
        {
            "NVIDIA H100 80GB HBM3": {"bf16": 989.5, "fp16": 989.5, "fp32": 67.0},
            "NVIDIA H100 PCIe": {"bf16": 756.5, "fp16": 756.5, "fp32": 51.0},
            "NVIDIA H100 NVL": {"bf16": 835.5, "fp16": 835.5, "fp32": 60.0},
        },
    ),
    # NVIDIA H200 Tensor Core GPU datasheet (H200 SXM and H200 NVL columns; printed with sparsity:
    # SXM 1,979, NVL 1,671). "NVIDIA H200" is the SXM part.
    (
        "NVIDIA H200 datasheet",
        {
            "NVIDIA H200": {"bf16": 989.5, "fp16": 989.5, "fp32": 67.0},
            "NVIDIA H200 NVL": {"bf16": 835.5, "fp16": 835.5, "fp32": 60.0},
        },
    ),
    # NVIDIA A100 Tensor Core GPU datasheet: the same peaks for the 40 GB and 80 GB, SXM4 and PCIe parts.
    (
        "NVIDIA A100 datasheet",
        {
            "NVIDIA A100-SXM4-40GB": {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5},
            "NVIDIA A100-SXM4-80GB": {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5},
            "NVIDIA A100-PCIE-40GB": {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5},
            "NVIDIA A100 80GB PCIe": {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5},
        },
    ),
    # NVIDIA A10 Tensor Core GPU datasheet.
    (
        "NVIDIA A10 datasheet",
        {
            "NVIDIA A10": {"bf16": 125.0, "fp16": 125.0, "fp32": 31.2},
        },
    ),
    # The A10G is AWS's variant (EC2 G5 instances) and has no NVIDIA datasheet. Figures as tabulated in
    # Baseten's "NVIDIA A10 vs A10G for ML model inference", and what 80 SMs at 1.71 GHz give: more FP32
    # than the A10, tensor cores at the GeForce-like half rate with fp32 accumulation.
    (
        "no NVIDIA datasheet; Baseten's A10 vs A10G table",
        {
            "NVIDIA A10G": {"bf16": 70.0, "fp16": 70.0, "fp32": 35.0},
        },
    ),
    # NVIDIA L4 Tensor Core GPU datasheet (bf16/fp16 printed with sparsity: 242).
    (
        "NVIDIA L4 datasheet",
        {
            "NVIDIA L4": {"bf16": 121.0, "fp16": 121.0, "fp32": 30.3},
        },
    ),
    # NVIDIA L40S and L40 datasheets (both print dense and sparse tensor figures).
    (
        "NVIDIA L40S datasheet",
        {
            "NVIDIA L40S": {"bf16": 362.05, "fp16": 362.05, "fp32": 91.6},
        },
    ),
    (
        "NVIDIA L40 datasheet",
        {
            "NVIDIA L40": {"bf16": 181.05, "fp16": 181.05, "fp32": 90.5},
        },
    ),
    # NVIDIA T4 datasheet ("mixed precision FP16/FP32" 65 TFLOPS). Turing has no bf16 tensor cores;
    # PyTorch runs bf16 matmuls there through fp32 math (torch.cuda.is_bf16_supported() says True by
    # emulation), so the bf16 peak is the fp32 figure.
    (
        "NVIDIA T4 datasheet",
        {
            "Tesla T4": {"bf16": 8.1, "fp16": 65.0, "fp32": 8.1},
        },
    ),
    # NVIDIA V100 Tensor Core GPU datasheet (SXM2 and PCIe columns; "tensor performance" is fp16).
    # Volta has no bf16 support in hardware: bf16 is emulated at about fp32 speed, as on the T4.
    (
        "NVIDIA V100 datasheet",
        {
            "Tesla V100-SXM2-16GB": {"bf16": 15.7, "fp16": 125.0, "fp32": 15.7},
            "Tesla V100-SXM2-32GB": {"bf16": 15.7, "fp16": 125.0, "fp32": 15.7},
            "Tesla V100-PCIE-16GB": {"bf16": 14.0, "fp16": 112.0, "fp32": 14.0},
            "Tesla V100-PCIE-32GB": {"bf16": 14.0, "fp16": 112.0, "fp32": 14.0},
        },
    ),
    # NVIDIA Tesla P100 datasheet (PCIe column). No tensor cores: fp16 is packed half2 math at twice the
    # fp32 rate; no bf16 in hardware, emulated at about fp32 speed.
    (
        "NVIDIA P100 datasheet",
        {
            "Tesla P100-PCIE-16GB": {"bf16": 9.3, "fp16": 18.7, "fp32": 9.3},
        },
    ),
    # NVIDIA Ada GPU architecture whitepaper, appendix (RTX 4090): fp16/bf16 tensor with FP32 accumulate,
    # which GeForce parts run at half the fp16-accumulate rate (330.3).
    (
        "NVIDIA Ada architecture whitepaper",
        {
            "NVIDIA GeForce RTX 4090": {"bf16": 165.2, "fp16": 165.2, "fp32": 82.6},
        },
    ),
    # NVIDIA Ampere GA102 architecture whitepaper, appendix (RTX 3090): fp16/bf16 tensor with FP32
    # accumulate (142 with fp16 accumulate).
    (
        "NVIDIA Ampere GA102 whitepaper",
        {
            "NVIDIA GeForce RTX 3090": {"bf16": 71.0, "fp16": 71.0, "fp32": 35.6},
        },
    ),
)


def _normalise_name(name: str) -> str:
    return name.strip().casefold()


_GPU_PEAK_TFLOPS: dict[str, tuple[str, str, dict[str, float]]] = {
    _normalise_name(name): (name, datasheet, figures)
    for datasheet, parts in _GPU_FAMILIES
    for name, figures in parts.items()
}


def datasheet_entry(device_name: str) -> tuple[str, str, dict[str, float]] | None:
    """(exact name, datasheet, TFLOP/s by precision) of the GPU named device_name, up to case and spaces."""
    return _GPU_PEAK_TFLOPS.get(_normalise_name(device_name))
