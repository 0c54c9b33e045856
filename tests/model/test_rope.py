"""RoPE frequencies vs Hugging Face's implementations, and the relative-position property."""

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from longctx.config.model import ModelConfig
from longctx.model.llama import Llama
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


@pytest.mark.parametrize(("head_dim", "base"), [(64, 10000.0), (64, 500000.0), (128, 10000.0)])
def test_bf16_true_model_rotates_with_fp32_frequencies_up_to_128k(head_dim, base):
    """Lightning's `bf16-true` (default dtype bf16 while the model is built, then
    `module.to(bfloat16)`) must not round theta_i. Reference: angles m * theta_i in float64.
    Bound from fp32 theory: theta_i carries a relative error <= 2^-24, the product m * theta_i
    another <= 2^-24, so |angle error| <= m * theta_i * 2^-23 (times 1.01); cos/sin are
    1-Lipschitz and fp32 evaluates them to ~1 ulp (4e-6 absolute allowed). bf16 theta_i
    (8 mantissa bits) misses this by radians at m = 131,071."""
    from lightning.pytorch.plugins.precision import HalfPrecision

    precision = HalfPrecision("bf16-true")
    config = ModelConfig.from_preset(
        "debug", d_model=head_dim * 2, n_heads=2, n_kv_heads=1, rope_base=base, max_position=131072
    )
    with precision.module_init_context():
        model = Llama(config)
    model = precision.convert_module(model)
    assert model.tok_embeddings.weight.dtype == torch.bfloat16
    positions = torch.tensor([[0, 1, 2047, 2048, 32767, 65535, 100003, 131071]])
    cos, sin = model.rope(positions, torch.bfloat16)
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    theta = 1.0 / base**exponents
    angles = positions.double()[..., None] * theta
    angles = torch.cat([angles, angles], dim=-1)
    bound = angles * 2.0**-23 * 1.01 + 4e-6
    assert cos.dtype == sin.dtype == torch.float32
    assert ((cos.double() - angles.cos()).abs() <= bound).all()
    assert ((sin.double() - angles.sin()).abs() <= bound).all()


def test_dtype_casts_leave_frequencies_bitwise_unchanged():
    """fp32 numerics must not move (the golden loss curve): after any cast or round trip the
    frequencies are exactly the constructor's."""
    rope = RotaryEmbedding(HEAD_DIM, BASE, RopeScaling("llama3", factor=8.0, original_max_position=8192), 131072)
    before = rope.inv_freq.clone()
    for cast in (torch.bfloat16, torch.float16, torch.float32):
        rope.to(cast)
        assert rope.inv_freq.dtype == torch.float32
        assert torch.equal(rope.inv_freq, before)
    rope.to(torch.float64)
    assert torch.equal(rope.inv_freq, before)
