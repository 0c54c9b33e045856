"""longctx.hf_attention inside transformers' linear-attention hybrids: OLMo Hybrid and Qwen3-Next
(tiny random models from transformers' own config classes, [linear, full] x 2: Gated DeltaNet
layers, which have no positions and never call the attention function, interleaved with full
attention layers), and Phi-3's partial RoPE, against independent references:

- `longctx_rope` equals transformers' eager attention (float64 and float32);
- each method equals a dense float64 reference run inside the same model, on the full layers
  one softmax over every (query m, key n) pair at the method's paper positions: q and k
  un-rotated from their own positions on the rotary channels only (Qwen3-Next rotates the
  first 25% of each head, Phi-3 75%; the other channels are a plain dot product), rotated by
  the relative position and multiplied. StRing, ReRoPE, Self-Extend, DCA: tests/model/helpers'
  P'[m][n]; DPE: tests/model/test_dpe's transcription of the authors' per-channel positions;
- the Gated DeltaNet layers are left untouched: the same modules, weights and forwards, and
  the layers before the first full layer give bitwise the outputs they give under eager;
- cached `generate` (the hybrid cache: recurrent and convolution states plus the full layers'
  keys) equals a full forward, a left-padded row its row alone, for each position-consistent method;
- OLMo Hybrid as released (rope_theta null: NoPE full layers) is rope-free: every method is
  refused in one line, at `apply` and at a forward of a model loaded with the name.
"""

import pytest
import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.masking_utils import eager_mask

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
from tests.model.test_dpe import released_channel_positions
from tests.model.test_hf_families import build as build_family

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

FAMILIES = ("olmo_hybrid", "qwen3_next", "phi3")
DPE_SCALES = {"olmo_hybrid": "1-2-4-8", "qwen3_next": "1-2-4-8", "phi3": "1-2-4"}
"""DPE's groups split the rotated pairs evenly: 8 (OLMo Hybrid, D = 16), 8 (Qwen3-Next, 25% of
D = 64), 6 (Phi-3, 75% of D = 16)."""
PARAMS = {
    "rope": {},
    "string": {"shift": 30, "local_window": 5},
    "rerope": {"window": 20, "log_scale_length": -1},
    "self_extend": {"neighbor_window": 16, "group_size": 4},
    "dca": {"chunk_size": 40, "local_window": 16},
    "dpe": {"local_window": 16},
}
RELATIVE = {
    "rope": rope_relative,
    "string": string_relative(30, 5),
    "rerope": rerope_relative(20),
    "self_extend": self_extend_relative(16, 4),
    "dca": dca_relative(40, 16),
}
"""Each method's parameters and (but DPE, per channel) its paper's P'[m][n]."""
TOKENS = 100
"""Past StRing's S = 30, ReRoPE's window, Self-Extend's groups, DPE's window and DCA's second chunk boundary (80)."""
BOUND = 5e-6
"""longctx_rope against eager in float64: eager's float32 softmax (tests/hf_attention/test_families.py)."""
BOUND_FP32 = 2e-5
"""float32 models (logits of 3-4): the kernels' float32 sums and eager's differ in order (measured 3e-6 to 6e-6)."""
REFERENCE_BOUND = 1e-10
"""A method against the dense reference, float64: both turn the q/k transformers rotated (with its float32
angles) by the same relative angles, so they differ by float64 sums in another order (measured 0 on the logits)."""
REFERENCE = "dense_reference_hybrid"
LINEAR = "linear_attention"
HYBRID_SHAPE = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=48,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    linear_num_key_heads=2,
    linear_key_head_dim=16,
    linear_conv_kernel_dim=4,
    initializer_range=0.1,
    pad_token_id=0,
    eos_token_id=None,
    bos_token_id=None,
)


