"""Attention sinks (gpt-oss) and attention temperature (Llama 4, Scalable-Softmax) in longctx's
model, against float64 references written from the formulas (the sink as one more softmax
column; the temperature position by position, tests/model/designs_reference.py) on sdpa,
varlen and the flash path through the varlen stand-in, forward and backward (the sinks'
gradient included), with sliding windows and packed documents; flex forward; cached
decoding; a training step; transformers' gpt-oss eager attention and Llama 4 temperature."""

from __future__ import annotations

import math

import pytest
import torch

from longctx.config.eval import EvalConfig
from longctx.config.model import ModelConfig
from longctx.config.position_methods import PositionMethodConfig
from longctx.config.temperature import AttentionTemperature
from longctx.errors import ConfigError
from longctx.eval.model_setup import with_eval_temperature
from longctx.model.attention import attention
from longctx.model.inference.prefill import greedy_generate_recompute
from longctx.model.llama import Llama
from longctx.model.position_methods import build_position_method
from longctx.model.temperature import temperature_factor
from tests.helpers import packed_document_ids
from tests.model import varlen_stand_in
from tests.model.designs_reference import allowed, reference_logits
from tests.model.helpers import cached_greedy, random_qkv, stepwise_logits

TOLERANCE = dict(atol=1e-10, rtol=1e-10)
"""float64 on both sides: the kernels and the formula differ in summation order only."""
LSE_TOLERANCE = dict(atol=1e-6, rtol=1e-6)
"""The flash path: the varlen kernel returns its log-sum-exp in fp32 whatever q's dtype (the
stand-in too), so the sink factor sigmoid(lse - s_h) carries ~1e-7 relative error."""
MODEL_TOLERANCE = dict(atol=1e-6, rtol=1e-6)
"""Whole models: the model's RMSNorm computes in float32 by design (~1e-10 measured here)."""


