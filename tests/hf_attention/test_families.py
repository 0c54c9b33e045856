"""longctx.hf_attention on the 2025-26 families (Qwen3, SmolLM3, Gemma 3, OLMo 2 and 3, Phi-3), tiny random
models from transformers' own config classes (tests/model/test_hf_families.py: GQA 4/2,
the family's norms with drawn weights, biases, tied and untied embeddings, sliding layers
with a window of 16 below prompts of 48-64 tokens, SmolLM3's NoPE layers), float64:

- `longctx_rope` equals transformers' `sdpa` (1e-12) and `eager` attention (within eager's
  float32 softmax, 5e-6);
- each method equals longctx's own model (import_hf) with that method on the same weights
  (within transformers' float32 RoPE angles, 5e-6), its change of the logits far larger:
  the method runs on the full layers that rotate, sliding and NoPE layers attend as trained
  (docs/design.md §8), and a method whose exact band is narrower than the window is refused;
- cached `generate` with the cache transformers builds (dynamic, whose sliding layers keep
  only their window, and static) equals a full forward, and a left-padded batch its rows alone.
"""

import pytest
import torch

import longctx.hf_attention as hfa
from longctx.errors import HFAttentionError
from longctx.model.hf import import_hf
from tests.hf_attention.helpers import method_of, own_method
from tests.model.test_hf_families import build as build_family

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

FAMILIES = ("qwen3-sliding", "smollm3", "smollm3-sliding", "gemma3", "olmo2", "olmo3", "phi3", "phi3-longrope")
"""tests/model/test_hf_families.CASES: Qwen3 with layers 2-3 sliding (window 16), SmolLM3 with
NoPE layers 1 and 3 (all full), SmolLM3's default layout with its NoPE layer 3 sliding,
Gemma 3 [sliding, full] x 2 (window 16, bases 10K / 1M, query_pre_attn_scalar 20), OLMo 2,
OLMo 3 [sliding, full] x 2 (window 16, a YaRN-scaled full RoPE), Phi-3 with fused projections
and Phi-4-mini's partial RoPE (the first 12 of 16 channels rotate), and with longrope on it
(short factors up to 32 positions, long past them): longctx_rope only, every other method
refused in one line (hf_attention/methods.check_model says why)."""
SLIDING = ("qwen3-sliding", "smollm3-sliding", "gemma3", "olmo3")
PARAMS = {
    "string": {"shift": 30, "local_window": 5},
    "rerope": {"window": 20, "log_scale_length": -1},
    "self_extend": {"neighbor_window": 16, "group_size": 4},
    "dca": {"chunk_size": 40, "local_window": 16},
    "string-repo": {"shift": 30, "local_window": 5, "compat": "repo"},
    "rope-repo": {"repo_score_scale": True},
    "ntk": {},
    "yarn": {},
}
"""Exact bands >= the window 16 (StRing's S = 30, ReRoPE's window without log scaling,
Self-Extend's neighbour window, DCA's local window); the repo temperature changes every
distance, so it runs only on models without sliding layers; ntk and yarn (STRING §4.2's
protocol against L = 256) rescale the full layers' RoPE only (Gemma 3's full_attention entry),
refused where sliding layers rotate with the same RoPE (Qwen3's)."""
TOKENS = 64
BOUND = 5e-6
"""transformers' float32 RoPE angles in a float64 model (tests/hf_attention/test_parity.py)."""


def tokens(rows: int = 2, length: int = TOKENS, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, 320, (rows, length), generator=torch.Generator().manual_seed(seed))


