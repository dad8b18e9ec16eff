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
}


def preset_overrides(name: str) -> dict[str, Any]:
    try:
        return dict(PRESETS[name].values)
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(sorted(PRESETS))}") from None
