"""The model-family registry (model/families/) on tiny random models that transformers
builds and saves: each family's import equals transformers' logits (float32 within 1e-4,
the logits several units; float64 within 1e-5: transformers computes the RoPE angles in
float32 even in a float64 model), with a prompt longer than any sliding
window; greedy decoding through longctx's KV cache gives transformers' tokens; the
families export writes reload in transformers with equal logits."""

import json

import pytest
import torch

from longctx.errors import CheckpointError
from longctx.model.hf import export_hf, import_hf
from tests.model.helpers import assert_import_matches_transformers, random_hf_model, random_ids

transformers = pytest.importorskip("transformers")

SHAPE = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    initializer_range=0.1,  # logits of several units: a wrong norm or scale is far above 1e-4
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
TOLERANCE = 1e-4
TOLERANCE_FP64 = 1e-5
PROMPT = 48
"""Tokens: past every sliding window below (16)."""

CASES = {
    # Qwen3: per-head qk-norm, head_dim 24 decoupled from 64 / 4, untied, q/k/v/o biases.
    "qwen3": ("Qwen3", dict(head_dim=24, rope_theta=30000.0, attention_bias=True, tie_word_embeddings=False)),
    "qwen3-tied": ("Qwen3", dict(head_dim=16, tie_word_embeddings=True)),
    # Qwen3's sliding layers (layers >= max_window_layers) with a window shorter than the prompt.
    "qwen3-sliding": (
        "Qwen3",
        dict(head_dim=16, use_sliding_window=True, sliding_window=16, max_window_layers=2, tie_word_embeddings=True),
    ),
    # SmolLM3: NoPE every 2nd layer here (no_rope_layers [1, 0, 1, 0]), tied, q/k/v/o biases.
    "smollm3": ("SmolLM3", dict(no_rope_layer_interval=2, attention_bias=True, rope_theta=50000.0)),
    # SmolLM3's default layout (NoPE every 4th) with those NoPE layers sliding (window 16).
    "smollm3-sliding": ("SmolLM3", dict(use_sliding_window=True, sliding_window=16, tie_word_embeddings=False)),
    # Gemma 3: 5 sliding layers to 1 full here 1:1 ([sliding, full] x 2), window 16 < prompt,
    # RoPE bases 10K local / 1M global as transformers 5 writes them, query_pre_attn_scalar != head_dim.
    "gemma3": (
        "Gemma3Text",
        dict(
            head_dim=32,
            sliding_window=16,
            layer_types=["sliding_attention", "full_attention"] * 2,
            query_pre_attn_scalar=20,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
            },
        ),
    ),
    # Gemma 3 untied, with attention biases, and a linear-scaled RoPE on the full layers (4B+).
    "gemma3-scaled": (
        "Gemma3Text",
        dict(
            head_dim=16,
            num_hidden_layers=6,  # no layer_types: transformers' default pattern, 5 sliding then 1 full
            sliding_window=12,
            tie_word_embeddings=False,
            attention_bias=True,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0},
            },
        ),
    ),
    # OLMo 2: qk-norm over the projections, norms after the sublayers, head_dim 24, biases.
    "olmo2": ("Olmo2", dict(head_dim=24, attention_bias=True, rope_theta=20000.0, rms_norm_eps=1e-6)),
    "olmo2-tied": ("Olmo2", dict(tie_word_embeddings=True)),
    # Phi-3/4: fused qkv_proj and gate_up_proj, Phi-4-mini's partial RoPE (0.75 of 16 channels), untied.
    "phi3": ("Phi3", dict(partial_rotary_factor=0.75, rope_theta=20000.0, tie_word_embeddings=False)),
    # Phi-3-mini-4k's every-layer window (2,047 of 4,096 there; 16 here), tied.
    # (no eos: HF's min_new_tokens bans it, longctx's greedy helper does not, and this model picks it)
    "phi3-sliding": ("Phi3", dict(sliding_window=16, tie_word_embeddings=True, eos_token_id=None)),
    # Phi-3.5 / Phi-4-mini's longrope on Phi-4-mini's partial RoPE (6 rotated pairs): the short
    # factors up to 32 positions, the long ones past them (prompts of 48; generation from 20 crosses).
    "phi3-longrope": (
        "Phi3",
        dict(
            partial_rotary_factor=0.75,
            original_max_position_embeddings=32,
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": [1.0, 1.25, 1.5, 2.0, 3.0, 4.0],
                "long_factor": [1.5, 3.0, 6.0, 12.0, 24.0, 48.0],
            },
        ),
    ),
    # OLMo 3: OLMo 2's block with [sliding, full] x 2 (window 16), two RoPE bases, a YaRN-scaled
    # full RoPE (the long-context checkpoints'), tied, biases.
    "olmo3": (
        "Olmo3",
        dict(
            sliding_window=16,
            layer_types=["sliding_attention", "full_attention"] * 2,
            attention_bias=True,
            tie_word_embeddings=True,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {
                    "rope_type": "yarn",
                    "rope_theta": 500000.0,
                    "factor": 4.0,
                    "original_max_position_embeddings": 64,
                },
            },
        ),
    ),
}


