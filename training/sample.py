"""Sample text from a trained model.

    python -m training.sample --model runs/tiny --prompt "The meaning of life is" --max_new_tokens 50 \
        --temperature 0.8 --top_k 200 --seed 1337

--model is a Hugging Face folder (what `model.hf.save_hf` writes), a run directory (which holds one in
hf/) or a training checkpoint. The prompt is printed followed by the continuation. Bad input is one
line on stderr, exit 2. It lives in training/, not model/, because it reads training's checkpoints.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from model.gpt2 import GPT2
from model.hf import from_hf
from training.checkpoints.store import is_checkpoint_or_run, load_model_from_checkpoint
from training.cli import EXIT_BAD_INPUT, OneLineParser, run_main

if TYPE_CHECKING:
    import transformers

# What makes a folder a tokenizer folder for `AutoTokenizer.from_pretrained`.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


class ModelPathError(ValueError):
    """--model names nothing this module knows how to load. The message is one line, fit to show as is."""


def _hf_folder(path: Path) -> Path | None:
    """The Hugging Face model folder that `path` names, itself or as a run directory's hf/; else None.

    A run directory has a config.json of its own (the run's configuration), so config.json alone does
    not make a model folder: transformers' config always records a model_type.
    """
    for folder in (path, path / "hf"):
        config = folder / "config.json"
        if not config.is_file():
            continue
        try:
            model_type = json.loads(config.read_text()).get("model_type")
        except (OSError, ValueError, AttributeError):
            continue
        if model_type == "gpt2":
            return folder
        if model_type is not None:
            raise ModelPathError(f"{folder}: a Hugging Face folder for model_type {model_type!r}, not gpt2")
    return None


def resolve_model(path: str | Path) -> GPT2:
    """Load the model that --model names. Each format this module can read is one branch here.

    (a) a Hugging Face folder (config.json with model_type gpt2), (b) a run directory holding one in hf/,
    (c) a training checkpoint written by any strategy, or a run directory with checkpoints/ but no hf/.
    """
    path = Path(path)
    if not path.exists():
        raise ModelPathError(f"{path}: no such file or folder")
    folder = _hf_folder(path)
    if folder is not None:
        return from_hf(folder)
    if is_checkpoint_or_run(path):
        return load_model_from_checkpoint(path)
    raise ModelPathError(
        f"{path}: not a model: expected a Hugging Face folder (config.json + model.safetensors), "
        "a run directory with hf/ or checkpoints/, or a checkpoint folder"
    )


def resolve_tokenizer(path: str | Path) -> transformers.PreTrainedTokenizerFast:
    """The tokenizer saved beside the model if there is one, else GPT-2's (which every preset uses)."""
    from data.tokenizer import load_tokenizer

    try:
        folder = _hf_folder(Path(path))
    except ModelPathError:
        folder = None
    if folder is not None and any((folder / name).is_file() for name in _TOKENIZER_FILES):
        return load_tokenizer(str(folder))
    return load_tokenizer()


PROG = "python -m training.sample"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = OneLineParser(prog=PROG, description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="Hugging Face folder, or run directory containing hf/")
    p.add_argument("--prompt", required=True, help="text to continue")
    p.add_argument("--max_new_tokens", type=int, default=100, help="tokens to generate after the prompt")
    p.add_argument("--temperature", type=float, default=1.0, help="0 is greedy; higher is more random")
    p.add_argument("--top_k", type=int, default=None, help="sample only among the K most likely tokens")
    p.add_argument("--seed", type=int, default=None, help="makes sampling reproducible")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    # Checked before loading anything, so a typo costs no model load.
    if args.max_new_tokens < 0:
        p.error(f"--max_new_tokens must be >= 0, got {args.max_new_tokens}")
    if args.temperature < 0:
        p.error(f"--temperature must be >= 0, got {args.temperature}")
    if args.top_k is not None and args.top_k < 1:
        p.error(f"--top_k must be >= 1, got {args.top_k}")
    return args


def sample(args: argparse.Namespace) -> str:
    """The prompt followed by its continuation."""
    model = resolve_model(args.model).to(args.device).eval()
    tokenizer = resolve_tokenizer(args.model)
    ids = tokenizer(args.prompt).input_ids
    if not ids:  # an empty prompt: start from end-of-text, as GPT-2 does for unconditional samples
        ids = [tokenizer.eos_token_id]
    input_ids = torch.tensor([ids], dtype=torch.long, device=args.device)  # (1, T)
    generator = None
    if args.seed is not None:
        generator = torch.Generator(device=args.device).manual_seed(args.seed)
    out = model.generate(input_ids, args.max_new_tokens, args.temperature, args.top_k, generator)
    # Decode only the new tokens: the prompt is printed as typed, not as the tokenizer round-trips it.
    return args.prompt + tokenizer.decode(out[0, len(ids) :].tolist())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import transformers

    from data.errors import DataError

    # Loading a model draws progress bars on stderr; for a command that prints one sample they are noise.
    transformers.utils.logging.disable_progress_bar()
    try:
        text = sample(args)
    except (ValueError, OSError, DataError) as exc:
        # Bad paths, folders that are not models, configs we cannot load: the user's to fix, so one line.
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(text)
    return 0


if __name__ == "__main__":
    run_main(main)
