"""Reproduces accelerate's silent fallbacks on CPU and asks the guard about them.

    accelerate launch --config_file accelerate_configs/fsdp.yaml tests/strategy_fallback_probe.py cpu
        -> Accelerator(cpu=True) without the project's FSDP-on-CPU fix: accelerate wraps in DDP
    accelerate launch --config_file accelerate_configs/ddp.yaml tests/strategy_fallback_probe.py default
        -> Accelerator() on a machine without a GPU: each process trains alone

Prints "GUARD: <message>" and exits 3 when the guard stops it, "NO GUARD" and exits 0 otherwise.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402

from model import GPT2, GPT2Config  # noqa: E402
from training.distributed.strategy import (  # noqa: E402
    StrategyMismatch,
    check_strategy,
    effective_strategy,
    requested_from_env,
)


def main(mode: str) -> int:
    requested = requested_from_env(os.environ)
    accelerator = Accelerator(cpu=True, mixed_precision="no") if mode == "cpu" else Accelerator(mixed_precision="no")
    model = GPT2(GPT2Config.from_preset("tiny"))
    optimizer = torch.optim.AdamW(model.parameters())
    model, optimizer = accelerator.prepare(model, optimizer)
    try:
        check_strategy(requested, effective_strategy(accelerator, model))
    except StrategyMismatch as exc:
        print(f"GUARD: {exc}", flush=True)
        return 3
    print("NO GUARD", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
