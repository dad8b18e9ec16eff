import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from model import GPT2, GPT2Block, GPT2Config

TINY = GPT2Config.from_preset("tiny")


def tiny_model(**overrides) -> GPT2:
    torch.manual_seed(0)
    return GPT2(GPT2Config.from_preset("tiny", **overrides)).eval()


def random_ids(B: int, T: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, TINY.vocab_size, (B, T), generator=torch.Generator().manual_seed(seed))


def default_model_on_meta() -> GPT2:
    # Shapes without storage: counting 124M parameters needs no memory and no init time.
    with torch.device("meta"):
        return GPT2(GPT2Config())


# ---- structure and size ----------------------------------------------------------------------------


def test_default_config_has_124_439_808_parameters():
    assert default_model_on_meta().num_parameters() == 124_439_808


def test_parameter_count_without_position_embeddings():
    assert default_model_on_meta().num_parameters(exclude_position_embeddings=True) == 124_439_808 - 1024 * 768


def test_flops_per_token_is_6n_plus_attention_term():
    cfg = GPT2Config()
    V, P, C, L, T = cfg.vocab_size, cfg.n_positions, cfg.n_embd, cfg.n_layer, cfg.n_positions
    # Parameters without position embeddings, counted from the architecture rather than the model:
    # tied token embedding, per block 2 LayerNorms + qkv + attention proj + MLP, final LayerNorm.
    per_block = 2 * 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + (C * 4 * C + 4 * C) + (4 * C * C + C)
    N = V * C + L * per_block + 2 * C
    Q = C // cfg.n_head
    model = default_model_on_meta()
    assert model.flops_per_token() == 6 * N + 12 * L * cfg.n_head * Q * T
    assert model.flops_per_token(seq_len=128) == 6 * N + 12 * L * cfg.n_head * Q * 128
    assert N + P * C == model.num_parameters()  # the independent count agrees with the model's


