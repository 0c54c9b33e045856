"""Hybrid models (`linear` Gated DeltaNet layers beside full and sliding attention layers):
cached decoding against the full forward, packed rows against each document alone, the
cache's constant-size states, a training step, parameter counts, the config's placement and
errors, and position methods acting on the rotary full layers only."""

import pytest
import torch

from longctx.config.model import ModelConfig
from longctx.config.position_methods import PositionMethodConfig, StringConfig
from longctx.errors import ConfigError
from longctx.model.llama import Llama
from longctx.model.position_methods import build_position_method

FLOAT64 = {"atol": 1e-10, "rtol": 0.0}
"""float64 throughout: cached and full forwards differ only in summation order."""
VARIANTS = ["olmo_hybrid", "qwen3_next"]


def hybrid(variant: str, seed: int = 0, **overrides) -> Llama:
    """4 layers, three linear to one full (OLMo Hybrid's and Qwen3-Next's 3:1), float64."""
    linear = dict(variant=variant, n_key_heads=2, n_value_heads=4, chunk_size=8)
    linear["full_every"] = 0 if "layer_types" in overrides else 4
    values = dict(vocab_size=64, max_position=64, n_layers=4, linear_attention=linear, **overrides)
    torch.manual_seed(seed)
    return Llama(ModelConfig(**values)).double()


def test_full_every_places_three_linear_layers_to_one_full():
    config = ModelConfig(n_layers=8, linear_attention={"full_every": 4})
    assert config.layer_kinds() == ["linear", "linear", "linear", "full"] * 2
    assert [spec.rope for spec in config.layer_specs()] == [False, False, False, True] * 2
    listed = ModelConfig(n_layers=3, layer_types=["linear", "sliding", "full"], sliding_window=4)
    assert listed.layer_kinds() == ["linear", "sliding", "full"]


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"linear_attention": {"variant": "mamba"}}, "model.linear_attention.variant"),
        ({"linear_attention": {"kernel": "cuda"}}, "model.linear_attention.kernel"),
        ({"linear_attention": {"conv_size": 0}}, "model.linear_attention.conv_size"),
        ({"linear_attention": {"n_key_heads": -1}}, "model.linear_attention.n_key_heads"),
        (
            {"layer_types": ["linear", "full"], "linear_attention": {"n_key_heads": 2, "n_value_heads": 3}},
            "model.linear_attention.n_value_heads",
        ),
        (
            {"linear_attention": {"variant": "qwen3_next", "allow_neg_eigval": True}},
            "model.linear_attention.allow_neg_eigval",
        ),
        (
            {"layer_types": ["linear", "full"], "linear_attention": {"full_every": 2}},
            "model.linear_attention.full_every",
        ),
        ({"layer_types": ["linear", "mamba"]}, "model.layer_types"),
        ({"linear_attention": {"norm_placement": "middle"}}, "model.linear_attention.norm_placement"),
    ],
)
def test_bad_linear_settings_name_their_key(values, key):
    with pytest.raises(ConfigError, match=key):
        ModelConfig(**values)


@pytest.mark.parametrize("variant", VARIANTS)
def test_parameter_count_matches_the_model(variant):
    model = hybrid(variant, norm_placement="sandwich")
    assert model.config.num_parameters() == sum(p.numel() for p in model.parameters())
    linear = dict(variant=variant, n_key_heads=2, n_value_heads=4, full_every=4, norm_placement="sandwich")
    model = Llama(ModelConfig(vocab_size=64, n_layers=4, norm_placement="post", linear_attention=linear))
    assert model.config.num_parameters() == sum(p.numel() for p in model.parameters())


def test_linear_layers_take_their_own_norm_placement():
    """OLMo Hybrid: pre-norm linear blocks beside post-norm full ones; '' = the model's placement."""
    linear = dict(full_every=2, norm_placement="pre")
    model = Llama(ModelConfig(n_layers=4, norm_placement="post", linear_attention=linear))
    for index, block in enumerate(model.blocks):
        pre = index % 2 == 0  # layers 0 and 2 linear
        assert isinstance(block.attn_norm, torch.nn.Identity) != pre
        assert isinstance(block.mlp_post_norm, torch.nn.Identity) == pre
    same = Llama(ModelConfig(n_layers=2, norm_placement="post", linear_attention=dict(full_every=2)))
    assert isinstance(same.blocks[0].attn_norm, torch.nn.Identity)


