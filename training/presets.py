"""Named training presets: values that override the dataclass defaults, flags override them again."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Preset:
    description: str
    values: dict[str, Any] = field(default_factory=dict)


PRESETS: dict[str, Preset] = {
    "tiny": Preset(
        "2-layer, 64-wide GPT-2 on 64-token blocks; a CPU run of a few dozen steps takes about a minute on 2 cores",
        {
            "model_preset": "tiny",
            "block_size": 64,
            "micro_batch_size": 8,
            # 16 sequences: 2 micro-steps in one process, 1 per process with 2 processes.
            "global_batch_tokens": 16 * 64,
            "lr": 1e-3,
            "warmup_steps": 5,
            "max_steps": 30,
            "log_interval": 1,
            "eval_blocks": 64,
        },
    ),
    "mini": Preset(
        "4-layer, 128-wide GPT-2 on 128-token blocks; a few minutes on CPU",
        {
            "model_preset": "mini",
            "block_size": 128,
            "micro_batch_size": 8,
            "global_batch_tokens": 16 * 128,
            "lr": 1e-3,
            "warmup_steps": 20,
            "log_interval": 5,
            "eval_blocks": 64,
        },
    ),
    "gpt2": Preset(
        "GPT-2 124M on 1024-token blocks, the reference experiment's model (sized for 2x T4, fp16)",
        {
            "model_preset": "gpt2",
            "block_size": 1024,
            # 4 x 1024 tokens per micro-step fits a 16 GB T4 in fp16; 16 sequences per optimizer step
            # gives 4 micro-steps on one GPU and 2 per GPU on two.
            "micro_batch_size": 4,
            "global_batch_tokens": 16 * 1024,
            "lr": 6e-4,
            "warmup_steps": 100,
            "log_interval": 10,
        },
    ),
    # The larger GPT-2s keep the 124M preset's global batch (16 x 1024 tokens); the learning rates are those
    # GPT-3's paper (Table 2.1) used at these sizes. The micro-batch and activation checkpointing are what
    # `python -m planner --preset P --gpu T4 --num_gpus 2 --launch` picks for 2x T4 in fp16, with the
    # strategy it launches (tests/test_plan_launch.py keeps them equal; docs/scaling_models.md).
    "gpt2-medium": Preset(
        "GPT-2 355M (24 layers, 1024 wide) on 1024-token blocks; sized for 2x T4, fp16, by the planner: fsdp, "
        "micro-batch 4 (single fits too; ddp does not)",
        {
            "model_preset": "gpt2-medium",
            "block_size": 1024,
            "micro_batch_size": 4,
            "global_batch_tokens": 16 * 1024,
            "lr": 3e-4,
            "warmup_steps": 100,
            "log_interval": 10,
        },
    ),
    "gpt2-large": Preset(
        "GPT-2 774M (36 layers, 1280 wide) on 1024-token blocks; sized for 2x T4, fp16, by the planner: fsdp, "
        "micro-batch 2 (single and ddp do not fit)",
        {
            "model_preset": "gpt2-large",
            "block_size": 1024,
            "micro_batch_size": 2,
            "global_batch_tokens": 16 * 1024,
            "lr": 2.5e-4,
            "warmup_steps": 100,
            "log_interval": 10,
        },
    ),
    "gpt2-xl": Preset(
        "GPT-2 1.5B (48 layers, 1600 wide) on 1024-token blocks; sized for 2x T4, fp16, by the planner: fsdp, "
        "micro-batch 1 with activation checkpointing (only fsdp and fsdp_offload fit)",
        {
            "model_preset": "gpt2-xl",
            "block_size": 1024,
            "micro_batch_size": 1,
            "global_batch_tokens": 16 * 1024,
            "activation_checkpointing": True,
            "lr": 2e-4,
            "warmup_steps": 100,
            "log_interval": 10,
        },
    ),
}


def preset_overrides(name: str) -> dict[str, Any]:
    try:
        return dict(PRESETS[name].values)
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(sorted(PRESETS))}") from None
