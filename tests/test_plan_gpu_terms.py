"""The planner's terms that only a GPU run can confirm, against figures computed by hand (planner/cost_model.py,
planner/gpus.py; sources in docs/design/planning_model.md): CUDA autocast's fp32 LayerNorm, each GPU's usable memory,
and the offloaded AdamW update that runs on one host core."""

from __future__ import annotations

from dataclasses import replace

import pytest

from model.config import GPT2Config
from planner.cli import main
from planner.cost_model import (
    ADAMW_HOST_PASSES,
    HOST_UPDATE_CORE_GB_S,
    Link,
    Workload,
    activations,
    host_update_bytes,
    step_memory,
    step_time,
)
from planner.plan import hardware

GPT2 = GPT2Config.from_preset("gpt2")
S = 4 * 1024 * 768  # elements of one (B, T, C) tensor at micro-batch 4 x 1024: 3,145,728


def workload(device: str, precision: str = "fp16", **changes) -> Workload:
    return Workload(GPT2, 4, 1024, precision, changes.pop("world_size", 2), device=device, fused_adamw=True, **changes)


# ---------------------------------------------------------------------------------------------------
# CUDA autocast runs layer_norm in fp32 (aten/src/ATen/autocast_mode.cpp, CUDA fp32 list); CPU autocast does not.


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_under_fsdp_each_layernorm_saves_an_fp32_copy_on_cuda_only(precision: str) -> None:
    cuda, cpu = step_memory(workload("cuda", precision), "fsdp"), step_memory(workload("cpu", precision), "fsdp")
    # 12 blocks x 2 LayerNorms + ln_f = 25 LayerNorms, 2 bytes more each per element: 157,286,400 bytes.
    assert cuda.activations - cpu.activations == 25 * 2 * S == 157_286_400
    per_block = activations(workload("cuda", precision), "fsdp").per_block
    assert per_block - activations(workload("cpu", precision), "fsdp").per_block == 2 * 2 * S


def test_a_device_without_an_fp32_list_saves_half_layernorm_inputs() -> None:
    """Only the devices AUTOCAST_FP32_OPS lists cast layer_norm up: any other keeps the half input."""
    other, cpu = step_memory(workload("mps", "fp16"), "fsdp"), step_memory(workload("cpu", "fp16"), "fsdp")
    assert other.activations == cpu.activations


def test_with_checkpointing_only_the_final_layernorm_adds() -> None:
    """A checkpointed block keeps only its half-precision input; ln_f's input is still saved in fp32."""
    cuda = activations(workload("cuda", activation_checkpointing=True), "fsdp")
    cpu = activations(workload("cpu", activation_checkpointing=True), "fsdp")
    assert cuda.blocks == cpu.blocks
    assert cuda.head - cpu.head == 2 * S == 6_291_456


@pytest.mark.parametrize("strategy, precision", [("single", "fp16"), ("ddp", "bf16"), ("fsdp", "fp32")])
def test_no_change_where_the_residual_stream_is_already_fp32(strategy: str, precision: str) -> None:
    """Autocast alone keeps the residual stream fp32 (the LayerNorm input is fp32 on both devices); fp32 runs
    cast nothing."""
    world = 2 if strategy != "single" else 1
    assert (
        step_memory(workload("cuda", precision, world_size=world), strategy).total
        == step_memory(workload("cpu", precision, world_size=world), strategy).total
    )


# ---------------------------------------------------------------------------------------------------
# Usable memory: torch.cuda.get_device_properties(0).total_memory where a public report gives it


def test_t4_usable_memory_is_the_lower_figure_cuda_reports() -> None:
    """Colab's T4: total_memory=15102MB, printed by PyTorch's OOM message as "total capacity of 14.75 GiB"
    (hpcaitech/Open-Sora#697); newer drivers report 14.56 GiB (Zheng-Chong/CatVTON#133). The plan takes the
    lower, not the 16 GB of the datasheet nor nvidia-smi's 15,360 MiB."""
    hw = hardware("T4", "fp16", None, None)
    assert hw.memory_gib == 14.56 < 15102 / 1024
    assert "14.56 GiB" in hw.memory_source and "14.75 GiB" in hw.memory_source
    # The fit budget: (14.56 - 0.5 GiB for CUDA's own) / 1.10 for the allocator: 12.782 GiB of predicted peak.
    assert hw.budget_bytes == pytest.approx((14.56 - 0.5) * 2**30 / 1.10)
    assert hw.budget_bytes / 2**30 == pytest.approx(12.7818, abs=1e-4)


