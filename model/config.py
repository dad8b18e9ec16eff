"""The model's configuration: one dataclass, named presets, and the mapping to transformers' config.

Field names follow `transformers.GPT2Config`, so a value means the same thing on both sides and the
conversion is a rename-free copy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import transformers

ATTN_IMPLS = ("sdpa", "math")

# Presets are overrides of the defaults (which are GPT-2 124M), so each one states only how it differs.
_PRESETS: dict[str, dict[str, Any]] = {
    "gpt2": {},
    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024),
    "gpt2-large": dict(n_layer=36, n_head=20, n_embd=1280),
    "gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600),
    # Small enough to train a step in a fraction of a second on a laptop CPU; the real vocabulary
    # keeps it compatible with the real tokenizer and data.
    "tiny": dict(n_layer=2, n_head=2, n_embd=64, n_positions=256),
    "mini": dict(n_layer=4, n_head=4, n_embd=128, n_positions=512),
}

# Every field but attn_impl has the same name and meaning in transformers.GPT2Config.
_SAME_IN_HF = (
    "vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner", "layer_norm_epsilon",
    "embd_pdrop", "attn_pdrop", "resid_pdrop", "initializer_range",
)  # fmt: skip

# transformers' attention implementations that compute what ours do, and back.
_HF_ATTN = {"sdpa": "sdpa", "math": "eager"}


def preset_names() -> list[str]:
    """The names `GPT2Config.from_preset` accepts."""
    return list(_PRESETS)


@dataclass
class GPT2Config:
    """GPT-2's hyperparameters. The defaults are GPT-2 small (124M parameters, head size 64)."""

    vocab_size: int = 50257
    """Number of token ids; GPT-2's BPE has 50,257 (50,000 merges, 256 bytes, `<|endoftext|>`)."""
    n_positions: int = 1024
    """Longest sequence the model accepts: the number of learned position embeddings."""
    n_embd: int = 768
    """Width of the residual stream (embedding size)."""
    n_layer: int = 12
    """Number of transformer blocks."""
    n_head: int = 12
    """Number of attention heads; each has size n_embd // n_head."""
    n_inner: int | None = None
    """Hidden width of the MLP; None means 4 * n_embd, as in GPT-2."""
    layer_norm_epsilon: float = 1e-5
    """Epsilon of every LayerNorm."""
    embd_pdrop: float = 0.0
    """Dropout on the sum of token and position embeddings."""
    attn_pdrop: float = 0.0
    """Dropout on the attention probabilities."""
    resid_pdrop: float = 0.0
    """Dropout on each block's attention and MLP outputs, before they join the residual stream."""
    initializer_range: float = 0.02
    """Standard deviation of the normal init of weights (residual projections are scaled down)."""
    attn_impl: Literal["sdpa", "math"] = "sdpa"
    """"sdpa": torch's fused scaled_dot_product_attention; "math": the explicit softmax(QK^T/sqrt(d))V,
    slower, kept as a readable reference and for checking the fused path."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"GPT2Config.{name} must be a positive integer, got {value!r}")
        if self.n_inner is not None and (not isinstance(self.n_inner, int) or self.n_inner <= 0):
            raise ValueError(f"GPT2Config.n_inner must be a positive integer or None, got {self.n_inner!r}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(
                f"GPT2Config.n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head}) "
                "so that every head has the same size"
            )
        for name in ("embd_pdrop", "attn_pdrop", "resid_pdrop"):
            p = getattr(self, name)
            if not 0.0 <= p < 1.0:
                raise ValueError(f"GPT2Config.{name} is a dropout probability and must lie in [0, 1), got {p!r}")
        if not self.layer_norm_epsilon > 0:
            raise ValueError(f"GPT2Config.layer_norm_epsilon must be positive, got {self.layer_norm_epsilon!r}")
        if not self.initializer_range > 0:
            raise ValueError(f"GPT2Config.initializer_range must be positive, got {self.initializer_range!r}")
        if self.attn_impl not in ATTN_IMPLS:
            raise ValueError(f"GPT2Config.attn_impl must be one of {', '.join(ATTN_IMPLS)}; got {self.attn_impl!r}")

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    @property
    def mlp_size(self) -> int:
        return self.n_inner if self.n_inner is not None else 4 * self.n_embd

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> GPT2Config:
        """The named preset (see `preset_names()`), with `overrides` applied on top."""
        if name not in _PRESETS:
            raise ValueError(f"unknown model preset {name!r}; known presets: {', '.join(preset_names())}")
        return cls(**{**_PRESETS[name], **overrides})

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict of every field."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GPT2Config:
        """Inverse of `to_dict`; unknown keys are an error rather than silently dropped."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown GPT2Config field(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**d)

    def to_hf_config(self) -> transformers.GPT2Config:
        """The equivalent `transformers.GPT2Config` (tied embeddings, GELU with tanh approximation)."""
        import transformers  # here, not at the top: it takes seconds and only conversion needs it

        return transformers.GPT2Config(
            **{name: getattr(self, name) for name in _SAME_IN_HF},
            activation_function="gelu_new",
            tie_word_embeddings=True,
            attn_implementation=_HF_ATTN[self.attn_impl],
        )

    @classmethod
    def from_hf_config(cls, hf_cfg: transformers.GPT2Config) -> GPT2Config:
        """Our config for a `transformers.GPT2Config`, refusing options our model does not implement."""
        required = {
            "activation_function": (hf_cfg.activation_function, ("gelu_new", "gelu_pytorch_tanh")),
            "scale_attn_weights": (hf_cfg.scale_attn_weights, (True,)),
            "scale_attn_by_inverse_layer_idx": (hf_cfg.scale_attn_by_inverse_layer_idx, (False,)),
            "add_cross_attention": (getattr(hf_cfg, "add_cross_attention", False), (False,)),
            "tie_word_embeddings": (getattr(hf_cfg, "tie_word_embeddings", True), (True,)),
        }
        for name, (value, allowed) in required.items():
            if value not in allowed:
                raise ValueError(f"transformers GPT2Config.{name}={value!r} is not supported (supported: {allowed})")
        hf_attn = getattr(hf_cfg, "_attn_implementation", None)
        return cls(
            **{name: getattr(hf_cfg, name) for name in _SAME_IN_HF},
            attn_impl="math" if hf_attn == "eager" else "sdpa",
        )
