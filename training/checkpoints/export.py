"""Export a training checkpoint of any strategy (FSDP's sharded ones too) as a Hugging Face folder.

    python -m training.checkpoints.export --checkpoint RUN_DIR_OR_CHECKPOINT --out FOLDER [--tokenizer NAME_OR_PATH]

Runs in one process without a GPU; the folder loads with `GPT2LMHeadModel.from_pretrained(FOLDER)`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from training.cli import run_main


def export_checkpoint(checkpoint: Path, out: Path, tokenizer_name: str | None = None) -> None:
    from data import load_tokenizer
    from model.hf import save_hf
    from training.checkpoints.store import load_model_from_checkpoint

    model = load_model_from_checkpoint(checkpoint)
    tokenizer = load_tokenizer(tokenizer_name)
    tokenizer.model_max_length = model.config.n_positions
    save_hf(model, out, tokenizer=tokenizer)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m training.checkpoints.export", description=__doc__.strip().splitlines()[0]
    )
    parser.add_argument(
        "--checkpoint",
        required=True,
        type=Path,
        help="a checkpoint folder (checkpoints/step_N) or a run directory (its newest checkpoint)",
    )
    parser.add_argument("--out", required=True, type=Path, help="the Hugging Face folder to write")
    parser.add_argument("--tokenizer", default=None, help="tokenizer to save beside the model (default: GPT-2's)")
    args = parser.parse_args(argv)
    try:
        export_checkpoint(args.checkpoint, args.out, args.tokenizer)
    except (FileNotFoundError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    run_main(main)
