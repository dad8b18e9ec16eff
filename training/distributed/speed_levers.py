"""The speed levers: which of them a run uses on its device, and putting them into effect.

Each lever has a flag (training/config.py, `SpeedConfig`) whose `auto` resolves here, from the device,
to the setting measured or documented to help there. A run records the resolved settings and the reason
for each (config.json's `launch.levers`, summary.json's `levers`, the W&B config).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn as nn

from training.distributed import registry

# torch.compile pays off from Ampere (compute capability 8.0) on: below it, inductor's Triton kernels are
# slower than cuBLAS/eager or fail to build (T4 is 7.5), and on CPU the measured step is slower than eager
# (docs/performance.md: 521 vs 593 tokens/s for a 6 x 384 model).
COMPILE_MIN_CAPABILITY = (8, 0)
TF32_MIN_CAPABILITY = (8, 0)  # TF32 tensor cores arrived with Ampere


@dataclass(frozen=True)
class DeviceInfo:
    """What the levers depend on: the device type and, for CUDA, its compute capability."""

    type: str  # cuda | cpu | ...
    capability: tuple[int, int] | None = None

    @classmethod
    def of(cls, device: torch.device) -> DeviceInfo:
        if device.type == "cuda":
            return cls("cuda", tuple(torch.cuda.get_device_capability(device)))  # type: ignore[arg-type]
        return cls(device.type)

    def at_least(self, capability: tuple[int, int]) -> bool:
        return self.type == "cuda" and self.capability is not None and self.capability >= capability


@dataclass(frozen=True)
class Levers:
    """The levers in effect for a run, each with the one-line reason it is on or off."""

    compile: bool
    compile_reason: str
    activation_checkpointing: str  # off, or registry.CHECKPOINT_IN_MODEL / CHECKPOINT_IN_FSDP
    fused_adamw: bool
    fused_adamw_reason: str
    tf32: bool
    tf32_reason: str
    pin_memory: bool
    dataloader_workers: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _auto_on_off(value: str, flag: str) -> str:
    if value not in ("auto", "on", "off"):
        raise ValueError(f"--{flag} must be auto, on or off, got {value!r}")
    return value


def decide_compile(value: str, device: DeviceInfo) -> tuple[bool, str]:
    if _auto_on_off(value, "compile") != "auto":
        return value == "on", f"--compile {value}"
    if device.type == "cpu":
        return False, "auto: off on CPU, where the compiled step measured slower than eager"
    if not device.at_least(COMPILE_MIN_CAPABILITY):
        return False, (
            f"auto: off below compute capability 8.0 (this device: {device.capability}), slower or failing there"
        )
    return True, f"auto: on for compute capability {device.capability}"


def decide_fused_adamw(value: str, device: DeviceInfo) -> tuple[bool, str]:
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    supported = device.type in _get_fused_kernels_supported_devices()
    if _auto_on_off(value, "fused_adamw") == "on":
        if not supported:
            raise ValueError(f"--fused_adamw on: torch {torch.__version__} has no fused AdamW for {device.type}")
        return True, "--fused_adamw on"
    if value == "off":
        return False, "--fused_adamw off"
    # PyTorch has a fused CPU kernel too, but it is not measured here: CPU runs stay on the default
    # multi-tensor (foreach) AdamW that the strategies' equality tests exercise.
    if device.type == "cuda" and supported:
        return True, "auto: on for CUDA (one kernel for the whole update)"
    return False, f"auto: off on {device.type} (the default multi-tensor AdamW)"


def decide_tf32(value: str, device: DeviceInfo) -> tuple[bool, str]:
    if _auto_on_off(value, "tf32") == "on":
        if not device.at_least(TF32_MIN_CAPABILITY):
            raise ValueError(
                f"--tf32 on needs a CUDA GPU of compute capability 8.0 or newer; this is {device.type}"
                + (f" {device.capability}" if device.capability else "")
            )
        return True, "--tf32 on"
    if value == "off":
        return False, "--tf32 off"
    if device.at_least(TF32_MIN_CAPABILITY):
        return True, f"auto: on for compute capability {device.capability} (fp32 matmuls on TF32 tensor cores)"
    return False, f"auto: off ({device.type} has no TF32 tensor cores)"


def decide_levers(speed: Any, dataloader_workers: int, device: DeviceInfo, strategy: str) -> Levers:
    """Resolve a SpeedConfig (training/config.py) for `device` and the strategy requested by the launch."""
    compile_on, compile_reason = decide_compile(speed.compile, device)
    fused, fused_reason = decide_fused_adamw(speed.fused_adamw, device)
    tf32, tf32_reason = decide_tf32(speed.tf32, device)
    checkpointing = "off"
    if speed.activation_checkpointing:
        checkpointing = registry.activation_checkpointing(strategy)
    return Levers(
        compile=compile_on,
        compile_reason=compile_reason,
        activation_checkpointing=checkpointing,
        fused_adamw=fused,
        fused_adamw_reason=fused_reason,
        tf32=tf32,
        tf32_reason=tf32_reason,
        pin_memory=speed.pin_memory and device.type == "cuda",
        dataloader_workers=dataloader_workers,
    )


def apply_tf32(enabled: bool) -> None:
    """fp32 matmuls on TF32 tensor cores ("high") or in full fp32 ("highest", PyTorch's default)."""
    torch.set_float32_matmul_precision("high" if enabled else "highest")


def compile_blocks(blocks: nn.ModuleList, **compile_kwargs: Any) -> None:
    """Compile each transformer block's forward in place.

    Only `forward` is compiled, so module hooks (FSDP's all-gathers, checkpoint wrappers) run around the
    compiled code rather than being traced into it, and the module tree, its class names and parameter
    names stay as they are (auto-wrap, checkpoints and the Hugging Face export see the same model).
    The blocks are alike, so one graph serves them all (compiled once, not once per block).
    """
    for block in blocks:
        block.forward = torch.compile(block.forward, **compile_kwargs)