def hybrid(family: str, dtype=torch.float64, **overrides):
    """A tiny random transformers hybrid, [linear, full] x 2, GQA 4/2, norms and biases drawn.
    olmo_hybrid: head dim 16, RoPE (base 10,000; `rope_theta=None` for the released NoPE form),
    q/k norms over all heads, 2 value heads of 32. qwen3_next: head dim 64 with RoPE on its
    first 16 channels (partial_rotary_factor 0.25, transformers' default), the doubled q_proj
    whose second half gates the output, per-head q/k norms, 4 value heads of 16 (more than the
    2 key heads), a dense MLP on layers 0-1 and 4 experts (2 per token, a shared expert) on 2-3."""
    import transformers

    if family == "olmo_hybrid":
        shape = dict(
            layer_types=[LINEAR, "full_attention"] * 2,
            linear_num_value_heads=2,
            linear_value_head_dim=32,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        )
        config = transformers.OlmoHybridConfig(**{**HYBRID_SHAPE, **shape, **overrides})
    else:
        shape = dict(
            full_attention_interval=2,
            head_dim=64,
            linear_num_value_heads=4,
            linear_value_head_dim=16,
            mlp_only_layers=[0, 1],
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=16,
        )
        config = transformers.Qwen3NextConfig(**{**HYBRID_SHAPE, **shape, **overrides})
        config._experts_implementation = "eager"  # grouped_mm has no float64
    torch.manual_seed(0)
    model = getattr(transformers, f"{type(config).__name__.removesuffix('Config')}ForCausalLM")(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(".bias") or "norm" in name:
                parameter.add_(torch.randn_like(parameter) * 0.3)
    model = model.to(dtype)
    model.set_attn_implementation("eager")
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    return model


def build(family: str, dtype=torch.float64):
    if family in ("olmo_hybrid", "qwen3_next"):
        return hybrid(family, dtype)
    model = build_family(family, pad_token_id=0, eos_token_id=None).to(dtype)
    model.set_attn_implementation("eager")
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    return model


def tokens(rows: int = 2, length: int = TOKENS, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, 320, (rows, length), generator=torch.Generator().manual_seed(seed))


def dpe_relative(local_window: int, scales: str, rotated: int):
    """DPE's relative position per rotated pair: the authors' query index minus key index."""
    factors = [int(scale) for scale in scales.split("-")]
    groups = [g * (rotated // 2) // len(factors) for g in range(len(factors) + 1)]

    def relative(m: int, n: int) -> list[float]:
        query, key = released_channel_positions(m, n, local_window, factors, groups, rotated, TOKENS - 1)
        return [q - k for q, k in zip(query[: rotated // 2], key[: rotated // 2], strict=True)]

    return relative


def per_pair_reference(q, k, v, relative, frequencies, score_factor):
    """dense_reference with a relative position per frequency pair: softmax over the keys
    n <= m of <q rotated by relative(m, n)_i theta_i on pair i, k> x score_factor / sqrt(D)."""
    length, heads, dim = q.shape[1:]
    k = k.repeat_interleave(heads // k.shape[2], dim=2)
    v = v.repeat_interleave(heads // v.shape[2], dim=2)
    pairs = frequencies.shape[0]
    out = torch.zeros_like(q)
    for m in range(length):
        positions = torch.zeros(m + 1, dim // 2, dtype=torch.float64)
        for n in range(m + 1):
            positions[n, :pairs] = torch.tensor(relative(m, n), dtype=torch.float64)
        angles = positions * torch.cat([frequencies, frequencies.new_zeros(dim // 2 - pairs)])
        rotated = rotate(q[:, m, None], angles[None, :, None, :])  # [B, m + 1, H, D]
        scores = (rotated * k[:, : m + 1]).sum(-1) * score_factor / dim**0.5  # [B, m + 1, H]
        out[:, m] = torch.einsum("bnh,bnhd->bhd", scores.softmax(1), v[:, : m + 1])
    return out


def pairs_first(x: torch.Tensor, rotated: int) -> torch.Tensor:
    """x [..., D] with the rotary channels' pairs (i, i + R/2) moved to (i, i + D/2) and the
    pass-through channels paired after them (frequency 0: never rotated); dot products are unchanged."""
    dim, half, rest = x.shape[-1], rotated // 2, (x.shape[-1] - rotated) // 2
    order = [*range(half), *range(rotated, rotated + rest), *range(half, rotated), *range(rotated + rest, dim)]
    return x[..., order]


def reference_logits(model, arm: str, family: str, pairing: str = "rotary channels") -> torch.Tensor:
    """The model's logits on tokens() with the dense reference of `arm` on every layer that
    calls the attention function (the full layers). pairing 'whole head': the un-rotation
    pairs channel i with i + D/2 instead of i + R/2 (a partial-RoPE bug, for the control)."""
    frequencies = model.model.rotary_emb.inv_freq.double()
    rotated = 2 * frequencies.shape[0]

    def attention(module, query, key, value, attention_mask, scaling, **kwargs):
        batch, _, length, dim = query.shape
        positions = torch.arange(length).expand(batch, -1)
        back = -positions[:, :, None, None].double() * frequencies  # un-rotate from the own positions

        def unrotated(x):
            x = x.transpose(1, 2).double()
            if pairing == "whole head":
                return rotate(x, torch.cat([back, back.new_zeros(*back.shape[:-1], (dim - rotated) // 2)], dim=-1))
            return pairs_first(torch.cat([rotate(x[..., :rotated], back), x[..., rotated:]], dim=-1), rotated)

        q, k, v = unrotated(query), unrotated(key), value.transpose(1, 2)
        if arm == "dpe":
            relative = dpe_relative(PARAMS["dpe"]["local_window"], DPE_SCALES[family], rotated)
            return per_pair_reference(q, k, v, relative, frequencies, scaling * dim**0.5), None
        full_frequencies = torch.cat([frequencies, frequencies.new_zeros(dim // 2 - rotated // 2)])
        documents = torch.zeros_like(positions)
        out = dense_reference(
            q, k, v, positions, documents, RELATIVE[arm], full_frequencies, score_factor=scaling * dim**0.5
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


def params(family: str, arm: str) -> dict:
    return {**PARAMS[arm], "scale_factors": DPE_SCALES[family]} if arm == "dpe" else PARAMS[arm]


@pytest.fixture(scope="module")
def models():
    """(model, eager logits) per family, float64."""
    built = {}
    for family in FAMILIES:
        model = build(family)
        with torch.no_grad():
            built[family] = (model, model(tokens()).logits)
    return built


@pytest.mark.parametrize("family", FAMILIES)
def test_the_reference_harness_equals_eager(models, family):
    """Under RoPE's P' the reference's un-rotation (rotary channels only) and channel pairing reproduce eager."""
    model, eager = models[family]
    assert (reference_logits(model, "rope", family) - eager).abs().max() <= BOUND  # eager's float32 softmax
    assert eager.abs().max() > 1.0


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_longctx_rope_equals_eager(models, family, dtype):
    """And transformers' sdpa within 1e-12 in float64 (both float64 softmaxes)."""
    model = models[family][0] if dtype == torch.float64 else build(family, dtype)
    with torch.no_grad():
        eager = model(tokens()).logits
        model.set_attn_implementation("sdpa")
        sdpa = model(tokens()).logits
    hfa.apply(model, "rope")
    try:
        with torch.no_grad():
            logits = model(tokens()).logits
    finally:
        model.set_attn_implementation("eager")
    assert (logits - eager).abs().max() <= (BOUND if dtype == torch.float64 else BOUND_FP32)
    if dtype == torch.float64:
        assert (logits - sdpa).abs().max() <= 1e-12


@pytest.mark.parametrize("arm", [arm for arm in PARAMS if arm != "rope"])
@pytest.mark.parametrize("family", FAMILIES)
def test_each_method_equals_the_dense_reference(models, family, arm):
    model, eager = models[family]
    expected = reference_logits(model, arm, family)
    hfa.apply(model, arm, **params(family, arm))
    try:
        with torch.no_grad():
            got = model(tokens()).logits
    finally:
        model.set_attn_implementation("eager")
    difference = (got - expected).abs().max().item()
    effect = (got - eager).abs().max().item()
    assert difference <= REFERENCE_BOUND, (arm, difference)
    assert effect > 0.5, (arm, effect, difference)
    if family != "olmo_hybrid" and arm == "string":  # rewritten distances on pairs (i, i + D/2): caught
        assert (reference_logits(model, arm, family, pairing="whole head") - got).abs().max() > 1e-2


@pytest.mark.parametrize("family", ["olmo_hybrid", "qwen3_next"])
def test_the_linear_attention_layers_are_left_untouched(models, family):
    """StRing installed: the Gated DeltaNet modules are the same objects with the same
    weights, buffers, forward and hooks, the attention function runs on the full layers
    only, and layer 0 (linear, before any full layer) gives bitwise its eager output."""
    model, _ = models[family]
    linear = {name: module for name, module in model.named_modules() if name.endswith("linear_attn")}
    assert sorted(linear) == ["model.layers.0.linear_attn", "model.layers.2.linear_attn"]
    before = {name: {k: t.clone() for k, t in module.state_dict().items()} for name, module in linear.items()}
    outputs: dict[str, list[torch.Tensor]] = {"eager": [], "string": []}
    calls: list[int] = []

    def run(label: str) -> None:
        handle = model.model.layers[0].register_forward_hook(lambda _m, _i, out: outputs[label].append(out))
        try:
            with torch.no_grad():
                model(tokens())
        finally:
            handle.remove()

    run("eager")
    hfa.apply(model, "string", **PARAMS["string"])
    counting = [
        layer.self_attn.register_forward_pre_hook(lambda module, _args: calls.append(module.layer_idx))
        for layer in model.model.layers
        if hasattr(layer, "self_attn")
    ]
    try:
        run("string")
    finally:
        for handle in counting:
            handle.remove()
        model.set_attn_implementation("eager")
    assert calls == [1, 3]
    assert torch.equal(outputs["string"][0], outputs["eager"][0])
    for name, module in model.named_modules():
        if name in linear:
            assert module is linear[name] and "forward" not in vars(module)
            assert not module._forward_hooks and not module._forward_pre_hooks
            after = module.state_dict()
            assert after.keys() == before[name].keys()
            assert all(torch.equal(after[k], before[name][k]) for k in after)


@pytest.mark.parametrize(
    ("family", "arm"),
    [
        ("olmo_hybrid", "string"),
        ("olmo_hybrid", "dpe"),
        ("qwen3_next", "string"),
        ("qwen3_next", "dca"),
        ("qwen3_next", "self_extend"),
        ("qwen3_next", "dpe"),
        ("phi3", "dpe"),
    ],
)
def test_cached_generate_equals_a_full_forward_and_padded_rows_equal_rows_alone(models, family, arm):
    """Prompts of 56 and 40 tokens (past StRing's S, DCA's first chunk, Self-Extend's and
    DPE's windows), 10 new tokens; dynamic and static caches."""
    model = hfa.apply(models[family][0], arm, **params(family, arm))
    try:
        assert_cached_generate_is_consistent(model)
    finally:
        model.set_attn_implementation("eager")


def test_released_olmo_hybrid_is_rope_free_and_every_method_is_refused_in_one_line(tmp_path):
    """rope_theta null (the released checkpoints): transformers builds no rotary embedding and
    the full layers are NoPE, so no method has anything to act on, ntk / yarn included."""
    import transformers

    model = hybrid("olmo_hybrid", rope_parameters={"rope_type": "default", "rope_theta": None})
    assert model.model.rotary_emb is None
    for method in hfa.METHODS:
        with pytest.raises(HFAttentionError) as error:
            hfa.apply(model, method)
        message = str(error.value)
        assert message.startswith(f"longctx_{method}: olmo_hybrid is a rope-free model (rope_theta=None")
        assert "nothing to act on" in message and "\n" not in message
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="longctx_string")
    with pytest.raises(HFAttentionError, match=r"^longctx_string: olmo_hybrid is a rope-free model"):
        loaded(tokens())


@pytest.mark.parametrize("family", ["olmo_hybrid", "qwen3_next"])
def test_ntk_and_yarn_equal_transformers_own_model_with_their_rope(models, family):
    """The rope-kind methods rewrite the full layers' RoPE (Qwen3-Next's partial factor kept);
    the model equals one built by transformers with those rope parameters, and `rope` restores it."""
    model, eager = models[family]
    for method in ("ntk", "yarn"):
        hfa.apply(model, method)
        edited = dict(model.config.rope_parameters)
        assert edited.get("partial_rotary_factor") == (0.25 if family == "qwen3_next" else None)
        with torch.no_grad():
            got = model(tokens()).logits
        fresh = hybrid(family, rope_parameters=edited)
        fresh.load_state_dict(model.state_dict())
        with torch.no_grad():
            expected = fresh(tokens()).logits
        assert (got - expected).abs().max() <= 1e-12
        assert (got - eager).abs().max() > 1e-2
    hfa.apply(model, "rope")
    model.set_attn_implementation("eager")
    with torch.no_grad():
        assert (model(tokens()).logits - eager).abs().max() <= 1e-12


def test_a_model_whose_full_layers_are_all_nope_is_rope_free_too():
    """SmolLM3 with every layer NoPE (`no_rope_layers` all 0): RoPE configured, nothing rotates."""
    model = build_family("smollm3", no_rope_layers=[0, 0, 0, 0])
    with pytest.raises(HFAttentionError) as error:
        hfa.apply(model, "string", **PARAMS["string"])
    assert str(error.value).startswith(
        "longctx_string: smollm3 is a rope-free model (every full attention layer is NoPE): no full attention layer"
    )
