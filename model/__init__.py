"""A from-scratch GPT-2 that exchanges weights with transformers' GPT2LMHeadModel."""

from model.config import GPT2Config, preset_names
from model.gpt2 import GPT2, GPT2Block
from model.hf import from_hf, save_hf

__all__ = ["GPT2", "GPT2Block", "GPT2Config", "from_hf", "preset_names", "save_hf"]