def test_module_names_match_transformers():
    names = {name for name, _ in tiny_model().named_parameters(remove_duplicate=False)}
    expected = {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight", "lm_head.weight"}
    for sub in ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"):
        expected |= {f"transformer.h.1.{sub}.weight", f"transformer.h.1.{sub}.bias"}
    assert expected <= names
    assert "lm_head.bias" not in names


def test_no_split_modules_names_the_block_class():
    # accelerate's FSDP auto-wrap looks these class names up; a name that matches nothing wraps nothing.
    model = tiny_model()
    assert GPT2._no_split_modules == ["GPT2Block"]
    assert sum(type(m).__name__ == "GPT2Block" for m in model.modules()) == TINY.n_layer
    assert all(isinstance(b, GPT2Block) for b in model.transformer.h)


def test_math_attention_keeps_no_mask_in_the_state_dict():
    math_keys = set(tiny_model(attn_impl="math").state_dict())
    assert math_keys == set(tiny_model().state_dict())
    assert not any("mask" in k or k.endswith(".attn.bias") for k in math_keys)


def test_lm_head_shares_storage_with_token_embedding():
    model = tiny_model()
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
    assert model.lm_head.weight is model.transformer.wte.weight


# ---- initialisation --------------------------------------------------------------------------------


def assert_normal(t: torch.Tensor, std: float) -> None:
    """Sample mean and std of `t` within 6 standard errors of N(0, std)."""
    n = t.numel()
    assert abs(t.mean().item()) < 6 * std / math.sqrt(n)
    # the standard error of a sample std is about std / sqrt(2n)
    assert t.std().item() == pytest.approx(std, abs=6 * std / math.sqrt(2 * n))


def test_weights_are_normal_with_scaled_residual_projections():
    model = tiny_model()
    residual_std = 0.02 / math.sqrt(2 * TINY.n_layer)
    matrices = {name: p for name, p in model.named_parameters() if p.dim() == 2}
    assert len(matrices) == 2 + 4 * TINY.n_layer  # wte (= lm_head), wpe, four Linear per block
    for name, p in matrices.items():
        assert_normal(p, residual_std if name.endswith("c_proj.weight") else 0.02)


def test_biases_are_zero_and_layernorms_identity():
    model = tiny_model()
    for module in model.modules():
        if isinstance(module, nn.LayerNorm):
            assert torch.all(module.weight == 1) and torch.all(module.bias == 0)
        elif isinstance(module, nn.Linear) and module.bias is not None:
            assert torch.all(module.bias == 0)


# ---- forward ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("attn_impl", ["sdpa", "math"])
def test_changing_a_token_changes_only_later_logits(attn_impl):
    model = tiny_model(attn_impl=attn_impl)
    ids = random_ids(2, 16)
    changed = ids.clone()
    t = 9
    changed[:, t] = (changed[:, t] + 1) % TINY.vocab_size
    with torch.no_grad():
        before, _ = model(ids)
        after, _ = model(changed)
    torch.testing.assert_close(after[:, :t], before[:, :t], rtol=0, atol=1e-6)
    for pos in range(t, 16):
        assert (after[:, pos] - before[:, pos]).abs().max() > 1e-4


def test_sdpa_and_math_attention_agree():
    ids = random_ids(2, 32)
    with torch.no_grad():
        sdpa, _ = tiny_model(attn_impl="sdpa")(ids)
        math_, _ = tiny_model(attn_impl="math")(ids)
    torch.testing.assert_close(sdpa, math_, rtol=0, atol=1e-5)


def test_loss_is_mean_cross_entropy_over_non_ignored_targets():
    model = tiny_model()
    ids = random_ids(2, 12)
    targets = random_ids(2, 12, seed=1)
    targets[0, :5] = -100
    targets[1, -1] = -100
    logits, loss = model(ids, targets)
    keep = targets != -100
    logp = F.log_softmax(logits, dim=-1)[keep]  # (kept, V)
    manual = -logp.gather(1, targets[keep].unsqueeze(1)).mean()
    torch.testing.assert_close(loss, manual)


def test_loss_is_float32_for_a_bf16_model():
    # FSDP with bf16 parameters hands the loss bf16 logits; the loss must not be rounded to bf16.
    model = tiny_model().to(torch.bfloat16)
    ids, targets = random_ids(2, 12), random_ids(2, 12, seed=1)
    logits, loss = model(ids, targets)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    exact = F.cross_entropy(logits.double().view(24, -1), targets.view(24))
    assert abs(loss.double() - exact) < 1e-5
    bf16_loss = F.cross_entropy(logits.view(24, -1), targets.view(24))
    assert bf16_loss.dtype == torch.bfloat16 and abs(bf16_loss.double() - exact) > 1e-4


def test_loss_honours_a_custom_ignore_index():
    model = tiny_model()
    ids = random_ids(1, 8)
    targets = random_ids(1, 8, seed=1)
    _, full = model(ids[:, :4], targets[:, :4])
    targets[:, 4:] = 7
    _, cut = model(ids, targets, ignore_index=7)
    # positions 4..7 ignored; causality makes logits at 0..3 the same as for the 4-token prefix
    torch.testing.assert_close(cut, full, rtol=0, atol=1e-6)


def test_no_targets_means_no_loss():
    logits, loss = tiny_model()(random_ids(2, 5))
    assert logits.shape == (2, 5, TINY.vocab_size) and loss is None


def test_sequence_longer_than_n_positions_raises():
    with pytest.raises(ValueError, match="longer than the model's n_positions=256"):
        tiny_model()(random_ids(1, TINY.n_positions + 1))


def test_dropout_is_configurable_and_off_in_eval():
    model = tiny_model(embd_pdrop=0.1, attn_pdrop=0.1, resid_pdrop=0.1)
    ids = random_ids(1, 8)
    with torch.no_grad():
        model.train()
        a, b = model(ids)[0], model(ids)[0]
        model.eval()
        c, d = model(ids)[0], model(ids)[0]
    assert not torch.equal(a, b)
    assert torch.equal(c, d)


# ---- generation ------------------------------------------------------------------------------------


def test_generate_returns_prompt_plus_exactly_max_new_tokens():
    model = tiny_model()
    prompt = random_ids(2, 5)
    out = model.generate(prompt, 7, generator=torch.Generator().manual_seed(0))
    assert out.shape == (2, 12)
    assert torch.equal(out[:, :5], prompt)
    assert torch.equal(model.generate(prompt, 0), prompt)


def test_same_seed_same_sample_different_seed_different_sample():
    model = tiny_model()
    prompt = random_ids(1, 4)

    def sample(seed):
        return model.generate(prompt, 20, temperature=1.0, generator=torch.Generator().manual_seed(seed))

    assert torch.equal(sample(1), sample(1))
    assert not torch.equal(sample(1), sample(2))


def test_temperature_zero_is_greedy_argmax():
    model = tiny_model()
    ids = random_ids(2, 3)
    out = model.generate(ids, 6, temperature=0.0)
    with torch.no_grad():
        for _ in range(6):
            next_id = model(ids)[0][:, -1].argmax(dim=-1, keepdim=True)
            ids = torch.cat([ids, next_id], dim=1)
    assert torch.equal(out, ids)


def test_top_k_one_is_greedy():
    model = tiny_model()
    prompt = random_ids(2, 3)
    sampled = model.generate(prompt, 5, temperature=1.0, top_k=1, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sampled, model.generate(prompt, 5, temperature=0.0))


def test_top_k_samples_only_among_the_k_most_likely():
    model = tiny_model()
    prompt = random_ids(1, 3)
    with torch.no_grad():
        top5 = set(model(prompt)[0][0, -1].topk(5).indices.tolist())
    gen = torch.Generator().manual_seed(0)
    drawn = {model.generate(prompt, 1, top_k=5, generator=gen)[0, -1].item() for _ in range(30)}
    assert drawn <= top5 and len(drawn) > 1


def test_generate_crops_the_context_to_n_positions():
    model = tiny_model()
    prompt = random_ids(1, TINY.n_positions + 10)
    out = model.generate(prompt, 1, temperature=0.0)
    with torch.no_grad():
        expected = model(prompt[:, -TINY.n_positions :])[0][:, -1].argmax(dim=-1)
    assert out.shape == (1, TINY.n_positions + 11)
    assert torch.equal(out[:, -1], expected)


@pytest.mark.parametrize(
    "kwargs, match",
    [(dict(max_new_tokens=-1), "max_new_tokens"), (dict(temperature=-1.0), "temperature"), (dict(top_k=0), "top_k")],
)
def test_generate_rejects_bad_arguments(kwargs, match):
    args = dict(max_new_tokens=1) | kwargs
    with pytest.raises(ValueError, match=match):
        tiny_model().generate(random_ids(1, 2), **args)