def sink_reference(q, k, v, sinks, document_ids, window):
    """The last Tq keys' queries, pair by pair, softmax over the allowed scores and the sink
    column s_h, the sink's probability dropped (float64)."""
    heads, kv_heads = q.shape[2], k.shape[2]
    k, v = k.repeat_interleave(heads // kv_heads, 2), v.repeat_interleave(heads // kv_heads, 2)
    q_len, kv_len = q.shape[1], k.shape[1]
    mask = allowed(document_ids, window)[:, kv_len - q_len :]
    scores = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    column = sinks.view(1, heads, 1, 1).expand(q.shape[0], heads, q_len, 1)
    probs = torch.cat([scores, column], dim=-1).softmax(-1)[..., :-1]
    return torch.einsum("bhij,bjhd->bihd", probs, v)


def packed_rows(total: int) -> torch.Tensor:
    """Row 0: documents of several lengths (one shorter than the window); row 1: one."""
    return torch.stack([packed_document_ids([7, 3, 20, total - 30])[0], torch.zeros(total, dtype=torch.long)])


def check_forward_and_backward(got_fn, q, k, v, sinks, docs, window, tolerance=TOLERANCE):
    weights = torch.randn(q.shape, dtype=q.dtype)
    got = got_fn()
    expected = sink_reference(q, k, v, sinks, docs, window)
    torch.testing.assert_close(got, expected, **tolerance)
    grads = torch.autograd.grad((got * weights).sum(), (q, k, v, sinks))
    expected_grads = torch.autograd.grad((expected * weights).sum(), (q, k, v, sinks))
    for name, a, b in zip("qkvs", grads, expected_grads, strict=True):
        torch.testing.assert_close(a, b, **tolerance, msg=lambda m, name=name: f"grad {name}: {m}")


@pytest.mark.parametrize("backend", ["sdpa", "varlen", "flash", "flash-2.11"])
@pytest.mark.parametrize("window", [0, 6])
@pytest.mark.parametrize("q_len", [48, 5, 1])
def test_sinks_match_the_reference_forward_and_backward(backend, window, q_len, monkeypatch):
    tolerance = TOLERANCE
    if backend.startswith("flash"):
        varlen_stand_in.install(monkeypatch, "torch-2.11" if backend.endswith("2.11") else "torch-2.14")
        backend, tolerance = "flash", LSE_TOLERANCE
    torch.manual_seed(q_len + window)
    docs = packed_rows(48)
    q, k, v = (t.requires_grad_() for t in random_qkv(2, q_len, 48))
    sinks = torch.randn(4, dtype=torch.float64, requires_grad=True)

    def run():
        return attention(q, k, v, document_ids=docs, backend=backend, window=window, block_size=4, sinks=sinks)

    check_forward_and_backward(run, q, k, v, sinks, docs, window, tolerance)


def test_sinks_on_varlen_long_documents_use_the_causal_kernel_and_keep_their_gradients():
    """Documents of >= SHORT_DOCUMENT tokens go to the fused causal kernel, whose backward
    drops grad_lse: the extra call restores it (q/k gradients would be off otherwise)."""
    torch.manual_seed(1)
    docs = torch.stack([packed_document_ids([270, 30])[0], torch.zeros(300, dtype=torch.long)])
    q, k, v = (t.requires_grad_() for t in random_qkv(2, 300, 300))
    sinks = torch.randn(4, dtype=torch.float64, requires_grad=True)

    def run():
        return attention(q, k, v, document_ids=docs, backend="varlen", sinks=sinks)

    check_forward_and_backward(run, q, k, v, sinks, docs, 0)


@pytest.mark.parametrize("window", [0, 100])
def test_flex_forward_carries_the_sinks(window):
    total = 300
    docs = torch.stack([packed_document_ids([40, 150, 110])[0], torch.zeros(total, dtype=torch.long)])
    q, k, v = random_qkv(2, total, total)
    sinks = torch.randn(4, dtype=torch.float64)
    with torch.no_grad():
        got = attention(q, k, v, document_ids=docs, backend="flex", window=window, sinks=sinks)
    torch.testing.assert_close(got, sink_reference(q, k, v, sinks, docs, window), **TOLERANCE)


def test_a_sink_lowers_every_weight_and_a_very_negative_one_vanishes():
    docs = packed_rows(48)
    q, k, v = random_qkv(2, 48, 48)
    plain = attention(q, k, v, document_ids=docs, backend="sdpa")
    gone = attention(q, k, v, document_ids=docs, backend="varlen", sinks=torch.full((4,), -1e4, dtype=torch.float64))
    torch.testing.assert_close(gone, plain, **TOLERANCE)
    assert not torch.allclose(attention(q, k, v, document_ids=docs, backend="varlen", sinks=torch.zeros(4)), plain)


def test_xformers_refuses_sinks_naming_the_backends_that_can():
    q, k, v = random_qkv(1, 8, 8)
    with pytest.raises(ValueError, match="'xformers' has no attention sinks; use flash, flex, sdpa or varlen"):
        attention(q, k, v, backend="xformers", sinks=torch.zeros(4))
    with pytest.raises(ValueError, match="'xformers' has no attention sinks"):
        Llama(ModelConfig.from_preset("debug", attention_sinks=True))(
            torch.zeros(1, 4, dtype=torch.long), attention_backend="xformers"
        )


# --- transformers' gpt-oss eager attention ------------------------------------------------


@pytest.mark.parametrize("backend", ["sdpa", "varlen", "flash"])
def test_sinks_equal_transformers_gpt_oss_eager_attention(backend, monkeypatch):
    """transformers 5.23's `eager_attention_forward` of gpt-oss (the sink as a concatenated
    column, max-shifted, then dropped) on the same q/k/v, sinks and sliding-window mask:
    equal within 1e-10 in float64."""
    from torch import nn
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    if backend == "flash":
        varlen_stand_in.install(monkeypatch, "torch-2.14")
    torch.manual_seed(3)
    docs = packed_rows(48)
    q, k, v = random_qkv(2, 48, 48)
    module = nn.Module()
    module.sinks = nn.Parameter(torch.randn(4, dtype=torch.float64))
    module.num_key_value_groups = 2
    mask = torch.zeros(2, 1, 48, 48, dtype=torch.float64).masked_fill(~allowed(docs, 6)[:, None], float("-inf"))
    expected, _ = eager_attention_forward(
        module, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask, scaling=q.shape[-1] ** -0.5
    )
    with torch.no_grad():
        got = attention(q, k, v, document_ids=docs, backend=backend, window=6, sinks=module.sinks)
    torch.testing.assert_close(got, expected, **(LSE_TOLERANCE if backend == "flash" else TOLERANCE))


# --- the model ------------------------------------------------------------------------------


def designed(temperature: str = "ssmax", **overrides) -> ModelConfig:
    """4 layers: sliding, full NoPE, sliding, full; sinks; a temperature on every layer."""
    values = dict(
        vocab_size=64,
        max_position=64,
        n_layers=4,
        layer_types=["sliding", "full", "sliding", "full"],
        sliding_window=6,
        nope_layers=[1],
        attention_sinks=True,
        attn_temperature=AttentionTemperature(type=temperature, layers="all", floor_scale=4.0, attn_scale=0.5),
    )
    return ModelConfig.from_preset("debug", **{**values, **overrides})


def float64_model(config: ModelConfig, seed: int = 0) -> Llama:
    torch.manual_seed(seed)
    model = Llama(config).double().eval()
    for block in model.blocks:
        if block.attn.sinks is not None:
            block.attn.sinks.data.normal_(0.0, 1.0)  # sinks that matter, as a trained model's
    return model


def packed_batch(length: int = 40):
    ids = torch.randint(0, 64, (2, length))
    docs = torch.stack([packed_document_ids([12, 3, length - 15])[0], torch.zeros(length, dtype=torch.long)])
    positions = torch.stack(
        [torch.cat([torch.arange(12), torch.arange(3), torch.arange(length - 15)]), torch.arange(length)]
    )
    return ids, positions, docs


@pytest.mark.parametrize("temperature", ["none", "llama4", "ssmax"])
@pytest.mark.parametrize("backend", ["sdpa", "varlen", "flash", "flex"])
def test_model_matches_the_float64_reference(temperature, backend, monkeypatch):
    if backend == "flash":
        varlen_stand_in.install(monkeypatch, "torch-2.14")
    model = float64_model(designed(temperature))
    ids, positions, docs = packed_batch()
    with torch.no_grad():
        got = model(ids, positions, docs, attention_backend=backend)
    torch.testing.assert_close(got, reference_logits(model, ids, positions, docs), **MODEL_TOLERANCE)


@pytest.mark.parametrize("backend", ["varlen", "flash"])
def test_model_gradients_equal_the_dense_sdpa_path(backend, monkeypatch):
    """sdpa's sinks are the explicit score matrix with the sink column (autograd exact);
    varlen and flash go through the lse and its restored gradient."""
    if backend == "flash":
        varlen_stand_in.install(monkeypatch, "torch-2.14")
    model = float64_model(designed("llama4"))
    ids, positions, docs = packed_batch()

    def gradients(name: str) -> dict[str, torch.Tensor]:
        model.zero_grad()
        model(ids, positions, docs, attention_backend=name).pow(2).mean().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    expected, got = gradients("sdpa"), gradients(backend)
    assert expected.keys() == got.keys() and "blocks.0.attn.sinks" in got
    tolerance = LSE_TOLERANCE if backend == "flash" else TOLERANCE
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], **tolerance, msg=lambda m, name=name: f"{name}: {m}")