def build(kind: str, **overrides):
    """A random transformers model of CASES[kind]; biases and norm weights drawn too
    (transformers zeroes biases and sets norms to 1 or 0, where a wrong offset hides)."""
    prefix, extra = CASES[kind]
    return random_hf_model(
        f"{prefix}Config", f"{prefix.removesuffix('Text')}ForCausalLM", **{**SHAPE, **extra, **overrides}
    )


def ids(length: int = PROMPT, rows: int = 2) -> torch.Tensor:
    return random_ids(length, SHAPE["vocab_size"], rows)


@pytest.mark.parametrize("kind", list(CASES))
def test_import_equals_transformers_and_decodes_its_tokens(tmp_path, kind):
    assert_import_matches_transformers(build(kind), tmp_path, ids(), TOLERANCE, TOLERANCE_FP64)


def test_qwen3_maps_its_designs(tmp_path):
    build("qwen3-sliding").save_pretrained(tmp_path)
    config = import_hf(tmp_path).config
    assert (config.qk_norm, config.head_size, config.tie_embeddings) == ("head", 16, True)
    assert config.layer_types == ["full", "full", "sliding", "sliding"] and config.sliding_window == 16


def test_smollm3_maps_no_rope_layers_one_as_rotating(tmp_path):
    build("smollm3-sliding").save_pretrained(tmp_path)
    config = import_hf(tmp_path).config
    assert json.loads((tmp_path / "config.json").read_text())["no_rope_layers"] == [1, 1, 1, 0]
    assert config.nope_indices() == {3} and config.layer_types == ["full", "full", "full", "sliding"]


def test_olmo2_maps_post_norms_onto_its_names(tmp_path):
    build("olmo2").save_pretrained(tmp_path)
    model = import_hf(tmp_path)
    assert (model.config.norm_placement, model.config.qk_norm) == ("post", "projection")
    block = model.blocks[0]
    assert isinstance(block.attn_norm, torch.nn.Identity) and isinstance(block.mlp_norm, torch.nn.Identity)
    assert block.attn.q_norm.weight.shape == (4 * 24,)


def test_gemma3_export_refuses_what_its_config_cannot_carry_in_one_line(tmp_path):
    build("gemma3").save_pretrained(tmp_path / "in")
    model = import_hf(tmp_path / "in")
    model.config.mlp_activation = "silu"
    with pytest.raises(CheckpointError, match="cannot export model.mlp_activation='silu'") as error:
        export_hf(model, tmp_path / "out")
    assert "\n" not in str(error.value)


