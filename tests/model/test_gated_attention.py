"""Gated attention (Qiu et al. 2025, G1; Qwen3-Next): the model against the float64 forward
written from the formulas (tests/model/designs_reference.py), on every CPU-reachable
backend, with sliding layers, packed documents and sinks; cached decoding against the full
forward; the fused inference layout; a training step; the config; Qwen3-Next's q_proj layout."""

import dataclasses

import pytest
import torch

from longctx.config.model import ModelConfig
from longctx.errors import CheckpointError, ConfigError
from longctx.model.gate import gated, split_gated_query
from longctx.model.hf_config import hf_config
from longctx.model.llama import Llama
from tests.model import varlen_stand_in
from tests.model.designs_reference import reference_logits
from tests.model.helpers import stepwise_logits

TOLERANCE = {"atol": 1e-10, "rtol": 0.0}
"""float64 throughout; the sums differ only in order."""
LSE_TOLERANCE = {"atol": 1e-6, "rtol": 0.0}
"""The varlen stand-in's log-sum-exp is fp32, as the kernel's."""
FLOAT32_TOLERANCE = {"atol": 1e-5, "rtol": 0.0}
"""A float32 forward (compiled CPU flex takes no float64) against the float64 reference."""
GATES = ["elementwise", "head"]


def gated_model(gate: str, seed: int = 0, **overrides) -> Llama:
    """4 layers (sliding, full, sliding, full), window 6; gate weights large enough that
    sigmoid spreads over (0, 1)."""
    values = dict(
        vocab_size=64,
        max_position=64,
        n_layers=4,
        layer_types=["sliding", "full", "sliding", "full"],
        sliding_window=6,
        attention_gate=gate,
    )
    torch.manual_seed(seed)
    model = Llama(ModelConfig.from_preset("debug", **{**values, **overrides})).double().eval()
    with torch.no_grad():
        for block in model.blocks:
            if block.attn.wg is not None:
                block.attn.wg.weight.normal_(0.0, 0.5)
    return model


def packed_batch(length: int = 30):
    torch.manual_seed(1)
    ids = torch.randint(0, 64, (2, length))
    docs = torch.stack([torch.tensor([0] * 11 + [1] * 3 + [2] * (length - 14)), torch.zeros(length, dtype=torch.long)])
    positions = torch.stack(
        [torch.cat([torch.arange(11), torch.arange(3), torch.arange(length - 14)]), torch.arange(length)]
    )
    return ids, positions, docs


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("backend", ["sdpa", "varlen", "flash", "flex"])
def test_gated_model_matches_the_float64_formula(gate, backend, monkeypatch):
    if backend == "flash":
        varlen_stand_in.install(monkeypatch, "torch-2.14")
    model = gated_model(gate)
    ids, positions, docs = packed_batch()
    expected = reference_logits(model, ids, positions, docs)
    tolerance = {"flash": LSE_TOLERANCE, "flex": FLOAT32_TOLERANCE}.get(backend, TOLERANCE)
    runs = model.float() if backend == "flex" else model  # compiled CPU flex takes no float64
    with torch.no_grad():
        got = runs(ids, positions, docs, attention_backend=backend)
    torch.testing.assert_close(got.double(), expected, **tolerance)
    model.double()
    ungated = Llama(dataclasses.replace(model.config, attention_gate="none"))
    ungated.load_state_dict({k: v for k, v in model.state_dict().items() if ".wg." not in k})
    with torch.no_grad():
        assert (ungated.double()(ids, positions, docs) - expected).abs().max() > 1e-3  # the gate matters


@pytest.mark.parametrize("gate", GATES)
def test_gate_with_sinks_matches_the_formula(gate):
    model = gated_model(gate, attention_sinks=True)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.sinks.normal_(0.0, 1.0)
        ids, positions, docs = packed_batch()
        torch.testing.assert_close(
            model(ids, positions, docs), reference_logits(model, ids, positions, docs), **TOLERANCE
        )


