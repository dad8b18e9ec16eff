"""A from-scratch GPT-2 that exchanges weights with transformers' GPT2LMHeadModel."""

from model.config import GPT2Config, preset_names
from model.gpt2 import GPT2, GPT2Block
from model.hf import from_hf, save_hf

# Until training/loop.py calls save_hf(model, folder, ...) it calls the former method; this alias keeps
# that call working. model/gpt2.py itself knows nothing of transformers' format.
GPT2.save_hf = save_hf  # type: ignore[attr-defined]

__all__ = ["GPT2", "GPT2Block", "GPT2Config", "from_hf", "preset_names", "save_hf"]
