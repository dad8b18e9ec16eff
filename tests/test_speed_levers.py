"""The speed levers: what `auto` resolves to on each device, refusals, and that each lever does its job."""

from __future__ import annotations

import pytest
import torch

from training.config import SpeedConfig
from training.distributed.speed_levers import (
    DeviceInfo,
    compile_blocks,
    decide_compile,
    decide_fused_adamw,
    decide_levers,
    decide_tf32,
)

CPU = DeviceInfo("cpu")
T4 = DeviceInfo("cuda", (7, 5))
A100 = DeviceInfo("cuda", (8, 0))
H200 = DeviceInfo("cuda", (9, 0))


def test_compile_is_off_by_default_on_cpu_and_t4_with_a_one_line_reason() -> None:
    for device in (CPU, T4):
        on, reason = decide_compile("auto", device)
        assert not on and reason.startswith("auto: off") and "\n" not in reason
    assert "slower than eager" in decide_compile("auto", CPU)[1]
    assert decide_compile("auto", A100)[0] and decide_compile("auto", H200)[0]
    assert decide_compile("on", CPU) == (True, "--compile on")  # asked for explicitly, e.g. to measure it
    assert decide_compile("off", H200)[0] is False


def test_help_says_why_compile_is_off_on_cpu() -> None:
    from training.cli import build_parser

    text = " ".join(build_parser().format_help().split())
    assert "--compile" in text and "off on CPU, where the compiled step measured slower than eager" in text
    assert "T4/sm75" in text


def test_fused_adamw_is_chosen_only_where_supported() -> None:
    assert decide_fused_adamw("auto", H200)[0] and decide_fused_adamw("auto", T4)[0]
    assert not decide_fused_adamw("auto", CPU)[0]
    assert decide_fused_adamw("on", CPU)[0]  # PyTorch has a fused CPU kernel
    with pytest.raises(ValueError, match="no fused AdamW for meta"):
        decide_fused_adamw("on", DeviceInfo("meta"))


def test_fused_adamw_is_what_the_optimizer_gets() -> None:
    from model import GPT2, GPT2Config
    from training.config import OptimConfig
    from training.step import make_optimizer

    model = GPT2(GPT2Config.from_preset("tiny"))
    assert make_optimizer(model, OptimConfig(), fused=True).defaults["fused"] is True
    assert not make_optimizer(model, OptimConfig()).defaults["fused"]


def test_tf32_only_on_ampere_and_newer() -> None:
    assert decide_tf32("auto", A100)[0] and decide_tf32("auto", H200)[0]
    assert not decide_tf32("auto", T4)[0] and not decide_tf32("auto", CPU)[0]
    with pytest.raises(ValueError, match="--tf32 on needs a CUDA GPU of compute capability 8.0"):
        decide_tf32("on", CPU)


def test_activation_checkpointing_goes_to_fsdp_under_fsdp_and_to_the_model_otherwise() -> None:
    on = SpeedConfig(activation_checkpointing=True)
    assert decide_levers(on, 0, CPU, "single").activation_checkpointing == "model"
    assert decide_levers(on, 0, CPU, "ddp").activation_checkpointing == "model"
    for strategy in ("fsdp", "fsdp_zero2", "fsdp_offload"):
        assert decide_levers(on, 0, CPU, strategy).activation_checkpointing == "fsdp"
    assert decide_levers(SpeedConfig(), 0, CPU, "single").activation_checkpointing == "off"
    assert decide_levers(SpeedConfig(), 2, CPU, "single").pin_memory is False  # pinning needs CUDA
    assert decide_levers(SpeedConfig(), 2, H200, "single").pin_memory is True


def test_bad_lever_values_are_one_line_errors() -> None:
    with pytest.raises(ValueError, match=r"^--compile must be auto, on or off, got 'yes'$"):
        SpeedConfig(compile="yes")


def _loss_and_grads(checkpointing: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
    from model import GPT2, GPT2Config

    torch.manual_seed(0)
    # Dropout on: the recompute must draw the same masks as the forward.
    model = GPT2(GPT2Config.from_preset("tiny", embd_pdrop=0.1, attn_pdrop=0.1, resid_pdrop=0.1)).train()
    model.activation_checkpointing = checkpointing
    calls = []
    model.transformer.h[0].register_forward_pre_hook(lambda *_: calls.append(1))
    tokens = torch.randint(0, model.config.vocab_size, (4, 32), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(2)
    _, loss = model(tokens[:, :-1], tokens[:, 1:])
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}, len(calls)


def test_activation_checkpointing_gives_the_same_loss_and_gradients() -> None:
    loss, grads, calls = _loss_and_grads(checkpointing=False)
    loss_ac, grads_ac, calls_ac = _loss_and_grads(checkpointing=True)
    assert (calls, calls_ac) == (1, 2)  # the block really ran again in backward
    torch.testing.assert_close(loss_ac, loss, rtol=0, atol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(grads_ac[name], grad, rtol=1e-6, atol=1e-7, msg=name)


def test_compiling_blocks_keeps_the_module_tree_and_parameter_names() -> None:
    from model import GPT2, GPT2Config

    model = GPT2(GPT2Config.from_preset("tiny"))
    names = list(model.state_dict())
    compile_blocks(model.transformer.h)
    assert list(model.state_dict()) == names
    assert all(type(b).__name__ == "GPT2Block" for b in model.transformer.h)
    assert all("forward" in vars(b) for b in model.transformer.h)  # the instance's forward is the compiled one


def test_lever_flags_reach_the_config() -> None:
    from training.cli import parse_config

    cfg = parse_config(
        ["--activation_checkpointing", "--compile", "off", "--fused_adamw", "on", "--tf32", "off", "--no-pin_memory"]
    )
    assert cfg.speed == SpeedConfig(
        compile="off", activation_checkpointing=True, fused_adamw="on", tf32="off", pin_memory=False
    )
    assert cfg.to_dict()["speed"]["activation_checkpointing"] is True


def test_compiled_blocks_share_one_graph_and_compute_what_eager_does() -> None:
    import torch._dynamo
    from torch._dynamo.utils import counters

    from model import GPT2, GPT2Config

    torch.manual_seed(0)
    model = GPT2(GPT2Config(n_layer=12, n_embd=64, n_head=2))  # more blocks than dynamo's recompile limit (8)
    tokens = torch.randint(0, 50257, (2, 16), generator=torch.Generator().manual_seed(1))
    _, eager = model(tokens, tokens)
    torch._dynamo.reset()
    counters.clear()
    compile_blocks(model.transformer.h, backend="eager")  # dynamo's capture without code generation: fast
    _, compiled = model(tokens, tokens)
    assert counters["stats"]["unique_graphs"] == 1
    torch.testing.assert_close(compiled, eager)
    torch._dynamo.reset()