def test_each_part_matters_in_the_reference_comparison():
    ids, positions, docs = packed_batch()
    expected = reference_logits(float64_model(designed("llama4")), ids, positions, docs)
    for change in (dict(attention_sinks=False), dict(attn_temperature=AttentionTemperature())):
        with torch.no_grad():
            assert not torch.allclose(float64_model(designed(**change))(ids, positions, docs), expected, atol=1e-3)


@pytest.mark.parametrize("temperature", ["llama4", "ssmax"])
def test_cached_decoding_equals_the_full_forward(temperature):
    model = float64_model(designed(temperature))
    ids = torch.randint(0, 64, (1, 30))
    docs = packed_document_ids([9, 21])
    with torch.no_grad():
        full = model(ids, document_ids=docs)
    torch.testing.assert_close(stepwise_logits(model, ids, 13, docs), full, **TOLERANCE)
    prompt = torch.randint(0, 64, (2, 17))
    expected = greedy_generate_recompute(model, prompt, 10)
    torch.testing.assert_close(cached_greedy(model, prompt, 10), expected, atol=0, rtol=0)


def test_a_training_step_lowers_the_loss_and_trains_the_sinks():
    torch.manual_seed(0)
    model = Llama(designed("ssmax", vocab_size=32))
    ids = torch.randint(0, 32, (2, 33))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, start = [], model.blocks[0].attn.sinks.detach().clone()
    for _ in range(5):
        loss = model(ids[:, :-1], labels=ids[:, 1:], attention_backend="varlen") / ids[:, 1:].numel()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1, losses
    assert not torch.equal(model.blocks[0].attn.sinks.detach(), start)


