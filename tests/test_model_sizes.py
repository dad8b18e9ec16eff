"""The GPT-2 family's presets against transformers' GPT2LMHeadModel: the same parameter counts, and weights
that move both ways at the widest preset's shape."""

import pytest
import torch
import transformers

from model import GPT2, GPT2Config
from model.hf import from_hf, save_hf
from model.shapes import total_parameters
from training.config import preset_overrides

# transformers' GPT2LMHeadModel(GPT2Config(n_layer, n_embd, n_head)).num_parameters() for GPT-2's sizes.
HF_PARAMETERS = {"gpt2-medium": 354_823_168, "gpt2-large": 774_030_080, "gpt2-xl": 1_557_611_200}


def unique_numel(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() lists the tied head once


@pytest.mark.parametrize("preset", list(HF_PARAMETERS))
def test_training_preset_counts_the_parameters_transformers_does(preset):
    cfg = GPT2Config.from_preset(preset_overrides(preset)["model_preset"])
    with torch.device("meta"):  # full size, nothing allocated
        ours, theirs = GPT2(cfg), transformers.GPT2LMHeadModel(cfg.to_hf_config())
    assert unique_numel(ours) == unique_numel(theirs) == HF_PARAMETERS[preset] == total_parameters(cfg)


def test_the_widest_preset_exports_and_loads_both_ways(tmp_path):
    """gpt2-xl's width and 25 heads in one block (a short vocabulary and position table keep it cheap; they
    are the 124M tests' shapes): ours -> a transformers folder with the same logits, and back."""
    cfg = GPT2Config.from_preset("gpt2-xl", n_layer=1, vocab_size=512, n_positions=64)
    torch.manual_seed(0)
    ours = GPT2(cfg).eval()
    save_hf(ours, tmp_path / "hf")
    theirs = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf", local_files_only=True).eval()
    x = torch.randint(0, cfg.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(x)[0], theirs(x).logits, rtol=0, atol=1e-4)
        back = from_hf(theirs).eval()
        assert back.config == cfg
        torch.testing.assert_close(back(x)[0], theirs(x).logits, rtol=0, atol=1e-4)
