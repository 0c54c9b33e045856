"""The model on the batch contract: packing, backends, KV-cache decoding, generation."""

import dataclasses

import pytest
import torch

from longctx.config.model import ModelConfig
from longctx.model.inference.prefill import greedy_generate_recompute
from longctx.model.llama import Llama
from tests.helpers import packed_document_ids, reset_position_ids
from tests.model.helpers import cached_greedy


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    # A larger init than training's 0.02 so logits are O(1) and errors cannot hide.
    return Llama(ModelConfig.from_preset("debug", init_std=0.08)).eval()


def test_preset_sizes_match_the_design_table():
    tinyllama = ModelConfig.from_preset("tinyllama-1.1b")
    assert (tinyllama.d_model, tinyllama.n_layers, tinyllama.n_heads, tinyllama.n_kv_heads, tinyllama.d_ff) == (
        2048,
        22,
        32,
        4,
        5632,
    )
    assert round(tinyllama.num_parameters() / 1e9, 2) == 1.10
    assert ModelConfig.from_preset("string-1.3b").vocab_size == 128256
    debug = Llama(ModelConfig.from_preset("debug"))
    assert sum(p.numel() for p in debug.parameters()) == debug.config.num_parameters()


@pytest.mark.parametrize("backend", ["sdpa", "varlen", "flex"])
def test_packed_row_equals_documents_run_alone(model, backend):
    lengths = [40, 3, 77, 8]
    ids = torch.randint(0, model.config.vocab_size, (2, sum(lengths)))
    with torch.no_grad():
        packed = model(ids, reset_position_ids(lengths, 2), packed_document_ids(lengths, 2), attention_backend=backend)
        start = 0
        for n in lengths:
            alone = model(ids[:, start : start + n], attention_backend="sdpa")
            torch.testing.assert_close(packed[:, start : start + n], alone, atol=1e-4, rtol=0)
            start += n


def test_varlen_training_gradients_match_sdpa(model):
    lengths = [50, 14, 64]
    ids = torch.randint(0, model.config.vocab_size, (1, sum(lengths)))
    contract = dict(position_ids=reset_position_ids(lengths), document_ids=packed_document_ids(lengths))
    grads = {}
    for backend in ("sdpa", "varlen"):
        model.zero_grad()
        model(ids, **contract, attention_backend=backend).logsumexp(-1).mean().backward()
        grads[backend] = {n: p.grad.clone() for n, p in model.named_parameters()}
    for name in grads["sdpa"]:
        torch.testing.assert_close(grads["varlen"][name], grads["sdpa"][name], atol=1e-5, rtol=1e-4)


def test_position_ids_matter(model):
    """Shifting every position by a constant leaves logits unchanged (RoPE is relative),
    while breaking the spacing of positions changes them."""
    ids = torch.randint(0, model.config.vocab_size, (1, 32))
    base = torch.arange(32)[None]
    with torch.no_grad():
        plain = model(ids, base)
        shifted = model(ids, base + 1000)
        skipped = model(ids, torch.cat([base[:, :16], base[:, 16:] + 100], dim=1))
    torch.testing.assert_close(shifted, plain, atol=2e-4, rtol=0)
    assert (skipped[:, 16:] - plain[:, 16:]).abs().max() > 1e-2


@pytest.mark.parametrize("backend", ["sdpa", "varlen"])
def test_kv_cache_decoding_reproduces_full_forward(model, backend):
    batch, prompt_len, new = 3, 20, 12
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt_len + new))
    with torch.no_grad():
        full = model(ids, attention_backend="sdpa")
        cache = model.new_kv_cache(batch, prompt_len + new)
        prefill = model(ids[:, :prompt_len], kv_cache=cache, attention_backend=backend)
        torch.testing.assert_close(prefill, full[:, :prompt_len], atol=1e-5, rtol=0)
        for t in range(prompt_len, prompt_len + new):
            step = model(ids[:, t : t + 1], kv_cache=cache, attention_backend=backend)
            torch.testing.assert_close(step[:, 0], full[:, t], atol=1e-5, rtol=0)
    assert cache.length == prompt_len + new


def test_chunked_prefill_with_packed_documents(model):
    lengths = [10, 25, 13]
    ids = torch.randint(0, model.config.vocab_size, (2, sum(lengths)))
    positions, docs = reset_position_ids(lengths, 2), packed_document_ids(lengths, 2)
    with torch.no_grad():
        full = model(ids, positions, docs, attention_backend="sdpa")
        cache = model.new_kv_cache(2, sum(lengths) + 1)
        pieces = [
            model(ids[:, s:e], positions[:, s:e], docs[:, s:e], kv_cache=cache)
            for s, e in ((0, 17), (17, 30), (30, 48))
        ]
        torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=0)
        # Decoding continues the last document: its position and its document id.
        extra = torch.randint(0, model.config.vocab_size, (2, 1))
        step = model(extra, kv_cache=cache)
        last_doc = model(torch.cat([ids[:, 35:], extra], dim=1), attention_backend="sdpa")
    torch.testing.assert_close(step[:, 0], last_doc[:, -1], atol=1e-5, rtol=0)