def build(family: str, implementation: str = "sdpa"):
    model = build_family(family, pad_token_id=0).double()
    model.set_attn_implementation(implementation)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None  # every step generates: rows compare token for token
    return model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(HF model, longctx's model on its weights, sdpa logits, eager logits) per family."""
    built = {}
    for family in FAMILIES:
        model = build(family)
        directory = tmp_path_factory.mktemp(family)
        model.save_pretrained(directory)
        with torch.no_grad():
            sdpa = model(tokens()).logits
            model.set_attn_implementation("eager")
            eager = model(tokens()).logits
            model.set_attn_implementation("sdpa")
        built[family] = (model, import_hf(directory, dtype=torch.float64).eval(), sdpa, eager)
    return built


@pytest.mark.parametrize("family", FAMILIES)
def test_longctx_rope_equals_eager(models, family):
    model, _, sdpa, eager = models[family]
    hfa.apply(model, "rope")
    with torch.no_grad():
        logits = model(tokens()).logits
    model.set_attn_implementation("sdpa")
    assert (logits - sdpa).abs().max() <= 1e-12
    assert (logits - eager).abs().max() <= 5e-6


def _own(own, arm: str):
    import tests.hf_attention.helpers as helpers

    saved = helpers.PARAMS.get(arm)
    helpers.PARAMS[arm] = PARAMS[arm]
    try:
        return own_method(own, arm)
    finally:
        helpers.PARAMS[arm] = saved


@pytest.mark.parametrize("arm", list(PARAMS))
@pytest.mark.parametrize("family", FAMILIES)
def test_each_method_equals_longctxs_model(models, family, arm):
    model, own, sdpa, _ = models[family]
    if family in SLIDING and arm.endswith("-repo"):
        with pytest.raises(HFAttentionError, match=r"sliding_window=16 sees them") as error:
            hfa.apply(model, method_of(arm), **PARAMS[arm])
        assert "\n" not in str(error.value)
        with pytest.raises(ValueError, match="sliding layers' window"):
            own(tokens(), position_method=_own(own, arm))
        return
    if family == "phi3-longrope":
        with pytest.raises(HFAttentionError, match=r"rope_type 'longrope' runs (under|plain) longctx_rope") as error:
            hfa.apply(model, method_of(arm), **PARAMS[arm])
        assert "\n" not in str(error.value)
        with pytest.raises(ValueError, match="not supported on longrope RoPE"):
            _own(own, arm)
        return
    if family == "phi3" and arm == "yarn":
        with pytest.raises(HFAttentionError, match="reads rope_type 'yarn' as longrope"):
            hfa.apply(model, arm)
        return
    if family == "qwen3-sliding" and arm in ("ntk", "yarn"):
        with pytest.raises(HFAttentionError, match=r"layer 2 slides and rotates with the full layers' RoPE"):
            hfa.apply(model, arm)
        return
    hfa.apply(model, method_of(arm), **PARAMS[arm])
    with torch.no_grad():
        got = model(tokens()).logits
        expected = own(tokens(), position_method=_own(own, arm))
    hfa.apply(model, "rope")  # restores the model's own RoPE after ntk / yarn
    model.set_attn_implementation("sdpa")
    difference = (got - expected).abs().max().item()
    effect = (got - sdpa).abs().max().item()
    assert difference <= BOUND, (arm, difference)
    assert effect >= 1e3 * difference and effect > 1e-2, (arm, effect, difference)


def test_a_method_narrower_than_the_window_is_refused_in_one_line(models):
    model = models["gemma3"][0]
    with pytest.raises(HFAttentionError, match=r"longctx_dca: .*below 8.*sliding_window=16") as error:
        hfa.apply(model, "dca", chunk_size=40, local_window=8)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("family", "overrides", "message"),
    [
        ("phi3-sliding", {}, "sliding_window=16 is shorter than the training length 256"),
        (
            "phi3",
            {
                "rope_parameters": {
                    "rope_type": "longrope",
                    "rope_theta": 1e4,
                    "partial_rotary_factor": 0.75,
                    "short_factor": [1.0] * 6,
                    "long_factor": [2.0] * 6,
                    "original_max_position_embeddings": 64,
                }
            },
            "rope_type 'longrope' runs under longctx_rope only: its frequencies switch with the forward's largest",
        ),
        ("gemma3", {"attn_logit_softcapping": 50.0}, "attn_logit_softcapping=50.0 is not supported"),
    ],
)
def test_layouts_and_ropes_not_reproduced_are_refused_in_one_line(family, overrides, message):
    model = build_family(family, **overrides)
    with pytest.raises(HFAttentionError, match="") as error:
        hfa.apply(model, "string", **PARAMS["string"])
    assert message in str(error.value) and "\n" not in str(error.value)


def generate(model, ids, mask=None, new: int = 10, **options):
    out = model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=new,
        do_sample=False,
        output_scores=True,
        return_dict_in_generate=True,
        **options,
    )
    return out.sequences, torch.stack(out.scores, dim=1).double()


def assert_cached_generate_is_consistent(model) -> None:
    """Prompts of 56 and 40 tokens, 10 new: cached generate (dynamic cache) equals a full
    forward, left-padded rows equal the rows alone, the static cache equals the dynamic."""
    rows = [tokens(1, 56, seed=2)[0], tokens(1, 40, seed=3)[0]]
    ids = torch.zeros(2, 56, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for index, row in enumerate(rows):
        ids[index, 56 - len(row) :], mask[index, 56 - len(row) :] = row, 1
    sequences, scores = generate(model, ids, mask)
    with torch.no_grad():
        full = model(sequences[:1]).logits[0, 55:-1].float().double()
    # generate hands out float32 scores: the cached steps equal the full forward to float32 rounding
    assert (scores[0] - full).abs().max() <= 1e-5
    for index, row in enumerate(rows):
        alone_sequences, alone_scores = generate(model, row[None])
        assert torch.equal(sequences[index, 56:], alone_sequences[0, len(row) :])
        assert (scores[index] - alone_scores[0]).abs().max() <= 1e-5
    _, static_scores = generate(model, ids, mask, cache_implementation="static")
    assert (static_scores - scores).abs().max() <= 1e-5


@pytest.mark.parametrize(
    ("family", "arm"),
    [(f, "string") for f in FAMILIES if f != "phi3-longrope"] + [("gemma3", "dca"), ("phi3-longrope", "rope")],
)
def test_cached_generate_equals_a_full_forward_and_padded_rows_equal_rows_alone(models, family, arm):
    """Prompts of 56 and 40 tokens (past the window 16), 10 new tokens: the dynamic cache's
    sliding layers keep 15 keys, the static cache's 16; both equal a full forward."""
    model = hfa.apply(models[family][0], method_of(arm), **PARAMS.get(arm, {}))
    assert_cached_generate_is_consistent(model)
    model.set_attn_implementation("sdpa")


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_longrope_generate_across_the_switch_equals_eager_and_longctxs_generate(models, cache):
    """Prompts of 20 tokens, 24 new: transformers re-runs the sequence at 33 tokens (its
    Phi-3 `generate`), so longctx_rope's scores equal eager's and longctx's own generate
    (model/inference/generation.py, which re-runs it too) gives the same tokens."""
    from longctx.model.inference.generation import generate as longctx_generate

    model, own, _, _ = models["phi3-longrope"]
    prompt = tokens(length=20)
    model.set_attn_implementation("eager")
    expected, eager = generate(model, prompt, new=24, cache_implementation=cache)
    hfa.apply(model, "rope")
    sequences, scores = generate(model, prompt, new=24, cache_implementation=cache)
    model.set_attn_implementation("sdpa")
    assert torch.equal(sequences, expected) and (scores - eager).abs().max() <= 1e-5
    ours = longctx_generate(own, prompt.tolist(), max_new_tokens=24, batch_size=2)
    assert torch.equal(torch.tensor([g.token_ids for g in ours]), sequences[:, 20:])