@pytest.mark.parametrize("gpu, gib", [("A100-40GB", 39.50), ("A100-80GB", 79.14)])
def test_a100_usable_memory_is_the_reported_total_capacity(gpu: str, gib: float) -> None:
    """TianheWu/CoSeR#10 ("total capacity of 39.50 GiB"), lianqi1008/Control-GIC#6 ("79.14 GiB")."""
    hw = hardware(gpu, "bf16", None, None)
    assert hw.memory_gib == gib and "CUDA total_memory" in hw.memory_source


def test_every_gpu_names_its_memory_source_and_a_given_figure_says_so() -> None:
    for gpu in ("T4", "L4", "A10G", "A100-40GB", "A100-80GB", "H100", "H200"):
        assert hardware(gpu, "fp16", None, None).memory_source
    assert hardware("T4", "fp16", 15.0, None).memory_source.startswith("given")


def test_the_text_output_states_parameters_and_assumptions(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--preset", "gpt2", "--gpu", "T4", "--num_gpus", "2"]) == 0
    out = capsys.readouterr().out
    assert "124,439,808 parameters" in out and "MFU 0.3" in out and "link 6 GB/s" in out
    assert "overlap full" in out and "usable memory 14.56 GiB per GPU (CUDA total_memory" in out
    assert "CUDA context" in out and "NCCL buffers" in out and "fragmentation" in out


# ---------------------------------------------------------------------------------------------------
# The offloaded update: torch's per-tensor AdamW, pass by pass, on one host core


def test_adamw_host_passes_move_72_bytes_per_element_and_80_for_decayed_matrices() -> None:
    """torch/optim/adam.py _single_tensor_adam: lerp_ 12, mul_ 8, addcmul_ 12, sqrt 8, div 8, add_ 8,
    addcdiv_ 16 (fp32 reads + writes); the decoupled decay's param.mul_ 8 more on the matrices."""
    assert sum(b for _, b in ADAMW_HOST_PASSES) == 72
    # GPT-2 124M: 124,439,808 elements, of which 124,318,464 in matrices (wte 38,597,376, wpe 786,432,
    # 12 blocks x 12 x 768^2 = 84,934,656) and 121,344 in vectors.
    w = workload("cuda", world_size=1)
    assert host_update_bytes(w, "fsdp_offload") == 72 * 124_439_808 + 8 * 124_318_464 == 9_954_213_888
    two = workload("cuda")
    assert host_update_bytes(two, "fsdp_offload", 0) + host_update_bytes(two, "fsdp_offload", 1) == 9_954_213_888


def test_offload_step_time_adds_host_copies_and_the_single_core_update() -> None:
    """2 x T4, GPT-2 124M, fp16: FSDP2 copies the fp32 shard to the GPU at each of the 2 all-gathers of a
    micro-step and the gradients back once per step: 3 x 62,219,904 x 4 B at 12 GB/s = 0.06222 s (it was
    counted as 2 copies per micro-step, 0.04148 s); the update 4,977,137,664 B at 10 GB/s = 0.49771 s."""
    w, link = workload("cuda"), Link(6.0)
    extra = step_time(w, "fsdp_offload", 65e12, 0.3, link).step_s - step_time(w, "fsdp", 65e12, 0.3, link).step_s
    copies = 3 * 124_439_808 / 2 * 4 / 12e9
    update = 4_977_137_664 / (HOST_UPDATE_CORE_GB_S * 1e9)
    assert copies == pytest.approx(0.062220, abs=1e-6) and update == pytest.approx(0.497714, abs=1e-6)
    assert extra == pytest.approx(copies + update, rel=1e-12)  # GB/s are 10^9 bytes: not a bit more
    # With accumulation: a x g copies in, one out (a = 4 micro-steps, g = 2 gathers each).
    four = replace(w, grad_accum_steps=4)
    offloaded, kept = step_time(four, "fsdp_offload", 65e12, 0.3, link), step_time(four, "fsdp", 65e12, 0.3, link)
    assert offloaded.communication_s - kept.communication_s == pytest.approx(9 * 124_439_808 / 2 * 4 / 12e9 + update)


def test_offload_on_a_cpu_costs_the_update_and_no_copy() -> None:
    """On a CPU run the "device" is the host: offloading moves nothing, only the AdamW update on one core
    is added to the step's communication."""
    w, link = workload("cpu", "fp32"), Link(6.0)
    offloaded, kept = step_time(w, "fsdp_offload", 1e12, 0.3, link), step_time(w, "fsdp", 1e12, 0.3, link)
    update = host_update_bytes(w, "fsdp_offload") / (HOST_UPDATE_CORE_GB_S * 1e9)
    assert offloaded.communication_s - kept.communication_s == pytest.approx(update, rel=1e-12) and update > 0
