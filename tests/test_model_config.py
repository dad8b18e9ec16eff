import json

import pytest

from model import GPT2Config, preset_names


def test_default_is_gpt2_small_with_head_size_64():
    cfg = GPT2Config()
    assert (cfg.vocab_size, cfg.n_positions, cfg.n_embd, cfg.n_layer, cfg.n_head) == (50257, 1024, 768, 12, 12)
    assert cfg.head_size == 64
    assert cfg.mlp_size == 4 * 768


def test_presets_have_the_documented_sizes():
    assert {"gpt2", "gpt2-medium", "tiny", "mini"} <= set(preset_names())
    assert GPT2Config.from_preset("gpt2") == GPT2Config()
    medium = GPT2Config.from_preset("gpt2-medium")
    assert (medium.n_layer, medium.n_head, medium.n_embd) == (24, 16, 1024)
    tiny = GPT2Config.from_preset("tiny")
    assert (tiny.vocab_size, tiny.n_layer, tiny.n_head, tiny.n_embd, tiny.n_positions) == (50257, 2, 2, 64, 256)
    mini = GPT2Config.from_preset("mini")
    assert (mini.n_layer, mini.n_head, mini.n_embd, mini.n_positions) == (4, 4, 128, 512)


def test_every_preset_is_a_valid_config():
    from model.config import _PRESETS

    for name in preset_names():
        cfg = GPT2Config.from_preset(name)
        # The preset's sizes are the config's, and they split into whole heads.
        assert {key: getattr(cfg, key) for key in _PRESETS[name]} == _PRESETS[name], name
        assert cfg.head_size * cfg.n_head == cfg.n_embd, name
        assert cfg.n_positions >= 1 and cfg.vocab_size >= 1 and cfg.n_layer >= 1, name
        # Built again from its own fields, it passes validation and is the same config.
        assert GPT2Config(**cfg.to_dict()) == cfg, name


def test_preset_overrides_apply_on_top():
    cfg = GPT2Config.from_preset("tiny", attn_impl="math", resid_pdrop=0.1)
    assert (cfg.n_embd, cfg.attn_impl, cfg.resid_pdrop) == (64, "math", 0.1)


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown model preset 'huge'.*tiny"):
        GPT2Config.from_preset("huge")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n_embd=100, n_head=12), "divisible by n_head"),
        (dict(n_layer=0), "n_layer must be a positive integer"),
        (dict(vocab_size=-1), "vocab_size must be a positive integer"),
        (dict(n_inner=0), "n_inner"),
        (dict(attn_pdrop=1.0), r"attn_pdrop .*\[0, 1\)"),
        (dict(embd_pdrop=-0.1), "embd_pdrop"),
        (dict(attn_impl="flash"), "attn_impl must be one of sdpa, math"),
    ],
)
def test_invalid_config_raises_a_clear_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GPT2Config(**kwargs)


def test_dict_round_trip_through_json():
    cfg = GPT2Config.from_preset("mini", n_inner=300, attn_impl="math", attn_pdrop=0.1)
    assert GPT2Config.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_from_dict_rejects_unknown_fields():
    with pytest.raises(ValueError, match="unknown GPT2Config field.*block_size"):
        GPT2Config.from_dict({**GPT2Config().to_dict(), "block_size": 1024})


def test_hf_config_round_trip():
    cfg = GPT2Config.from_preset("mini", n_inner=300, embd_pdrop=0.1, attn_impl="math")
    hf_cfg = cfg.to_hf_config()
    assert hf_cfg.activation_function == "gelu_new" and hf_cfg.tie_word_embeddings
    assert hf_cfg._attn_implementation == "eager"  # the same computation as our "math" path
    assert GPT2Config.from_hf_config(hf_cfg) == cfg


def test_from_hf_config_refuses_what_the_model_does_not_implement():
    hf_cfg = GPT2Config.from_preset("tiny").to_hf_config()
    hf_cfg.activation_function = "relu"
    with pytest.raises(ValueError, match="activation_function='relu' is not supported"):
        GPT2Config.from_hf_config(hf_cfg)