def test_sinks_parameter_shape_initialisation_and_count():
    """N(0, init_std) as transformers' gpt-oss `_init_weights` (normal_(sinks, std=initializer_range))."""
    config = ModelConfig.from_preset("tiny", attention_sinks=True, init_std=0.02)
    model = Llama(config)
    sinks = torch.cat([block.attn.sinks.detach() for block in model.blocks])
    assert model.blocks[0].attn.sinks.shape == (config.n_heads,)
    assert 0.005 < sinks.std().item() < 0.04 and sinks.abs().max().item() > 0
    assert config.num_parameters() == sum(p.numel() for p in model.parameters())


def test_save_and_load_keep_sinks_and_temperature(tmp_path):
    from longctx.model.checkpoint import load_model, save_model

    model = float64_model(designed("llama4")).float()
    loaded = load_model(save_model(model, tmp_path / "model.safetensors"))
    assert loaded.config.attn_temperature == model.config.attn_temperature
    ids = torch.randint(0, 64, (1, 20))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), model(ids))


# --- temperature ----------------------------------------------------------------------------


def test_llama4_temperature_equals_transformers_on_its_nope_layers(monkeypatch):
    """transformers 5.23's Llama4TextAttention (attn_temperature_tuning on a layer without
    RoPE): the queries its attention function receives over the projected ones equal
    longctx's factor within 1e-6 (float32 there); a RoPE layer there is not scaled."""
    from transformers.models.llama4 import modeling_llama4
    from transformers.models.llama4.configuration_llama4 import Llama4TextConfig

    seen = {}

    def capture(module, query, key, value, attention_mask, **kwargs):
        seen["query"] = query
        return query.transpose(1, 2), None

    monkeypatch.setattr(modeling_llama4, "eager_attention_forward", capture)
    config = Llama4TextConfig(
        hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_hidden_layers=1,
        no_rope_layers=[0], attn_temperature_tuning=True, floor_scale=4, attn_scale=0.5, use_qk_norm=False,
    )  # fmt: skip
    config._attn_implementation = "eager"
    layer = modeling_llama4.Llama4TextAttention(config, layer_idx=0)
    hidden = torch.randn(1, 40, 32)
    with torch.no_grad():
        layer(hidden, position_embeddings=None, attention_mask=None)
        projected = layer.q_proj(hidden).view(1, 40, 2, 16)
    ratio = (seen["query"].transpose(1, 2) / projected)[0, :, 0, 0]
    ours = temperature_factor(
        AttentionTemperature(type="llama4", floor_scale=4, attn_scale=0.5),
        torch.arange(40)[None],
        window=0,
        max_position=64,
        dtype=torch.float32,
    ).flatten()
    torch.testing.assert_close(ratio, ours, atol=1e-6, rtol=1e-6)
    assert ours[2].item() == 1.0 and ours[3].item() > 1.0  # floor((p + 1) / 4) = 0 below p = 3
    assert AttentionTemperature(type="llama4").applies_to(rope=False)
    assert not AttentionTemperature(type="llama4").applies_to(rope=True)
    assert AttentionTemperature(type="ssmax").applies_to(rope=True)


