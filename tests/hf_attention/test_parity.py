"""longctx_<method> inside transformers models equals longctx's own model on the same
weights (import_hf), float64, for every family and rope type: `longctx_rope` equals HF
`sdpa`, and each method's change of the logits is far larger than its difference from
longctx's model. The difference that remains is transformers' own RoPE, whose angles are
float32 even in a float64 model (longctx computes them in float64): it is the same for
`rope`, where the method does nothing."""

import pytest
import torch

import longctx.hf_attention as hfa
from tests.hf_attention.helpers import FAMILIES, PARAMS, ROPES, build, method_of, own_method, own_model, tokens

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

BOUND = 5e-6
"""Largest |logit difference| from longctx's model: transformers' float32 RoPE angles
(about 1e-6 at these positions)."""
EFFECT_RATIO = 1e4
"""A method changes the logits at least this many times more than it differs from longctx."""

CASES = [(family, "default") for family in FAMILIES] + [("llama-tied", rope) for rope in ROPES if rope != "default"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(HF model, longctx model, HF sdpa logits) per case, built once."""
    built = {}
    for family, rope in CASES:
        model = build(family, rope)
        own = own_model(model, tmp_path_factory.mktemp(f"{family}-{rope}"))
        with torch.no_grad():
            built[family, rope] = (model, own, model(tokens()).logits)
    return built


@pytest.mark.parametrize(("family", "rope"), CASES)
def test_longctx_rope_equals_sdpa(models, family, rope):
    model, _, sdpa = models[family, rope]
    hfa.apply(model, "rope")
    assert model.config._attn_implementation == "longctx_rope"
    with torch.no_grad():
        assert torch.allclose(model(tokens()).logits, sdpa, rtol=0, atol=1e-12)


@pytest.mark.parametrize("arm", [arm for arm in PARAMS if arm != "rope"])
@pytest.mark.parametrize(("family", "rope"), CASES)
def test_each_method_equals_longctxs_model_and_its_effect_is_far_larger(models, family, rope, arm):
    model, own, sdpa = models[family, rope]
    ids = tokens()
    hfa.apply(model, method_of(arm), **PARAMS[arm])
    with torch.no_grad():
        got = model(ids).logits
        expected = own(ids, position_method=own_method(own, arm))
    difference = (got - expected).abs().max().item()
    effect = (got - sdpa).abs().max().item()
    assert difference <= BOUND, (arm, difference)
    assert effect >= EFFECT_RATIO * difference and effect > 1e-2, (arm, effect, difference)


def test_rope_difference_from_longctx_is_transformers_float32_angles(models):
    """The bound above is HF's own: plain sdpa differs from longctx's rope by as much."""
    _, own, sdpa = models["llama-tied", "default"]
    with torch.no_grad():
        plain = (own(tokens()) - sdpa).abs().max().item()
    assert 1e-8 < plain <= BOUND


def test_inverse_frequencies_are_the_models(models):
    from longctx.hf_attention.methods import inverse_frequencies

    for model, _, _ in models.values():
        hfa.apply(model, "string", **PARAMS["string"])
        assert torch.equal(inverse_frequencies(model.config), model.model.rotary_emb.inv_freq)