@pytest.mark.parametrize("gate", GATES)
def test_cached_decoding_and_the_fused_layout_equal_the_full_forward(gate):
    model = gated_model(gate)
    ids = torch.randint(0, 64, (1, 30))
    with torch.no_grad():
        full = model(ids)
    torch.testing.assert_close(stepwise_logits(model, ids, 12), full, **TOLERANCE)
    model.fuse_projections_()
    assert model.blocks[0].attn.fused is not None and model.blocks[0].attn.fused.weight.shape[0] == sum(
        p.out_features for p in model.blocks[0].attn.projections()
    )
    torch.testing.assert_close(stepwise_logits(model, ids, 12), full, **TOLERANCE)


def test_a_position_method_runs_under_the_gate():
    from longctx.config.position_methods import PositionMethodConfig, StringConfig
    from longctx.model.position_methods import build_position_method

    model = gated_model("elementwise", layer_types=None, sliding_window=0, max_position=24)
    method = build_position_method(
        PositionMethodConfig(name="string", string=StringConfig(shift=10, local_window=3)), model.config
    ).double()
    ids = torch.randint(0, 64, (1, 36))
    with torch.no_grad():
        full = model(ids, position_method=method)
    torch.testing.assert_close(stepwise_logits(model, ids, 20, position_method=method), full, **TOLERANCE)


@pytest.mark.parametrize("gate", GATES)
def test_a_training_step_trains_the_gate(gate):
    model = gated_model(gate).float().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids, positions, docs = packed_batch()
    losses = []
    for _ in range(3):
        optimizer.zero_grad()
        loss = model(ids, positions, docs, labels=ids, attention_backend="varlen")
        loss.backward()
        grad = model.blocks[1].attn.wg.weight.grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().max() > 0
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_the_gate_formula_per_channel_and_per_head():
    out, gate = torch.randn(5, 4 * 3, dtype=torch.float64), torch.randn(5, 4 * 3, dtype=torch.float64)
    torch.testing.assert_close(gated(out, gate, 4), out / (1 + torch.exp(-gate)), **TOLERANCE)
    per_head = torch.randn(5, 4, dtype=torch.float64)
    expected = out.view(5, 4, 3) / (1 + torch.exp(-per_head))[..., None]
    torch.testing.assert_close(gated(out, per_head, 4), expected.view(5, 12), **TOLERANCE)


def test_qwen3_next_doubled_q_proj_splits_per_head():
    """transformers' Qwen3NextAttention: view(..., heads, 2 * head_dim), chunk into query and gate."""
    heads, head_dim, width = 3, 4, 10
    q_proj = torch.nn.Linear(width, heads * head_dim * 2, dtype=torch.float64)
    x = torch.randn(2, 5, width, dtype=torch.float64)
    query, gate = torch.chunk(q_proj(x).view(2, 5, -1, head_dim * 2), 2, dim=-1)
    wq, wg = split_gated_query(q_proj.weight, heads)
    bq, bg = split_gated_query(q_proj.bias, heads)
    torch.testing.assert_close(x @ wq.T + bq, query.reshape(2, 5, -1), **TOLERANCE)
    torch.testing.assert_close(x @ wg.T + bg, gate.reshape(2, 5, -1), **TOLERANCE)


def test_config_names_the_key_and_counts_the_parameters():
    with pytest.raises(ConfigError, match=r"model.attention_gate: 'channel' is not one of"):
        ModelConfig.from_preset("debug", attention_gate="channel")
    for gate in ["none", *GATES]:
        for bias in ["none", "qkv"]:
            config = ModelConfig.from_preset("debug", attention_gate=gate, attention_bias=bias)
            assert config.num_parameters() == sum(p.numel() for p in Llama(config).parameters())
    with pytest.raises(CheckpointError, match=r"model.attention_gate='head'"):
        hf_config(ModelConfig.from_preset("debug", attention_gate="head"))
