"""model/layer_attention.py: the one place that decides each layer design's mask and
passes. What it decides is read off the config by hand here (which layers slide, rotate,
run the method, scale their queries), not from the module; the numbers those decisions
produce are checked against float64 references elsewhere (test_sliding_layers.py,
test_sinks_temperature.py, test_decode_step.py)."""

import pytest
import torch

from longctx.config.model import AttentionTemperature, ModelConfig
from longctx.config.position_methods import PositionMethodConfig
from longctx.model.inference.step import Step
from longctx.model.layer_attention import Dense, LayerAttention, SequenceKeys, check_forward
from longctx.model.llama import Llama
from longctx.model.position_methods import MethodPositions, build_position_method

LAYERS = ["sliding", "full", "sliding", "full"]
"""Layers 0-3; with nope_layers [3]: full RoPE 1, sliding RoPE 0 and 2, full NoPE 3."""


def hybrid_model(**overrides) -> Llama:
    values = dict(n_layers=4, layer_types=LAYERS, sliding_window=4, nope_layers=[3], max_position=64) | overrides
    return Llama(ModelConfig.from_preset("debug", **values))


def decisions(model: Llama, method=None) -> list:
    """Each layer's Positions for a training/prefill forward of 8 tokens."""
    positions = torch.arange(8)[None]
    documents = torch.zeros(1, 8, dtype=torch.long)
    keys = SequenceKeys(positions, documents, "sdpa")
    ropes = {"full": model.rope, "sliding": model.sliding_rope}
    built = LayerAttention(model.config, ropes, positions, keys, torch.float32, method).all_layers(model.layer_specs)
    return [built[spec] for spec in model.layer_specs]


def test_each_design_gets_its_window_and_rotation_and_shares_it():
    layers = decisions(hybrid_model())
    assert all(isinstance(layer, Dense) for layer in layers)
    assert [layer.mask.window for layer in layers] == [4, 0, 4, 0]
    assert [layer.cos is not None for layer in layers] == [True, True, True, False]
    assert layers[0] is layers[2]  # one design, one Positions
    assert layers[1].mask is layers[3].mask  # one window, one mask


def test_a_method_runs_on_the_full_rope_layer_only():
    model = hybrid_model()
    method = build_position_method(
        PositionMethodConfig().with_params("string", dict(shift=6, local_window=2)), model.config
    )
    layers = decisions(model, method)
    assert [type(layer) for layer in layers] == [Dense, MethodPositions, Dense, Dense]


def test_the_temperature_scales_the_layers_it_applies_to():
    model = hybrid_model(attn_temperature=AttentionTemperature(type="ssmax", layers="nope"))
    assert [layer.factor is not None for layer in decisions(model)] == [False, False, False, True]


def test_a_decoding_step_decides_steps_for_every_design():
    model = hybrid_model()
    cache = model.new_kv_cache(1, 16)
    seen = []
    hooks = [block.attn.register_forward_pre_hook(lambda _, args: seen.append(args[1])) for block in model.blocks]
    with torch.no_grad():
        model(torch.randint(0, 64, (1, 6)), kv_cache=cache)
        seen.clear()
        model(torch.randint(0, 64, (1, 1)), kv_cache=cache)
    for hook in hooks:
        hook.remove()
    assert all(isinstance(layer, Step) for layer in seen)
    assert [layer.query_cos is not None for layer in seen] == [True, True, True, False]


def test_sinks_and_a_method_are_refused_together():
    config = ModelConfig.from_preset("debug", attention_sinks=True)
    method = build_position_method(PositionMethodConfig(name="rope"), config)
    with pytest.raises(ValueError, match="does not carry model.attention_sinks"):
        check_forward(config, config.layer_specs(), "sdpa", method)


def test_decode_step_refuses_what_is_no_fixed_shape_step():
    model = hybrid_model(layer_types=None, sliding_window=0, nope_layers=None)
    cache = model.new_kv_cache(1, 16)
    method = build_position_method(PositionMethodConfig(name="rerope"), model.config)
    with pytest.raises(ValueError, match=r"decode_step takes one token.*\(1, 2\)"):
        model.decode_step(torch.zeros(1, 2, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="position method 'rerope'"):
        model.decode_step(torch.zeros(1, 1, dtype=torch.long), cache, position_method=method)
