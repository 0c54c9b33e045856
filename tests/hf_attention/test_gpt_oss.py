"""longctx.hf_attention on gpt-oss: a tiny random GptOssForCausalLM (transformers computes its
experts), float64, with sinks on every layer, [sliding, full] x 2 with a window of 16 and
YaRN (truncate false) on every layer, against independent references:

- `longctx_rope` equals transformers' eager attention (sinks in every softmax);
- each method equals a dense float64 reference run inside the same model: transformers'
  own eager attention on the sliding layers (left as trained, docs/design.md §8), and on
  the full layers one softmax over every (query m, key n) pair at the paper's P'[m][n]
  (tests/model/helpers: the rotation at P' of q and k un-rotated from their positions,
  the model's YaRN frequencies, its attention scaling left on q and k) plus one column of
  logit s_h and value 0 (the sink, once). It knows nothing of passes, merges or plans;
- methods whose exact band is narrower than the window (StRing-repo's temperature,
  ReRoPE's log-n scaling, a DCA window of 8) and the rope-kind ntk / yarn (the sliding
  layers rotate with the full layers' RoPE) are refused in one line;
- cached `generate` with the cache transformers builds (dynamic, whose sliding layers
  keep 15 keys, and static) equals a full forward, a left-padded row its row alone.
"""

import pytest
import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.masking_utils import eager_mask
from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

import longctx.hf_attention as hfa
from longctx.errors import HFAttentionError
from tests.hf_attention.test_families import assert_cached_generate_is_consistent
from tests.model.helpers import (
    dca_relative,
    dense_reference,
    rerope_relative,
    rope_relative,
    rotate,
    self_extend_relative,
    string_relative,
)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

PARAMS = {
    "rope": ({}, rope_relative),
    "string": ({"shift": 30, "local_window": 5}, string_relative(30, 5)),
    "rerope": ({"window": 20, "log_scale_length": -1}, rerope_relative(20)),
    "self_extend": ({"neighbor_window": 16, "group_size": 4}, self_extend_relative(16, 4)),
    "dca": ({"chunk_size": 40, "local_window": 16}, dca_relative(40, 16)),
}
"""Each method's parameters (exact bands >= the window 16) and its paper's P'[m][n]."""
TOKENS = 100
"""Past StRing's S = 30, ReRoPE's window, Self-Extend's groups and DCA's second chunk boundary (80)."""
BOUND = 5e-6
"""transformers' float32 RoPE angles in a float64 model (tests/hf_attention/test_parity.py)."""
REFERENCE = "dense_reference_gpt_oss"


