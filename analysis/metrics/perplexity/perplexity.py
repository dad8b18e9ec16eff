"""Perplexity of a Hugging Face causal language model folder, as an `evaluate` metric of the project.

    metric = evaluate.load("analysis/metrics/perplexity")   # this folder: loads offline, never from the hub
    metric.compute(predictions=[[...], ...], model_path="RUN_DIR/hf")   # token blocks
    metric.compute(predictions=["...", ...], model_path="RUN_DIR/hf")   # texts, tokenised by the folder's tokenizer

The input is `predictions`, as in evaluate's own perplexity metric: evaluate tells input formats apart by
their types under one name, not by name.

Every sequence is scored on its own next tokens: the model reads tokens[:-1] and is scored on tokens[1:],
which is what training measures on a packed block of block_size + 1 tokens. The result is the token-weighted
mean cross-entropy in nats (`loss`), its exp (`perplexity`) and the tokens scored (`tokens`).

The file imports nothing of the project: `evaluate.load` copies it into its module cache and imports it from
there, where the project's packages need not be importable.
"""

from __future__ import annotations

import math
from typing import Any

import datasets
import evaluate
import torch
import torch.nn.functional as F
import transformers

_DESCRIPTION = "Token-weighted mean next-token cross-entropy (nats) of a causal LM folder, and its exp."
_KWARGS_DESCRIPTION = """
Args:
    predictions: token sequences (each scored on tokens[1:] given tokens[:-1]), or strings, tokenised
        with the model folder's tokenizer (no special tokens added).
    model_path: a Hugging Face causal LM folder (config.json + weights), loaded offline.
    batch_size: sequences of equal length scored together (default 8).
    device: torch device (default "cpu").
    dtype: torch dtype name of the weights while scoring (default "float32"; "bfloat16" or "float16" as FSDP's
        reduced-precision parameters hold them).
    autocast: torch dtype name to autocast the forward pass to (default None: no autocast), as a mixed-precision
        run validates.
    token_losses: also return every scored token's loss, in order (default False).
Returns:
    loss: mean cross-entropy in nats over all scored tokens; perplexity: exp(loss); tokens: tokens scored;
    token_losses: with token_losses=True, the list of each token's cross-entropy.
"""
# The largest loss whose exp is still a finite float64 (the training loop caps val_ppl the same way).
_MAX_EXP = 700.0


class Perplexity(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        # Two input formats: token blocks (what a run validates on) or texts (anything else).
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=[
                datasets.Features({"predictions": datasets.Sequence(datasets.Value("int64"))}),
                datasets.Features({"predictions": datasets.Value("string")}),
            ],
        )

    def _compute(
        self,
        predictions: list[list[int]] | list[str],
        model_path: str | None = None,
        batch_size: int = 8,
        device: str = "cpu",
        dtype: str = "float32",
        autocast: str | None = None,
        token_losses: bool = False,
    ) -> dict[str, Any]:
        if model_path is None:
            raise ValueError("perplexity needs model_path, a Hugging Face causal LM folder")
        model = (
            transformers.AutoModelForCausalLM.from_pretrained(
                model_path, dtype=getattr(torch, dtype), local_files_only=True
            )
            .to(device)
            .eval()
        )
        sequences = list(predictions)
        if sequences and isinstance(sequences[0], str):
            tokenizer = transformers.AutoTokenizer.from_pretrained(model_path, local_files_only=True)
            sequences = tokenizer(sequences, add_special_tokens=False)["input_ids"]
        windows = _windows(sequences, model.config.n_positions)
        cast = getattr(torch, autocast) if autocast else None
        with torch.autocast(torch.device(device).type, dtype=cast, enabled=cast is not None):
            losses = _score(model, windows, batch_size, device)
        total, tokens = sum(part.double().sum().item() for part in losses), sum(part.numel() for part in losses)
        loss = total / tokens if tokens else float("nan")
        result = {"loss": loss, "perplexity": math.exp(min(loss, _MAX_EXP)), "tokens": tokens}
        if token_losses:
            result["token_losses"] = torch.cat(losses).tolist() if losses else []
        return result


def _windows(sequences: list[list[int]], context: int) -> list[list[int]]:
    """Sequences cut to at most context + 1 tokens, each window starting on the last token of the one before.

    So every next token is scored exactly once, and a sequence that fits (a packed block) is one window.
    """
    windows = []
    for seq in sequences:
        seq = list(seq)
        for start in range(0, max(len(seq) - 1, 0), context):
            windows.append(seq[start : start + context + 1])
    return [w for w in windows if len(w) > 1]


@torch.no_grad()
def _score(model: torch.nn.Module, windows: list[list[int]], batch_size: int, device: str) -> list[torch.Tensor]:
    """Each batch's per-token cross-entropy in float32, flattened (summed in float64 by the caller, so thousands
    of blocks add up without rounding).

    Windows are batched by length, so no padding (and no attention mask) can change a score. The loss is taken
    on float32 logits whatever the forward pass ran in, as training takes it.
    """
    by_length: dict[int, list[list[int]]] = {}
    for w in windows:
        by_length.setdefault(len(w), []).append(w)
    out = []
    for group in by_length.values():
        for i in range(0, len(group), batch_size):
            batch = torch.tensor(group[i : i + batch_size], dtype=torch.long, device=device)
            logits = model(batch[:, :-1]).logits
            # Over contiguous rows of the vocabulary, as training's evaluation takes it (training/step.py).
            losses = F.cross_entropy(
                logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1), reduction="none"
            )
            out.append(losses.float().flatten().cpu())
    return out
