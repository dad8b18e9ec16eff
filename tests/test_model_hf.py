"""Our GPT2 against transformers' GPT2LMHeadModel: same weights, same numbers, both directions."""

import os

import pytest
import torch
import transformers

from data.tokenizer import load_tokenizer
from model import GPT2, GPT2Config
from model.hf import from_hf, hf_to_our_state_dict, save_hf

TINY = GPT2Config.from_preset("tiny")


def hf_model(cfg: GPT2Config, attn_implementation: str = "eager") -> transformers.GPT2LMHeadModel:
    """transformers' GPT-2 with its own random init, dropout off."""
    torch.manual_seed(0)
    hf_cfg = transformers.GPT2Config(
        vocab_size=cfg.vocab_size,
        n_positions=cfg.n_positions,
        n_embd=cfg.n_embd,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        attn_implementation=attn_implementation,
    )
    return transformers.GPT2LMHeadModel(hf_cfg).eval()


def ids(B: int, T: int) -> torch.Tensor:
    return torch.randint(0, TINY.vocab_size, (B, T), generator=torch.Generator().manual_seed(0))


def shifted(x: torch.Tensor) -> torch.Tensor:
    """Our targets for HF's labels=x: the next token, and nothing to predict after the last."""
    return torch.cat([x[:, 1:], torch.full_like(x[:, :1], -100)], dim=1)


@pytest.fixture(scope="module")
def tiny_hf():
    return hf_model(TINY)


def assert_same_logits(ours: GPT2, theirs: transformers.GPT2LMHeadModel, x: torch.Tensor) -> None:
    with torch.no_grad():
        logits, _ = ours.eval()(x)
        ref = theirs.eval()(x).logits
    torch.testing.assert_close(logits, ref, rtol=0, atol=1e-5)


# ---- parity ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("hf_attn", ["eager", "sdpa"])
@pytest.mark.parametrize("attn_impl", ["sdpa", "math"])
def test_tiny_logits_match_transformers(hf_attn, attn_impl):
    theirs = hf_model(TINY, hf_attn)
    ours = from_hf(theirs, attn_impl=attn_impl)
    assert_same_logits(ours, theirs, ids(2, 24))


@pytest.mark.parametrize("attn_impl", ["sdpa", "math"])
def test_tiny_loss_matches_transformers_labels(tiny_hf, attn_impl):
    ours = from_hf(tiny_hf, attn_impl=attn_impl).eval()
    x = ids(2, 24)
    with torch.no_grad():
        _, loss = ours(x, shifted(x))
        ref = tiny_hf(x, labels=x).loss
    torch.testing.assert_close(loss, ref, rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def gpt2_hf():
    return hf_model(GPT2Config())


@pytest.mark.parametrize("attn_impl", ["sdpa", "math"])
def test_124m_logits_and_loss_match_transformers(gpt2_hf, attn_impl):
    ours = from_hf(gpt2_hf, attn_impl=attn_impl).eval()
    assert ours.num_parameters() == 124_439_808
    x = ids(1, 12)
    with torch.no_grad():
        logits, loss = ours(x, shifted(x))
        ref = gpt2_hf(x, labels=x)
    torch.testing.assert_close(logits, ref.logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(loss, ref.loss, rtol=0, atol=1e-5)


def test_our_state_dict_keys_are_transformers_keys(tiny_hf):
    assert set(GPT2(TINY).state_dict()) == set(tiny_hf.state_dict())


# ---- from_hf sources -------------------------------------------------------------------------------


def test_from_hf_reads_a_bare_state_dict_with_unprefixed_keys_and_mask_buffers(tiny_hf):
    # GPT2Model's keys lack "transformer." and older transformers kept causal masks in the state dict
    sd = dict(tiny_hf.transformer.state_dict())
    for i in range(TINY.n_layer):
        sd[f"h.{i}.attn.bias"] = torch.ones(1, 1, TINY.n_positions, TINY.n_positions, dtype=torch.bool).tril()
        sd[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    ours = from_hf(sd, config=TINY)
    assert_same_logits(ours, tiny_hf, ids(2, 8))
    assert ours.lm_head.weight.data_ptr() == ours.transformer.wte.weight.data_ptr()


def test_from_hf_needs_a_config_with_a_state_dict(tiny_hf):
    with pytest.raises(ValueError, match="pass config="):
        from_hf(tiny_hf.state_dict())


def test_from_hf_refuses_untied_embeddings(tiny_hf):
    sd = dict(tiny_hf.state_dict())
    sd["lm_head.weight"] = torch.zeros_like(sd["lm_head.weight"])
    with pytest.raises(ValueError, match="only tied embeddings"):
        hf_to_our_state_dict(sd)


def test_from_hf_on_a_missing_folder_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such folder"):
        from_hf(tmp_path / "nope")
    with pytest.raises(ValueError, match="no config.json"):
        from_hf(tmp_path)


# ---- export ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_ours():
    torch.manual_seed(1)
    return GPT2(TINY).eval()


@pytest.fixture(scope="module")
def exported(tiny_ours, tmp_path_factory):
    folder = tmp_path_factory.mktemp("export") / "hf"
    save_hf(tiny_ours, folder, tokenizer=load_tokenizer())
    return folder


def test_saved_folder_loads_in_transformers_with_the_same_logits(tiny_ours, exported):
    theirs = transformers.GPT2LMHeadModel.from_pretrained(exported, local_files_only=True)
    assert_same_logits(tiny_ours, theirs, ids(2, 16))
    assert theirs.lm_head.weight.data_ptr() == theirs.transformer.wte.weight.data_ptr()


def test_saved_folder_loads_back_with_the_same_logits_and_tied_weights(tiny_ours, exported):
    back = from_hf(exported).eval()
    assert back.config == TINY
    x = ids(2, 16)
    with torch.no_grad():
        torch.testing.assert_close(back(x)[0], tiny_ours(x)[0], rtol=0, atol=1e-6)
    assert back.lm_head.weight.data_ptr() == back.transformer.wte.weight.data_ptr()


def test_text_generation_pipeline_samples_from_the_saved_folder(exported):
    pipe = transformers.pipeline("text-generation", model=str(exported), tokenizer=str(exported), device="cpu")
    out = pipe("Hello, my name is", max_new_tokens=4, do_sample=False)
    text = out[0]["generated_text"]
    assert text.startswith("Hello, my name is") and len(text) > len("Hello, my name is")


def test_save_replaces_an_existing_export(tmp_path):
    folder = tmp_path / "hf"
    save_hf(GPT2(TINY), folder)
    torch.manual_seed(2)
    second = GPT2(TINY).eval()
    save_hf(second, folder)
    assert_same_logits(second, transformers.GPT2LMHeadModel.from_pretrained(folder), ids(1, 8))
    assert os.listdir(tmp_path) == ["hf"]  # nothing left beside it


def test_failed_save_leaves_the_existing_export_untouched(tmp_path):
    folder = tmp_path / "hf"
    save_hf(GPT2(TINY), folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    class BrokenTokenizer:
        def save_pretrained(self, path):
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        save_hf(GPT2(TINY), folder, tokenizer=BrokenTokenizer())
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert os.listdir(tmp_path) == ["hf"]
