"""Sliding-window / global layers, per-layer RoPE bases and NoPE layers in longctx's model,
against float64 references written from the formulas (tests/model/designs_reference.py and
the pair-by-pair attention below), on every CPU backend and on the flash path through the
varlen stand-in; the KV cache's sliding windows; position methods on hybrid models."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from longctx.config.model import ModelConfig
from longctx.config.position_methods import PositionMethodConfig
from longctx.errors import ConfigError
from longctx.model.attention import attention
from longctx.model.inference.prefill import greedy_generate_recompute
from longctx.model.llama import Llama
from longctx.model.position_methods import build_position_method
from tests.helpers import packed_document_ids
from tests.model import varlen_stand_in
from tests.model.designs_reference import allowed, reference_logits
from tests.model.helpers import cached_greedy, random_qkv, stepwise_logits

TOLERANCE = dict(atol=1e-10, rtol=1e-10)
"""float64 on both sides: the kernels and the loops differ only in summation order."""
MODEL_TOLERANCE = dict(atol=1e-6, rtol=1e-6)
"""Whole models: the model's RMSNorm computes in float32 by design (~5e-8 on these logits)."""


def windowed_reference(q, k, v, document_ids, window):
    """Attention of the last Tq keys' queries, pair by pair (float64)."""
    heads, kv_heads = q.shape[2], k.shape[2]
    k, v = k.repeat_interleave(heads // kv_heads, 2), v.repeat_interleave(heads // kv_heads, 2)
    q_len, kv_len = q.shape[1], k.shape[1]
    mask = allowed(document_ids, window)[:, kv_len - q_len :]  # [B, Tq, Tk]
    scores = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    return torch.einsum("bhij,bjhd->bihd", scores.softmax(-1), v)


def packed_rows(total: int) -> torch.Tensor:
    """Row 0: documents of several lengths (one shorter than the window); row 1: one."""
    row0 = packed_document_ids([7, 3, 20, total - 30])[0]
    return torch.stack([row0, torch.zeros(total, dtype=torch.long)])


@pytest.mark.parametrize("backend", ["sdpa", "varlen", "flash"])
@pytest.mark.parametrize("q_len", [48, 5, 1])
def test_windowed_attention_matches_the_pair_by_pair_reference(backend, q_len, monkeypatch):
    if backend == "flash":
        varlen_stand_in.install(monkeypatch, "torch-2.14")
    docs = packed_rows(48)
    q, k, v = (t.requires_grad_() for t in random_qkv(2, q_len, 48))
    weights = torch.randn(q.shape, dtype=q.dtype)
    got = attention(q, k, v, document_ids=docs, backend=backend, window=6, block_size=4)
    expected = windowed_reference(q, k, v, docs, 6)
    torch.testing.assert_close(got, expected, **TOLERANCE)
    grads = torch.autograd.grad((got * weights).sum(), (q, k, v))
    expected_grads = torch.autograd.grad((expected * weights).sum(), (q, k, v))
    for a, b in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(a, b, **TOLERANCE)


def test_the_window_changes_the_output():
    docs = packed_rows(48)
    q, k, v = random_qkv(2, 48, 48)
    windowed = attention(q, k, v, document_ids=docs, backend="sdpa", window=6)
    assert not torch.allclose(windowed, attention(q, k, v, document_ids=docs, backend="sdpa"))


def test_flex_block_mask_carries_the_window():
    """Flex (inference on CPU) at a length that is not a multiple of its 128-token blocks."""
    total = 300
    docs = torch.stack([packed_document_ids([40, 150, 110])[0], torch.zeros(total, dtype=torch.long)])
    q, k, v = random_qkv(2, total, total, dtype=torch.float32)
    with torch.no_grad():
        got = attention(q, k, v, document_ids=docs, backend="flex", window=100)
    expected = windowed_reference(q.double(), k.double(), v.double(), docs, 100)
    torch.testing.assert_close(got.double(), expected, atol=2e-5, rtol=1e-4)


def test_xformers_refuses_a_window_and_names_the_backends_that_can():
    q, k, v = random_qkv(1, 8, 8)
    with pytest.raises(ValueError, match="xformers.*flash, flex, sdpa or varlen"):
        attention(q, k, v, backend="xformers", window=4)


def hybrid(**overrides) -> ModelConfig:
    """Four layers: sliding (base 100), full NoPE, sliding NoPE, full (base 10,000)."""
    values = dict(
        n_layers=4,
        layer_types=["sliding", "full", "sliding", "full"],
        sliding_window=5,
        sliding_rope_base=100.0,
        nope_layers=[1, 2],
        vocab_size=64,
        max_position=64,
    )
    return ModelConfig.from_preset("debug", **{**values, **overrides})


def float64_model(config: ModelConfig, seed: int = 0) -> Llama:
    torch.manual_seed(seed)
    model = Llama(config).double().eval()
    for name, parameter in model.named_parameters():  # norms away from 1 so a missed norm shows
        if name.endswith("norm.weight"):
            parameter.data.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("backend", ["sdpa", "varlen", "flash"])
def test_hybrid_model_matches_the_float64_reference(backend, monkeypatch):
    if backend == "flash":
        varlen_stand_in.install(monkeypatch, "torch-2.14")
    model = float64_model(hybrid())
    ids = torch.randint(0, 64, (2, 40))
    docs = torch.stack([packed_document_ids([12, 3, 25])[0], torch.zeros(40, dtype=torch.long)])
    positions = torch.stack([torch.cat([torch.arange(12), torch.arange(3), torch.arange(25)]), torch.arange(40)])
    with torch.no_grad():
        got = model(ids, positions, docs, attention_backend=backend)
    torch.testing.assert_close(got, reference_logits(model, ids, positions, docs), **MODEL_TOLERANCE)


def test_each_design_matters_in_the_reference_comparison():
    """The comparison can fail: a model with any one design dropped differs from the hybrid."""
    ids = torch.randint(0, 64, (1, 30))
    expected = reference_logits(float64_model(hybrid()), ids)
    for change in (dict(sliding_window=30), dict(sliding_rope_base=0.0), dict(nope_layers=[1])):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            other = float64_model(hybrid(**change))
        with torch.no_grad():
            assert not torch.allclose(other(ids), expected, atol=1e-3), change


@pytest.mark.parametrize("chunk", [0, 7])
def test_cached_decoding_equals_full_recompute(chunk):
    """Prefill (whole or in chunks longer than the window) then one token at a time: each
    sliding layer reads only its kept W - 1 keys and the new ones."""
    model = float64_model(hybrid())
    prompt = torch.randint(0, 64, (2, 23))
    expected = greedy_generate_recompute(model, prompt, 12)
    got = cached_greedy(model, prompt, 12, prefill_chunk_tokens=chunk) if chunk else cached_greedy(model, prompt, 12)
    torch.testing.assert_close(got, expected, atol=0, rtol=0)


def test_cached_logits_equal_the_full_forward_with_packed_documents():
    model = float64_model(hybrid())
    ids = torch.randint(0, 64, (1, 30))
    docs = packed_document_ids([9, 21])
    with torch.no_grad():
        full = model(ids, document_ids=docs)
    torch.testing.assert_close(stepwise_logits(model, ids, 13, docs), full, **TOLERANCE)


def test_a_sliding_layer_caches_only_its_window():
    config = hybrid()
    model = Llama(config)
    short, long = model.new_kv_cache(1, 32), model.new_kv_cache(1, 4096)
    for cache, length in ((short, 32), (long, 4096)):
        with torch.no_grad():
            model(torch.randint(0, 64, (1, 8)), kv_cache=cache)
        assert cache.window_keys is not None and cache.keys is not None
        assert cache.window_keys.shape[:3] == (2, 1, config.sliding_window - 1)
        assert cache.keys.shape[:3] == (2, 1, length)
    all_full = Llama(ModelConfig.from_preset("debug", n_layers=4, vocab_size=64, max_position=64))
    cache = all_full.new_kv_cache(1, 4096)
    with torch.no_grad():
        all_full(torch.randint(0, 64, (1, 8)), kv_cache=cache)
    assert long.nbytes < 0.51 * cache.nbytes  # two of four layers hold W - 1 = 4 keys, not 4,096


def test_string_on_an_all_sliding_model_within_its_shift_is_plain_rope():
    """The rule of docs/design.md §8: W <= S leaves a sliding layer as RoPE has it."""
    config = hybrid(layer_types=["sliding"] * 4, nope_layers=None)
    model = float64_model(config)
    ids = torch.randint(0, 64, (1, 40))
    method = build_position_method(PositionMethodConfig().with_params("string", dict(shift=8, local_window=2)), config)
    with torch.no_grad():
        torch.testing.assert_close(model(ids, position_method=method), model(ids), **TOLERANCE)


@pytest.mark.parametrize(
    ("name", "params", "limit"),
    [
        ("string", dict(shift=4, local_window=1), 4),
        ("rerope", dict(window=3, log_scale_length=-1), 3),
        ("self_extend", dict(neighbor_window=4, group_size=2), 4),
        ("dca", dict(chunk_size=8, local_window=4), 4),
    ],
)
def test_a_method_that_changes_distances_inside_the_window_is_refused(name, params, limit):
    config = hybrid()
    method = build_position_method(PositionMethodConfig().with_params(name, params), config)
    assert method.exact_below == limit
    with pytest.raises(ValueError, match=f"sliding_window=5.*<= {limit}"), torch.no_grad():
        Llama(config)(torch.randint(0, 64, (1, 12)), position_method=method)


def test_string_runs_on_the_full_layers_of_a_hybrid():
    """A full layer under StRing differs from plain RoPE beyond S; the same call on the model
    with its one full RoPE layer turned NoPE equals plain RoPE (StRing touched only it)."""
    config = hybrid(sliding_window=4)
    ids = torch.randint(0, 64, (1, 40))
    method = build_position_method(PositionMethodConfig().with_params("string", dict(shift=6, local_window=2)), config)
    model = float64_model(config)
    with torch.no_grad():
        assert not torch.allclose(model(ids, position_method=method), model(ids), atol=1e-6)
    nope = float64_model(hybrid(sliding_window=4, nope_layers=[1, 2, 3]))
    with torch.no_grad():
        torch.testing.assert_close(nope(ids, position_method=method), nope(ids), **TOLERANCE)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (dict(layer_types=["sliding", "full"]), "model.layer_types"),
        (dict(layer_types=["sliding", "local", "full", "full"]), "model.layer_types"),
        (dict(sliding_window=0), "model.sliding_window"),
        (dict(nope_layers=[4]), "model.nope_layers"),
        (dict(global_every=2), "model.global_every"),
        (
            dict(layer_types=None, nope_layers=None, nope_every=2, global_every=2, sliding_rope_base=0.5),
            "model.sliding_rope_base",
        ),
    ],
)
def test_bad_designs_name_their_key(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        hybrid(**overrides)


def test_a_window_at_least_the_context_is_allowed_and_said():
    with pytest.warns(UserWarning, match="sliding_window=64 >= model.max_position=64"):
        hybrid(sliding_window=64)


def test_every_kth_layer_global_and_nope():
    config = ModelConfig.from_preset("debug", n_layers=6, global_every=3, sliding_window=8, nope_every=2)
    assert [spec.kind for spec in config.layer_specs()] == ["sliding", "sliding", "full"] * 2
    assert [spec.rope for spec in config.layer_specs()] == [True, False] * 3


def test_a_training_step_on_a_hybrid_lowers_the_loss():
    torch.manual_seed(0)
    model = Llama(hybrid(vocab_size=32))
    ids = torch.randint(0, 32, (2, 33))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(5):
        logits = model(ids[:, :-1], attention_backend="varlen")
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1, losses


def test_export_hf_refuses_a_hybrid_in_one_line():
    from longctx.model.hf_config import hf_config

    with pytest.raises(ValueError, match="cannot export a model with sliding layers as smollm3") as error:
        hf_config(hybrid())  # NoPE layers pick smollm3, whose config.json has no sliding layers
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="sliding or NoPE layers"):
        hf_config(hybrid(nope_layers=None))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["flex", "flash"])
def test_windowed_attention_on_cuda_matches_the_reference_forward_and_backward(backend):
    """flex's backward (none on CPU) and the real flash kernel's window, bf16, at 1K; the
    float64 reference on the CPU."""
    docs = packed_rows(1024)
    inputs = random_qkv(2, 1024, 1024, dim=64)
    q, k, v = (t.cuda().to(torch.bfloat16).requires_grad_() for t in inputs)
    got = attention(q, k, v, document_ids=docs.cuda(), backend=backend, window=300)
    leaves = [t.to(torch.bfloat16).double().requires_grad_() for t in inputs]
    expected = windowed_reference(*leaves, docs, 300)
    torch.testing.assert_close(got.double().cpu(), expected.detach(), atol=3e-2, rtol=0)
    grad = torch.randn_like(expected)
    got_grads = torch.autograd.grad(got, (q, k, v), grad.cuda().to(got.dtype))
    expected_grads = torch.autograd.grad(expected, leaves, grad)
    for name, a, b in zip("qkv", got_grads, expected_grads, strict=True):
        error = ((a.double().cpu() - b).norm() / b.norm()).item()
        assert error < 3e-2, f"d{name}: relative L2 error {error:.1e}"