def test_phi3_reads_its_fused_projections_by_rows(tmp_path):
    hf = build("phi3")
    hf.save_pretrained(tmp_path)
    model = import_hf(tmp_path)
    assert (model.config.rotary_fraction, model.config.partial_rotary) == (0.75, "first")
    fused = hf.model.layers[1].self_attn.qkv_proj.weight
    assert torch.equal(model.blocks[1].attn.wk.weight, fused[64:96])
    assert torch.equal(model.blocks[1].mlp.up.weight, hf.model.layers[1].mlp.gate_up_proj.weight[96:])
    weights = dict(__import__("safetensors.torch", fromlist=["load_file"]).load_file(tmp_path / "model.safetensors"))
    weights["model.layers.0.self_attn.qkv_proj.weight"] = weights["model.layers.0.self_attn.qkv_proj.weight"][:-1]
    __import__("safetensors.torch", fromlist=["save_file"]).save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"qkv_proj.weight has shape \(127, 64\), expected \(128, 64\)"):
        import_hf(tmp_path)


@pytest.mark.parametrize(("kind", "bias"), [("phi3", "none"), ("phi3-longrope", "none"), ("qwen2", "qkv")])
def test_a_family_without_the_bias_flag_ignores_one_in_its_file(tmp_path, kind, bias):
    """Phi-3's config has no `attention_bias` flag (no biases) and Qwen2's none either (q/k/v
    biases always): a stray `attention_bias: true` neither adds an o bias nor breaks the load."""
    if kind == "qwen2":
        from tests.model.hf_models import build_hf, save_hf

        save_hf(build_hf("qwen2"), tmp_path, "single")
    else:
        build(kind).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "attention_bias": True}))
    assert import_hf(tmp_path).config.attention_bias == bias