def gpt_oss():
    """A tiny gpt-oss (4 experts, 2 per token): sinks on every layer, [sliding, full] x 2 with
    a window of 16, YaRN with truncate false, GQA 4/2, q/k/v/o biases; eager in float64
    (transformers' gpt-oss has no sdpa)."""
    import transformers

    config = transformers.GptOssConfig(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=48,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=16,
        layer_types=["sliding_attention", "full_attention"] * 2,
        max_position_embeddings=256,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
        },
        initializer_range=0.1,
        pad_token_id=0,
        eos_token_id=None,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    config._experts_implementation = "eager"  # grouped_mm has no float64
    model = transformers.GptOssForCausalLM(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(("bias", "sinks")) or "norm" in name:
                parameter.add_(torch.randn_like(parameter) * 0.5)
    model = model.double()
    model.set_attn_implementation("eager")
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    return model


def tokens(rows: int = 2, length: int = TOKENS, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, 320, (rows, length), generator=torch.Generator().manual_seed(seed))


def reference_logits(model, arm: str) -> torch.Tensor:
    """The model's logits on tokens() with the dense reference of `arm` as its attention."""
    frequencies = model.model.rotary_emb.inv_freq.double()
    relative = PARAMS[arm][1]

    def attention(module, query, key, value, attention_mask, scaling, sliding_window=None, s_aux=None, **kwargs):
        if sliding_window is not None:  # a sliding layer attends as trained: transformers' own eager
            return eager_attention_forward(module, query, key, value, attention_mask, scaling=scaling)
        batch, _, length, dim = query.shape
        positions = torch.arange(length).expand(batch, -1)
        back = -positions[:, :, None, None].double() * frequencies  # un-rotate from the own positions
        q, k = (rotate(x.transpose(1, 2), back) for x in (query, key))
        out = dense_reference(
            q,
            k,
            value.transpose(1, 2),
            positions,
            torch.zeros_like(positions),
            relative,
            frequencies,
            score_factor=scaling * dim**0.5,
            sinks=s_aux,
        )
        return out, None

    AttentionInterface.register(REFERENCE, attention)
    AttentionMaskInterface.register(REFERENCE, eager_mask)
    model.set_attn_implementation(REFERENCE)
    try:
        with torch.no_grad():
            return model(tokens()).logits
    finally:
        model.set_attn_implementation("eager")


@pytest.fixture(scope="module")
def model_and_eager():
    model = gpt_oss()
    with torch.no_grad():
        eager = model(tokens()).logits
    return model, eager


def test_the_sinks_matter_and_the_reference_harness_equals_eager(model_and_eager):
    """The reference's un-rotation, sink column and sliding layers reproduce eager under RoPE's P'."""
    model, eager = model_and_eager
    assert (reference_logits(model, "rope") - eager).abs().max() <= BOUND
    zero_sinks = gpt_oss()
    with torch.no_grad():
        for layer in zero_sinks.model.layers:
            layer.self_attn.sinks.zero_()
        assert (zero_sinks(tokens()).logits - eager).abs().max() > 1e-2


@pytest.mark.parametrize("arm", list(PARAMS))
def test_each_method_with_sinks_equals_the_dense_reference(model_and_eager, arm):
    model, eager = model_and_eager
    expected = reference_logits(model, arm)
    hfa.apply(model, arm, **PARAMS[arm][0])
    try:
        with torch.no_grad():
            got = model(tokens()).logits
    finally:
        model.set_attn_implementation("eager")
    difference = (got - expected).abs().max().item()
    assert difference <= BOUND, (arm, difference)
    if arm == "rope":
        assert (got - eager).abs().max() <= 1e-10
        return
    effect = (got - eager).abs().max().item()
    assert effect >= 1e3 * difference and effect > 1e-2, (arm, effect, difference)


@pytest.mark.parametrize(
    ("method", "params", "message"),
    [
        ("string", {"shift": 30, "local_window": 5, "compat": "repo"}, r"below 0.*sliding_window=16 sees them"),
        ("rope", {"repo_score_scale": True}, r"below 0.*sliding_window=16 sees them"),
        ("rerope", {"window": 20}, r"below 0.*sliding_window=16 sees them"),
        ("dca", {"chunk_size": 40, "local_window": 8}, r"below 8.*sliding_window=16 sees them"),
        ("ntk", {}, r"layer 0 slides and rotates with the full layers' RoPE"),
        ("yarn", {}, r"layer 0 slides and rotates with the full layers' RoPE"),
    ],
)
def test_methods_the_hybrid_cannot_reproduce_are_refused_in_one_line(method, params, message):
    with pytest.raises(HFAttentionError, match=rf"longctx_{method}: .*{message}") as error:
        hfa.apply(gpt_oss(), method, **params)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("arm", list(PARAMS))
def test_cached_generate_equals_a_full_forward_and_padded_rows_equal_rows_alone(arm):
    """Prompts of 56 and 40 tokens (past the window 16, StRing's S, ReRoPE's window and DCA's
    first chunk), 10 new tokens; dynamic and static caches."""
    model = hfa.apply(gpt_oss(), arm, **PARAMS[arm][0])
    assert_cached_generate_is_consistent(model)


def test_gpt_oss_20bs_geometry_runs_the_methods_at_their_defaults_but_rerope_with_log_scaling():
    """transformers' default GptOssConfig is gpt-oss-20b's (L = 131,072, window 128, YaRN x32
    from 4,096): StRing's S = L/3 and the baselines' protocol bands cover the window; ReRoPE's
    log-n scaling (on by default) changes every distance and is refused until switched off."""
    import transformers

    from longctx.hf_attention.methods import CONFIG_KEY, method_for

    config = transformers.GptOssConfig()
    assert (config.max_position_embeddings, config.sliding_window) == (131072, 128)
    exact = {method: method_for(config, method).exact_below for method in ("string", "self_extend", "dca")}
    assert exact == {"string": 43691, "self_extend": 21844, "dca": 10922}
    with pytest.raises(HFAttentionError, match=r"longctx_rerope: .*below 0.*sliding_window=128") as error:
        method_for(config, "rerope")
    assert "\n" not in str(error.value)
    setattr(config, CONFIG_KEY, {"name": "rerope", "training_length": 131072, "params": {"log_scale_length": -1}})
    assert method_for(config, "rerope").exact_below == 10922