def test_ssmax_counts_the_keys_a_query_sees():
    factor = temperature_factor(
        AttentionTemperature(type="ssmax", ssmax_s=0.5),
        torch.tensor([[0, 4, 99]]),
        window=8,
        max_position=64,
        dtype=torch.float32,
    ).flatten()
    torch.testing.assert_close(factor, torch.tensor([0.0, 0.5 * math.log(5), 0.5 * math.log(8)]))
    default = temperature_factor(
        AttentionTemperature(type="ssmax"), torch.tensor([[63]]), window=0, max_position=64, dtype=torch.float64
    )
    assert default.item() == pytest.approx(1.0)  # s = 1 / ln(max_position): 1 at the trained length


def test_temperature_stacks_on_a_position_method():
    """StRing with a shift beyond the context equals RoPE: with a temperature on, the method's
    path scales the queries as the model's own."""
    config = designed("ssmax", attention_sinks=False, layer_types=None, sliding_window=0)
    model = float64_model(config)
    method = build_position_method(PositionMethodConfig().with_params("string", dict(shift=60, local_window=4)), config)
    ids = torch.randint(0, 64, (1, 40))
    with torch.no_grad():
        torch.testing.assert_close(model(ids, position_method=method.double()), model(ids), **TOLERANCE)
        plain = float64_model(designed("none", attention_sinks=False, layer_types=None, sliding_window=0))
        assert not torch.allclose(plain(ids, position_method=method.double()), model(ids), atol=1e-3)


def test_a_position_method_refuses_sinks_in_one_line():
    config = designed("none", layer_types=None, sliding_window=0)
    method = build_position_method(PositionMethodConfig().with_params("string", dict(shift=8, local_window=2)), config)
    with pytest.raises(ValueError, match="does not carry model.attention_sinks"):
        Llama(config)(torch.randint(0, 64, (1, 8)), position_method=method)


def test_the_eval_setting_overrides_the_checkpoints_temperature():
    model = float64_model(designed("none"))
    ids = torch.randint(0, 64, (1, 30))
    with torch.no_grad():
        before = model(ids)
        assert EvalConfig().attn_temperature.type == "model"
        torch.testing.assert_close(with_eval_temperature(model, EvalConfig())(ids), before)
        override = EvalConfig(attn_temperature=AttentionTemperature(type="llama4", floor_scale=4.0, attn_scale=0.5))
        got = with_eval_temperature(model, override)(ids)
    assert model.config.attn_temperature.type == "llama4"
    torch.testing.assert_close(got, reference_logits(model, ids), **MODEL_TOLERANCE)
    assert not torch.allclose(got, before, atol=1e-3)


@pytest.mark.parametrize(
    ("fields", "key"),
    [
        (dict(type="cosine"), "model.attn_temperature.type"),
        (dict(type="model"), "model.attn_temperature.type"),
        (dict(type="llama4", layers="odd"), "model.attn_temperature.layers"),
        (dict(type="llama4", floor_scale=0), "model.attn_temperature.floor_scale"),
        (dict(type="ssmax", ssmax_s=-1.0), "model.attn_temperature.ssmax_s"),
        (dict(type="llama4", attn_scale="big"), "model.attn_temperature.attn_scale"),
    ],
)
def test_bad_temperature_names_its_key(fields, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        ModelConfig.from_preset("debug", attn_temperature=AttentionTemperature(**fields))


def test_bad_input_names_the_key_in_eval_and_for_sinks():
    with pytest.raises(ConfigError, match=r"eval\.attn_temperature\.type"):
        EvalConfig(attn_temperature=AttentionTemperature(type="cosine"))
    with pytest.raises(ConfigError, match=r"model\.attention_sinks"):
        ModelConfig.from_preset("debug", attention_sinks="yes")


def test_the_loader_names_the_key_of_a_bad_override():
    from longctx.config.loader import load

    with pytest.raises(ConfigError, match=r"model\.attn_temperature\.type"):
        load(overrides=["model.attn_temperature.type=cosine"])


def test_export_hf_refuses_sinks_and_temperature():
    from longctx.model.hf_config import hf_config

    with pytest.raises(ValueError, match="model.attention_sinks"):
        hf_config(ModelConfig.from_preset("debug", attention_sinks=True))
    with pytest.raises(ValueError, match="model.attn_temperature.type"):
        hf_config(ModelConfig.from_preset("debug", attn_temperature=AttentionTemperature(type="ssmax")))