@pytest.mark.parametrize("variant", VARIANTS)
def test_prefill_then_cached_steps_equal_the_full_forward(variant):
    model = hybrid(variant).eval()
    ids = torch.randint(0, 64, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(ids)
        cache = model.new_kv_cache(2, 30)
        parts = [model(ids[:, :11], kv_cache=cache), model(ids[:, 11:19], kv_cache=cache)]  # a prefill in two chunks
        parts += [model(ids[:, t : t + 1], kv_cache=cache) for t in range(19, 30)]
    torch.testing.assert_close(torch.cat(parts, 1), full, **FLOAT64)
    assert cache.keys is not None and cache.keys.shape[0] == 1  # keys for the full layer only
    assert sorted(cache.linear_states) == [0, 1, 2]


@pytest.mark.parametrize("variant", VARIANTS)
def test_cached_decoding_of_packed_prompts_and_a_new_document(variant):
    """Row 0: documents of 12 and 18 tokens, the second continued token by token; row 1: one
    document, then a new one from step 25 (its states restart, its positions from 0)."""
    model = hybrid(variant, layer_types=["linear", "sliding", "linear", "full"], sliding_window=5).eval()
    ids = torch.randint(0, 64, (2, 30), generator=torch.Generator().manual_seed(2))
    documents = torch.tensor([[0] * 12 + [1] * 18, [0] * 25 + [1] * 5])
    positions = torch.tensor([list(range(12)) + list(range(18)), list(range(25)) + list(range(5))])
    with torch.no_grad():
        full = model(ids, position_ids=positions, document_ids=documents)
        alone = model(ids[:1, 12:])
        cache = model.new_kv_cache(2, 30)
        parts = [model(ids[:, :16], position_ids=positions[:, :16], document_ids=documents[:, :16], kv_cache=cache)]
        for t in range(16, 30):
            step = slice(t, t + 1)
            parts.append(
                model(ids[:, step], position_ids=positions[:, step], document_ids=documents[:, step], kv_cache=cache)
            )
    torch.testing.assert_close(torch.cat(parts, 1), full, **FLOAT64)
    torch.testing.assert_close(full[:1, 12:], alone, **FLOAT64)


def test_linear_states_do_not_grow_with_the_prompt():
    model = hybrid("qwen3_next").eval()
    sizes = []
    for length in (8, 40):
        cache = model.new_kv_cache(1, length)
        with torch.no_grad():
            model(torch.zeros(1, length, dtype=torch.long), kv_cache=cache)
        sizes.append(sum(conv.nbytes + state.nbytes for conv, state in cache.linear_states.values()))
    # per linear layer: conv [1, 2 * 2 * 16 + 4 * 16, 3] and state [1, 4, 16, 16], float64
    assert sizes == [3 * 8 * (128 * 3 + 4 * 16 * 16)] * 2


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_few_training_steps_lower_the_loss(variant):
    model = hybrid(variant).float().train()
    ids = torch.randint(0, 64, (4, 32), generator=torch.Generator().manual_seed(3))
    documents = torch.tensor([[0] * 20 + [1] * 12] * 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        loss = model(ids[:, :-1], document_ids=documents[:, :-1], labels=ids[:, 1:]) / ids[:, 1:].numel()
        optimizer.zero_grad()
        loss.backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1


def string_method(config: ModelConfig):
    string = StringConfig(shift=16, local_window=4)
    return build_position_method(PositionMethodConfig(name="string", string=string), config)


def test_a_position_method_acts_on_the_rotary_full_layers_only():
    """StRing on a 3:1 hybrid with RoPE full layers changes the logits; the linear layers'
    outputs are those of plain RoPE (they come first and see no positions)."""
    model = hybrid("olmo_hybrid").eval()
    ids = torch.randint(0, 64, (1, 48), generator=torch.Generator().manual_seed(4))
    seen = {}
    hooks = [
        block.attn.register_forward_hook(lambda module, args, out, i=i: seen.setdefault(i, []).append(out))
        for i, block in enumerate(model.blocks)
    ]
    with torch.no_grad():
        plain = model(ids)
        shifted = model(ids, position_method=string_method(model.config))
    for hook in hooks:
        hook.remove()
    assert (plain - shifted).abs().max() > 1e-6
    torch.testing.assert_close(seen[0][1], seen[0][0], **FLOAT64)  # the first linear layer: unchanged
    assert (seen[3][1] - seen[3][0]).abs().max() > 1e-6  # the full layer: moved


def test_a_nope_only_hybrid_refuses_a_position_method_in_one_line():
    """OLMo Hybrid as released: full layers without RoPE, the others linear."""
    model = hybrid("olmo_hybrid", nope_every=4).eval()
    with pytest.raises(ValueError, match="position method 'string' has nothing to act on") as error:
        model(torch.zeros(1, 8, dtype=torch.long), position_method=string_method(model.config))
    assert "\n" not in str(error.value) and "(its layers: NoPE full, linear)" in str(error.value)
    assert model(torch.zeros(1, 8, dtype=torch.long)).shape == (1, 8, 64)  # plain positions run


def test_export_refuses_a_hybrid_no_family_carries():
    """OLMo Hybrid's full layers are post-norm blocks: a pre-norm hybrid of its variant has no
    config.json (the families that do write linear layers: tests/model/test_hf_hybrids.py)."""
    from longctx.errors import CheckpointError
    from longctx.model.hf_config import hf_config

    with pytest.raises(CheckpointError, match="cannot export model.norm_placement='pre'"):
        hf_config(ModelConfig(layer_types=["linear", "full"]))


def test_the_designs_hybrid_trains_a_step_at_its_window():
    from longctx.config import load

    config = load(["experiments/designs/base.yaml", "experiments/designs/hybrid_olmo_rope.yaml"])
    assert config.model.layer_kinds() == ["linear", "linear", "linear", "full"] * 2
    torch.manual_seed(0)
    model = Llama(config.model)
    ids = torch.randint(0, config.model.vocab_size, (1, config.data.window + 1))
    loss = model(ids[:, :-1], labels=ids[:, 1:], attention_backend="varlen")
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters())


def test_context_parallelism_is_refused_for_linear_layers():
    from longctx.config import load

    overrides = ["model.linear_attention.full_every=2", "train.context_parallel=2", "model.attention_backend=sdpa"]
    overrides.append("train.strategy=fsdp")
    with pytest.raises(ConfigError, match="train.context_parallel: linear"):
        load([], overrides)
