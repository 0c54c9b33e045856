"""model.rope_position_scale: every RoPE frequency times s (position ids times s).

References: the rotation of each channel pair written out by hand in float64; the same
model fed position ids times s; the frequencies of plain RoPE for s = 1 (bitwise)."""

import math

import pytest
import torch

from longctx.config.model import ModelConfig
from longctx.config.position_methods import NtkConfig, PositionMethodConfig
from longctx.errors import CheckpointError, ConfigError
from longctx.model.hf_config import hf_config
from longctx.model.llama import Llama
from longctx.model.position_methods.method import build_position_method
from longctx.model.rope import RopeScaling, RotaryEmbedding, apply_rotary, inverse_frequencies


def hand_rotation(x: list[float], position: int, base: float, scale: float) -> list[float]:
    """Rotate pair (j, j + d/2) of x by position * scale * base^(-2j/d), one pair at a time."""
    half = len(x) // 2
    out = list(x)
    for j in range(half):
        angle = position * scale * base ** (-2 * j / len(x))
        a, b = x[j], x[j + half]
        out[j] = a * math.cos(angle) - b * math.sin(angle)
        out[j + half] = a * math.sin(angle) + b * math.cos(angle)
    return out


@pytest.mark.parametrize("scale", [0.5, 1.0, 2.0, 4.0])
def test_rotation_matches_the_hand_computed_one(scale):
    x = [0.3, -1.2, 0.7, 2.0, -0.4, 1.1, 0.9, -0.6]
    base = 100.0
    rope = RotaryEmbedding(len(x), base, RopeScaling(), 512, position_scale=scale)
    for position in (0, 1, 7, 300):
        cos, sin = rope(torch.tensor([[position]]), torch.float64)
        got = apply_rotary(torch.tensor(x, dtype=torch.float64).view(1, 1, 1, -1), cos, sin).flatten().tolist()
        # theta_i is kept in float32 (rope.py): a relative error <= 2^-24 on each angle.
        tolerance = position * scale * 2.0**-23 + 1e-12
        assert got == pytest.approx(hand_rotation(x, position, base, scale), abs=tolerance * 3)


def test_scale_one_is_bitwise_plain_rope():
    exponents = torch.arange(0, 32, 2, dtype=torch.float64) / 32
    plain = (1.0 / 10000.0**exponents).float()
    assert torch.equal(inverse_frequencies(32, 10000.0, RopeScaling(), 512, position_scale=1.0), plain)
    torch.manual_seed(0)
    default = Llama(ModelConfig.from_preset("debug", vocab_size=64))
    torch.manual_seed(0)
    explicit = Llama(ModelConfig.from_preset("debug", vocab_size=64, rope_position_scale=1.0))
    ids = torch.randint(0, 64, (2, 40))
    head_exponents = torch.arange(0, default.config.head_size, 2, dtype=torch.float64) / default.config.head_size
    assert torch.equal(default.rope.inv_freq, (1.0 / 10000.0**head_exponents).float())
    assert torch.equal(default(ids), explicit(ids))


def test_scale_two_is_the_model_at_doubled_positions():
    """Frequencies x 2 == position ids x 2, bitwise: a power of two scales exactly in float."""
    torch.manual_seed(0)
    plain = Llama(ModelConfig.from_preset("debug", vocab_size=64))
    scaled = Llama(ModelConfig.from_preset("debug", vocab_size=64, rope_position_scale=2.0))
    scaled.load_state_dict(plain.state_dict())
    ids = torch.randint(0, 64, (2, 40))
    positions = torch.arange(40).expand(2, 40)
    assert torch.equal(scaled(ids, position_ids=positions), plain(ids, position_ids=2 * positions))
    assert not torch.equal(scaled(ids), plain(ids))


def test_fastest_pair_aliases_above_pi():
    """At s = 2 pi the fastest pair turns a full circle per token: offsets 0 and 1 look alike
    in it, while at s = 2 they do not."""
    for scale, same in ((2 * math.pi, True), (2.0, False)):
        cos, _ = RotaryEmbedding(8, 10000.0, RopeScaling(), 64, position_scale=scale)(
            torch.tensor([[0, 1]]), torch.float64
        )
        assert (abs(cos[0, 1, 0].item() - cos[0, 0, 0].item()) < 1e-6) is same


def test_position_methods_keep_the_scale():
    config = ModelConfig.from_preset("debug", vocab_size=64, rope_position_scale=4.0)
    plain = inverse_frequencies(config.head_size, config.rope_base, RopeScaling(), config.max_position)
    for name in ("rope", "string", "ntk"):
        method = build_position_method(PositionMethodConfig(name=name, ntk=NtkConfig(factor=2.0)), config)
        if name == "ntk":
            ntk = inverse_frequencies(config.head_size, config.rope_base, RopeScaling("ntk", factor=2.0), 512)
            torch.testing.assert_close(method.rotary.inv_freq, ntk * 4)
        else:
            torch.testing.assert_close(method.rotary.inv_freq, plain * 4)


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_non_positive_scale_is_rejected(bad):
    with pytest.raises(ConfigError, match="model.rope_position_scale"):
        ModelConfig.from_preset("debug", rope_position_scale=bad)


def test_export_refuses_a_scaled_model():
    with pytest.raises(CheckpointError, match="rope_position_scale"):
        hf_config(ModelConfig.from_preset("debug", rope_position_scale=2.0))
