"""GPT-2, written out so it can be read top to bottom.

Module and parameter names are those of transformers' `GPT2LMHeadModel` (`transformer.h.0.attn.c_attn`
and so on) so that weights move between the two by name; model/hf.py does the moving (`from_hf`, `save_hf`). Unlike
transformers, the projections are `nn.Linear`, whose weight is the transpose of its `Conv1D`.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from model.config import GPT2Config
from model.shapes import flops_per_token


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPT2Config):
        super().__init__()
        self.n_head = config.n_head
        self.attn_impl = config.attn_impl
        self.attn_pdrop = config.attn_pdrop
        # query, key and value for all heads in one matmul
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.attn_dropout = nn.Dropout(config.attn_pdrop)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)  # 3 x (B, T, C)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        if self.attn_impl == "sdpa":
            dropout_p = self.attn_pdrop if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))  # (B, nh, T, T)
            # Built per call rather than kept as a buffer: it costs next to nothing beside the matmuls,
            # and a buffer would have to be kept out of the state dict and moved and sharded with the model.
            causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~causal, float("-inf"))
            att = self.attn_dropout(F.softmax(att, dim=-1))
            y = att @ v  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # heads side by side again: (B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPT2Config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, config.mlp_size)
        # GPT-2 was trained with the tanh approximation (transformers' "gelu_new"); exact GELU differs slightly.
        self.act = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(config.mlp_size, config.n_embd)
        self.dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class GPT2Block(nn.Module):
    """One transformer block. Pre-LayerNorm: each sublayer sees a normalised copy, the residual stream does not."""

    def __init__(self, config: GPT2Config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT2(nn.Module):
    # Read by accelerate's FSDP auto-wrap (and by transformers-style device maps): each block becomes
    # one FSDP unit. A policy that names a class the model lacks wraps nothing, without a warning.
    _no_split_modules = ["GPT2Block"]

    def __init__(self, config: GPT2Config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.n_positions, config.n_embd),
                drop=nn.Dropout(config.embd_pdrop),
                h=nn.ModuleList([GPT2Block(config) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # Weight tying: the output projection is the token embedding, one tensor under two names.
        self.lm_head.weight = self.transformer.wte.weight
        # Recompute each block's activations in backward instead of keeping them (training only); off by
        # default. A training setting, not part of the architecture, so it is not in the config.
        self.activation_checkpointing = False

        self.apply(self._init_weights)
        # GPT-2's scaled init: each block adds two outputs to the residual stream, so the variance of the
        # stream grows with depth unless those projections start smaller by 1/sqrt(2 * n_layer).
        residual_std = config.initializer_range / math.sqrt(2 * config.n_layer)
        for block in self.transformer.h:
            nn.init.normal_(block.attn.c_proj.weight, mean=0.0, std=residual_std)
            nn.init.normal_(block.mlp.c_proj.weight, mean=0.0, std=residual_std)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def forward(
        self, input_ids: torch.Tensor, targets: torch.Tensor | None = None, ignore_index: int = -100
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits for every position and, given targets, the mean next-token cross-entropy.

        input_ids: (B, T) token ids. targets: (B, T), already shifted by the caller (targets[:, t] is
        the token that follows input_ids[:, t]); positions equal to `ignore_index` do not count.
        Returns (logits (B, T, vocab_size), loss or None).
        """
        B, T = input_ids.shape
        if T > self.config.n_positions:
            raise ValueError(f"sequence of length {T} is longer than the model's n_positions={self.config.n_positions}")
        pos = torch.arange(T, dtype=torch.long, device=input_ids.device)  # (T,)
        x = self.transformer.wte(input_ids) + self.transformer.wpe(pos)  # (B, T, C)
        x = self.transformer.drop(x)
        checkpointing = self.activation_checkpointing and self.training and torch.is_grad_enabled()
        for block in self.transformer.h:
            # Non-reentrant checkpointing restores the RNG state for the recompute, so dropout masks match.
            x = checkpoint(block, x, use_reentrant=False) if checkpointing else block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)  # (B, T, vocab_size)
        loss = None
        if targets is not None:
            # In float32 whatever the compute dtype: a log-softmax over 50,257 logits in bf16 rounds the loss
            # by several hundredths of a nat, and FSDP's bf16 parameters (unlike autocast) yield bf16 logits.
            loss = F.cross_entropy(logits.float().view(B * T, -1), targets.reshape(B * T), ignore_index=ignore_index)
        return logits, loss

    def num_parameters(self, exclude_position_embeddings: bool = False) -> int:
        """Number of parameters, the tied embedding counted once.

        Counts the tensors as they are, so call it before FSDP shards the model. With
        `exclude_position_embeddings`, the count that the FLOPs estimate uses (nanoGPT's convention:
        a position lookup costs no multiply-adds, while the tied token embedding still does, as lm_head).
        """
        n = sum(p.numel() for p in self.parameters())  # parameters() yields a shared tensor once
        if exclude_position_embeddings:
            n -= self.transformer.wpe.weight.numel()
        return n

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token at `seq_len` (default n_positions): model/shapes.py's estimate."""
        return flops_per_token(self.config, self.config.n_positions if seq_len is None else seq_len)

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Continue each row of `input_ids` (B, T) by `max_new_tokens` tokens; returns (B, T + max_new_tokens).

        temperature 0 picks the most likely token (greedy); otherwise logits are divided by the
        temperature, cut to the `top_k` most likely tokens if given, and sampled with `generator`.
        The context is cropped to the last n_positions tokens. Put the model in eval mode first if
        it was configured with dropout.
        """
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None, got {top_k}")
        for _ in range(max_new_tokens):
            context = input_ids[:, -self.config.n_positions :]
            logits, _ = self(context)
            logits = logits[:, -1, :]  # (B, vocab_size): only the last position predicts the new token
            if temperature == 0:
                next_id = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]  # (B, 1)
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                probs = F.softmax(logits, dim=-1)
                next_id = torch.multinomial(probs, num_samples=1, generator=generator)  # (B, 1)
            input_ids = torch.cat((input_ids, next_id), dim=1)
        return input_ids