def test_kv_cache_overflow_is_an_error(model):
    cache = model.new_kv_cache(1, 8)
    with pytest.raises(ValueError, match="KV cache holds 8 positions"):
        model(torch.zeros(1, 9, dtype=torch.long), kv_cache=cache)


def test_batched_cached_generation_equals_recompute(model):
    prompts = torch.randint(0, model.config.vocab_size, (4, 30))
    cached = cached_greedy(model, prompts, max_new_tokens=10)
    recomputed = greedy_generate_recompute(model, prompts, max_new_tokens=10)
    assert cached.shape == (4, 10)
    assert torch.equal(cached, recomputed)
    one_by_one = torch.cat([cached_greedy(model, p[None], max_new_tokens=10) for p in prompts])
    assert torch.equal(cached, one_by_one)


def test_contract_shape_mismatch_names_the_tensor(model):
    ids = torch.zeros(1, 8, dtype=torch.long)
    with pytest.raises(ValueError, match="position_ids has shape"):
        model(ids, position_ids=torch.arange(7)[None])


@pytest.mark.parametrize("name", ["string", "rerope", "self_extend", "dca", "ntk"])
def test_position_method_kv_cache_decoding_reproduces_full_forward(model, name):
    """Every method through the model: cached decoding equals re-running the full sequence."""
    from longctx.config.position_methods import PositionMethodConfig, StringConfig
    from longctx.model.position_methods import build_position_method

    config = model.config
    method_config = PositionMethodConfig(name=name, string=StringConfig(shift=24, local_window=6))
    method = build_position_method(method_config, dataclasses.replace(config, max_position=48))
    ids = torch.randint(0, config.vocab_size, (2, 60))
    with torch.no_grad():
        full = model(ids, position_method=method)
        plain = model(ids)
        cache = model.new_kv_cache(2, 60)
        prefill = model(ids[:, :40], kv_cache=cache, position_method=method)
        steps = [model(ids[:, t : t + 1], kv_cache=cache, position_method=method)[:, 0] for t in range(40, 60)]
    torch.testing.assert_close(prefill, full[:, :40], atol=1e-4, rtol=0)
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 40:], atol=1e-4, rtol=0)
    assert (full[:, 40:] - plain[:, 40:]).abs().max() > 1e-3  # the method is really in use


def test_string_rows_before_the_shift_equal_plain_rope(model):
    from longctx.config.position_methods import PositionMethodConfig, StringConfig
    from longctx.model.position_methods import build_position_method

    method = build_position_method(
        PositionMethodConfig(name="string", string=StringConfig(shift=24, local_window=6)),
        dataclasses.replace(model.config, max_position=48),
    )
    ids = torch.randint(0, model.config.vocab_size, (1, 60))
    with torch.no_grad():
        torch.testing.assert_close(model(ids, position_method=method)[:, :24], model(ids)[:, :24], atol=1e-4, rtol=0)


def test_kv_cache_takes_the_autocast_compute_dtype(model):
    """Under bf16 autocast the projections give bf16 k/v while the weights stay float32: the
    cache must hand the kernel bf16 keys with bf16 queries (the flash kernels refuse a float32
    cache with bf16 queries), and decoding must still follow the full forward."""
    ids = torch.randint(0, model.config.vocab_size, (2, 24))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        full = model(ids)
        cache = model.new_kv_cache(2, 25)
        model(ids[:, :20], kv_cache=cache)
        steps = [model(ids[:, t : t + 1], kv_cache=cache)[:, 0] for t in range(20, 24)]
    assert cache.keys is not None and cache.keys.dtype == torch.bfloat16
    torch.testing.assert_close(torch.stack(steps, 1).float(), full[:, 20:].float(), atol=0.1, rtol=0.05)
    with torch.no_grad(), pytest.raises(TypeError, match="same precision"):
        model(ids[:, :1], kv_cache=cache)  # float32 decoding into a bf16 cache


def test_generation_runs_compiled_blocks_eagerly():
    """Blocks compiled for training (`block.compile()`, as train/module.py does) compile in a
    training forward, but greedy decoding, whose key length grows every token, compiles
    nothing and gives the uncompiled model's tokens."""
    from torch._dynamo.testing import CompileCounter

    torch.manual_seed(0)
    model = Llama(ModelConfig.from_preset("debug"))
    prompts = torch.randint(0, 8192, (2, 20))
    expected = cached_greedy(model, prompts, 12)
    counter = CompileCounter()
    for block in model.blocks:
        block.compile(backend=counter, dynamic=False)
    assert torch.equal(cached_greedy(model, prompts, 12), expected)
    assert counter.frame_count == 0
    model(prompts)
    assert counter.frame_count > 0
