"""RoPE frequencies vs Hugging Face's implementations, and the relative-position property."""

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from longctx.model.rope import RopeScaling, RotaryEmbedding, apply_rotary, inverse_frequencies

HEAD_DIM = 64
BASE = 500000.0

CASES = {
    "linear": (RopeScaling("linear", factor=4.0), {"rope_type": "linear", "factor": 4.0}),
    "yarn": (
        RopeScaling("yarn", factor=8.0, original_max_position=2048),
        {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 2048},
    ),
    "yarn-betas": (
        RopeScaling("yarn", factor=3.0, original_max_position=1024, beta_fast=16.0, beta_slow=2.0),
        {
            "rope_type": "yarn",
            "factor": 3.0,
            "original_max_position_embeddings": 1024,
            "beta_fast": 16.0,
            "beta_slow": 2.0,
        },
    ),
    "llama3": (
        RopeScaling("llama3", factor=8.0, original_max_position=8192, low_freq_factor=1.0, high_freq_factor=4.0),
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "original_max_position_embeddings": 8192,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
        },
    ),
}


def hf_inverse_frequencies(rope_scaling: dict, base: float = BASE):
    config = LlamaConfig(
        hidden_size=HEAD_DIM * 4,
        num_attention_heads=4,
        head_dim=HEAD_DIM,
        rope_theta=base,
        rope_scaling=rope_scaling,
        max_position_embeddings=2048,
    )
    kind = rope_scaling["rope_type"]
    return ROPE_INIT_FUNCTIONS[kind](config, "cpu")


def hf_default_frequencies(base: float):
    return 1.0 / base ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM)


@pytest.mark.parametrize("name", list(CASES))
def test_scaled_frequencies_match_transformers(name):
    ours, theirs = CASES[name]
    expected, attention_factor = hf_inverse_frequencies(theirs)
    got = inverse_frequencies(HEAD_DIM, BASE, ours, max_position=2048)
    torch.testing.assert_close(got, expected.float(), rtol=1e-6, atol=0)
    assert RotaryEmbedding(HEAD_DIM, BASE, ours, 2048).attention_factor == pytest.approx(attention_factor)


def test_ntk_is_a_larger_base():
    """NTK-aware scaling by s = plain RoPE with base * s^(d/(d-2)); lowest frequency / s."""
    plain = inverse_frequencies(HEAD_DIM, BASE, RopeScaling(), 2048)
    ntk = inverse_frequencies(HEAD_DIM, BASE, RopeScaling("ntk", factor=4.0), 2048)
    expected = hf_default_frequencies(BASE * 4.0 ** (HEAD_DIM / (HEAD_DIM - 2)))
    torch.testing.assert_close(ntk, expected, rtol=1e-6, atol=0)
    assert ntk[0] == plain[0]
    assert ntk[-1].item() == pytest.approx(plain[-1].item() / 4.0, rel=1e-5)


@pytest.mark.parametrize("kind", ["linear", "ntk", "yarn", "llama3"])
def test_factor_one_is_plain_rope(kind):
    plain = inverse_frequencies(HEAD_DIM, BASE, RopeScaling(), 2048)
    scaled = inverse_frequencies(HEAD_DIM, BASE, RopeScaling(kind, factor=1.0, original_max_position=2048), 2048)
    torch.testing.assert_close(scaled, plain)


def test_scores_depend_only_on_relative_position():
    rope = RotaryEmbedding(HEAD_DIM, 10000.0, RopeScaling(), 4096)
    q = torch.randn(1, 1, 1, HEAD_DIM).double()
    k = torch.randn(1, 1, 1, HEAD_DIM).double()

    def score(m, n):
        cos_m, sin_m = rope(torch.tensor([[m]]), torch.float64)
        cos_n, sin_n = rope(torch.tensor([[n]]), torch.float64)
        return (apply_rotary(q, cos_m, sin_m) * apply_rotary(k, cos_n, sin_n)).sum().item()

    assert score(10, 3) == pytest.approx(score(1007, 1000), abs=1e-4)
    assert score(10, 3) != pytest.approx(score(10, 4), abs=1e-4)


def test_odd_head_dim_is_rejected():
    with pytest.raises(ValueError, match="even head_dim"):
        RotaryEmbedding(33, 10000.0, RopeScaling(), 2048)