def test_olmo3_maps_its_sliding_layers_and_rope_per_layer_type(tmp_path):
    build("olmo3").save_pretrained(tmp_path)
    config = import_hf(tmp_path).config
    assert config.layer_types == ["sliding", "full"] * 2 and config.sliding_window == 16
    assert (config.rope_base, config.sliding_rope_base, config.rope_scaling.type) == (5e5, 1e4, "yarn")
    assert (config.norm_placement, config.qk_norm) == ("post", "projection")
    # transformers 4.x's form: one rope_theta for both types, rope_scaling on the full layers only.
    values = json.loads((tmp_path / "config.json").read_text())
    values.pop("rope_parameters")
    legacy = {**values, "rope_theta": 5e5, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    (tmp_path / "config.json").write_text(json.dumps(legacy))
    config = import_hf(tmp_path).config
    assert (config.rope_base, config.sliding_rope_base, config.rope_scaling.type) == (5e5, 5e5, "yarn")


def test_gemma3_maps_its_designs_from_either_config_form(tmp_path):
    build("gemma3-scaled").save_pretrained(tmp_path)
    config = import_hf(tmp_path).config
    assert config.layer_types == ["sliding"] * 5 + ["full"] and config.sliding_window == 12
    assert (config.rope_base, config.sliding_rope_base, config.rope_scaling.type) == (1e6, 1e4, "linear")
    assert (config.norm_placement, config.norm_offset, config.mlp_activation) == ("sandwich", True, "gelu_tanh")
    assert (config.scale_embeddings, config.query_pre_attn_scalar, config.qk_norm) == (True, 256, "head")
    # transformers 4.x's form: rope_theta + rope_scaling (full), rope_local_base_freq, a pattern.
    values = json.loads((tmp_path / "config.json").read_text())
    for key in ("rope_parameters", "layer_types", "_sliding_window_pattern"):
        values.pop(key)
    legacy = {**values, "rope_theta": 1e6, "rope_local_base_freq": 1e4, "sliding_window_pattern": 6}
    legacy["rope_scaling"] = {"rope_type": "linear", "factor": 4.0}
    (tmp_path / "config.json").write_text(json.dumps(legacy))
    assert import_hf(tmp_path).config == config


def test_gemma3_designs_matter(tmp_path):
    """Negative controls: each Gemma design switched off moves the logits far past 1e-4."""
    hf = build("gemma3")
    hf.save_pretrained(tmp_path)
    with torch.no_grad():
        theirs = hf(ids()).logits

        def undone(change) -> float:
            ours = import_hf(tmp_path).eval()
            change(ours)
            return float((ours(ids()) - theirs).abs().max())

        assert undone(lambda m: setattr(m.config, "scale_embeddings", False)) > 1e-2
        assert undone(lambda m: [setattr(b.attn, "query_scale", 1.0) for b in m.blocks]) > 1e-2
        assert undone(lambda m: [setattr(n, "offset", False) for n in m.modules() if hasattr(n, "offset")]) > 1e-2
        assert undone(lambda m: [setattr(b.mlp, "gelu", False) for b in m.blocks]) > 1e-2


@pytest.mark.parametrize(
    "kind",
    [
        "qwen3",
        "qwen3-tied",
        "smollm3",
        "olmo2",
        "olmo2-tied",
        "gemma3",
        "gemma3-scaled",
        "olmo3",
        "phi3",
        "phi3-sliding",
    ],
)
def test_export_reloads_in_transformers_with_equal_logits(tmp_path, kind):
    """Gemma 3: sliding layers past their window, two RoPE bases, a linear-scaled full RoPE,
    untied with biases; the config reads back into the same ModelConfig."""
    hf = build(kind)
    hf.save_pretrained(tmp_path / "in")
    model = import_hf(tmp_path / "in")
    exported = export_hf(model, tmp_path / "out")
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(exported).eval()
    assert type(reloaded).__name__ == type(hf).__name__
    with torch.no_grad():
        assert (reloaded(ids()).logits - hf(ids()).logits).abs().max() <= TOLERANCE
    assert import_hf(exported).config == model.config


@pytest.mark.parametrize(
    "kind, fields, message",
    [
        ("qwen3-sliding", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "with rope scaling 'linear'"),
        ("qwen3", {"layer_types": ["full_attention"] * 3 + ["sliding_attention"]}, "use_sliding_window=false"),
        ("qwen3", {"model_type": "qwen3_moe"}, "model_type 'qwen3_moe' is not supported: a mixture of experts"),
        ("qwen3", {"model_type": "gpt_oss"}, "model_type 'gpt_oss' is not supported: a mixture of experts"),
        (
            "phi3",
            {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 6}},
            "rope_type='longrope': long_factor must be 6 factors > 0 (one per rotated pair)",
        ),
    ],
)
def test_refusals_name_the_field_in_one_line(tmp_path, kind, fields, message):
    build(kind).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **fields}))
    with pytest.raises(CheckpointError) as error:
        import_hf(tmp_path)
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("design", "family"),
    [
        ({"norm_placement": "post", "qk_norm": "projection"}, "olmo2"),
        ({"qk_norm": "head"}, "qwen3"),
        (
            {
                "norm_placement": "sandwich",
                "norm_offset": True,
                "mlp_activation": "gelu_tanh",
                "scale_embeddings": True,
                "qk_norm": "head",
            },
            "gemma3_text",
        ),
        (
            {
                "norm_placement": "post",
                "qk_norm": "projection",
                "layer_types": ["sliding", "full"],
                "sliding_window": 8,
            },
            "olmo3",
        ),
        ({"nope_layers": [1]}, "smollm3"),
    ],
)
def test_families_with_one_bias_flag_refuse_qwen2_s_qkv_bias_naming_the_key(design, family):
    """Their `attention_bias` biases q, k, v and o together: q/k/v alone has no field."""
    from longctx.config.model import ModelConfig
    from longctx.model.hf_config import hf_config

    config = ModelConfig.from_preset("debug", attention_bias="qkv", **design)
    with pytest.raises(CheckpointError, match=rf"^cannot export model.attention_bias='qkv' as {family}: "):
        hf_config(config)
