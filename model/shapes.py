"""The model's parameter shapes and training FLOPs, computed from its config alone (no tensor is built).

model/gpt2.py's MFU and the planner's memory and speed model both read them here, so the planner never
copies the model's layout; tests/test_model.py holds these shapes to the built model's own.
"""

from __future__ import annotations

import math

from model.config import GPT2Config

# The token embedding, which the tied output head shares.
WTE = "transformer.wte.weight"
WPE = "transformer.wpe.weight"


def parameter_shapes(cfg: GPT2Config) -> dict[str, tuple[int, ...]]:
    """Every parameter tensor of model/gpt2.py by name, in its order; the tied lm_head.weight is WTE."""
    C, H = cfg.n_embd, cfg.mlp_size
    shapes: dict[str, tuple[int, ...]] = {WTE: (cfg.vocab_size, C), WPE: (cfg.n_positions, C)}
    for i in range(cfg.n_layer):
        block = {
            "ln_1.weight": (C,),
            "ln_1.bias": (C,),
            "attn.c_attn.weight": (3 * C, C),
            "attn.c_attn.bias": (3 * C,),
            "attn.c_proj.weight": (C, C),
            "attn.c_proj.bias": (C,),
            "ln_2.weight": (C,),
            "ln_2.bias": (C,),
            "mlp.c_fc.weight": (H, C),
            "mlp.c_fc.bias": (H,),
            "mlp.c_proj.weight": (C, H),
            "mlp.c_proj.bias": (C,),
        }
        shapes.update({f"transformer.h.{i}.{name}": shape for name, shape in block.items()})
    shapes["transformer.ln_f.weight"] = (C,)
    shapes["transformer.ln_f.bias"] = (C,)
    return shapes


def total_parameters(cfg: GPT2Config) -> int:
    """Every parameter of the model once (the tied output head is the token embedding)."""
    return sum(math.prod(s) for s in parameter_shapes(cfg).values())


def flops_per_token(cfg: GPT2Config, seq_len: int) -> float:
    """Training FLOPs (forward and backward) per token: 6*N + 12*L*H*Q*T.

    N is the parameter count without position embeddings, L the layers, H the heads, Q the head size, T the
    sequence length. 6*N is 2 FLOPs per multiply-add per parameter forward, twice that backward (a position
    lookup costs no multiply-adds, while the tied token embedding still does, as lm_head); 12*L*H*Q*T is the
    attention scores and weighted sum, which no parameter accounts for. This is the estimate of the PaLM paper
    (Chowdhery et al. 2022, appendix B) as used by nanoGPT's `estimate_mfu`.
    """
    n = total_parameters(cfg) - math.prod(parameter_shapes(cfg)[WPE])
    return float(6 * n + 12 * cfg.n_layer * cfg.n_head * cfg.head_size * seq_len)
