"""The linear-attention hybrids' families, olmo_hybrid and a dense qwen3_next, on tiny random
models that transformers builds and saves (model/families/olmo_hybrid.py, qwen3_next.py):

- import equals transformers' logits: float32 within 1e-4 (logits of several units: a
  missing norm offset, gate or rotation is far above it), float64 within 5e-5 (transformers
  computes the delta rule's decay in float32 even in a float64 model);
  the prompts (80 tokens) cross the delta rule's 64-token chunk;
- cached decoding through longctx's KV cache (a prefill, then a token a step: the full layers'
  keys, the linear layers' recurrent and convolution states) equals longctx's full forward
  (float64, within 1e-9), and greedy decoding gives transformers' tokens;
- export reloads in transformers with equal logits, as the files transformers itself saves
  (the same tensor names: OLMo Hybrid's renamed norms and split convolution), and reads back
  into the same ModelConfig; a model longctx built (not imported) exports too, Qwen3-Next's
  1 + w norms written as w - 1 from a model without the offset;
- both OLMo Hybrid forms: NoPE full layers as released (rope_theta null) and RoPE ones;
- the mixture of experts, and what no family writes, refused in one line naming the key.
"""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from longctx.config.model import ModelConfig
from longctx.errors import CheckpointError
from longctx.model.hf import export_hf, import_hf
from longctx.model.hf_config import hf_config, model_config_from_hf
from longctx.model.llama import Llama
from tests.model.helpers import (
    assert_import_matches_transformers,
    random_hf_model,
    random_ids,
    stepwise_logits,
)
from tests.model.test_hf_families import SHAPE as FAMILY_SHAPE

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SHAPE = {
    **FAMILY_SHAPE,  # the dense families' tiny shape, with the linear layers' heads
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,  # more value heads than key heads: each key head serves two
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 24,
    "linear_conv_kernel_dim": 4,
    "bos_token_id": None,
    "eos_token_id": None,
}
LAYERS = ["linear_attention", "linear_attention", "full_attention", "linear_attention"]
TOLERANCE = 1e-4
"""float32 (measured 1.1e-5 to 2.0e-5 on logits of about 3)."""
TOLERANCE_FP64 = 5e-5
"""float64: transformers computes the linear layers' decay g (and OLMo Hybrid its RoPE angles)
in float32 even in a float64 model, so a float64 import differs by as much as a float32 one
(measured 6.8e-6 to 1.6e-5); this checks the float64 path, not a finer agreement."""
CACHE_TOLERANCE = 1e-9
"""Cached steps against longctx's full forward, float64: the chunked and the one-step delta
rule sum in another order (measured 2e-14 to 8e-14; in float32 9e-6 to 4e-5, logits of about 3.5)."""
PROMPT = 80
"""Tokens: past the delta rule's 64-token chunk."""

CASES = {
    # OLMo Hybrid with RoPE on its full layers (base 20,000), q/k/v/o biases, untied, beta in (0, 2).
    "olmo_hybrid": (
        "OlmoHybrid",
        dict(layer_types=LAYERS, attention_bias=True, rope_parameters={"rope_type": "default", "rope_theta": 2e4}),
    ),
    # As released: rope_theta null, NoPE full layers; tied, beta in (0, 1), transformers' default layout.
    "olmo_hybrid-nope": (
        "OlmoHybrid",
        dict(
            linear_allow_neg_eigval=False,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": None},
        ),
    ),
    # Qwen3-Next, dense (num_experts 0): head_dim 32 (RoPE on its first 8 channels), q/k/v/o biases, untied.
    "qwen3_next": (
        "Qwen3Next",
        dict(layer_types=LAYERS, head_dim=32, attention_bias=True, num_experts=0, rope_theta=30000.0),
    ),
    # Dense by mlp_only_layers (every layer) beside num_experts 4; RoPE on half of 16 channels, tied.
    "qwen3_next-mlp-only": (
        "Qwen3Next",
        dict(
            head_dim=16,
            num_experts=4,
            mlp_only_layers=[0, 1, 2, 3],
            partial_rotary_factor=0.5,
            tie_word_embeddings=True,
        ),
    ),
}


def build(kind: str, **overrides):
    """A random transformers hybrid of CASES[kind]; biases and norm weights drawn too
    (transformers sets norms to 1 or 0 and biases to 0, where a wrong offset hides)."""
    prefix, extra = CASES[kind]
    return random_hf_model(f"{prefix}Config", f"{prefix}ForCausalLM", **{**SHAPE, **extra, **overrides})


def ids(length: int = PROMPT, rows: int = 2) -> torch.Tensor:
    return random_ids(length, SHAPE["vocab_size"], rows)


@pytest.mark.parametrize("kind", list(CASES))
def test_import_equals_transformers_and_decodes_its_tokens(tmp_path, kind):
    prompt = ids()
    ours64, full = assert_import_matches_transformers(build(kind), tmp_path, prompt, TOLERANCE, TOLERANCE_FP64)
    assert (stepwise_logits(ours64, prompt, prefill=PROMPT // 2) - full).abs().max() <= CACHE_TOLERANCE


def test_olmo_hybrid_maps_its_blocks_and_both_rope_forms(tmp_path):
    build("olmo_hybrid").save_pretrained(tmp_path / "rope")
    config = import_hf(tmp_path / "rope").config
    assert config.layer_kinds() == ["linear", "linear", "full", "linear"] and config.nope_indices() == set()
    assert (config.rope_base, config.rotary_fraction, config.qk_norm) == (2e4, 1, "projection")
    assert (config.norm_placement, config.linear_attention.norm_placement) == ("post", "pre")
    spec = config.linear_attention
    assert (spec.variant, spec.allow_neg_eigval, spec.heads(4, 16)) == ("olmo_hybrid", True, (2, 4, 16, 24))
    build("olmo_hybrid-nope").save_pretrained(tmp_path / "nope")
    model = import_hf(tmp_path / "nope")
    assert model.config.layer_kinds() == ["linear", "linear", "linear", "full"]
    assert model.config.nope_indices() == {3} and not model.config.linear_attention.allow_neg_eigval
    assert not any(spec.rope for spec in model.config.layer_specs())


def test_olmo_hybrid_designs_matter(tmp_path):
    """Negative controls: the NoPE form rotated, a post-norm linear block, or beta in (0, 1)
    for (0, 2) moves the logits far past 1e-4."""
    for kind in ("olmo_hybrid", "olmo_hybrid-nope"):
        build(kind).save_pretrained(tmp_path / kind)
    with torch.no_grad():
        nope = import_hf(tmp_path / "olmo_hybrid-nope").eval()
        reference = nope(ids())
        nope.config.nope_layers = None
        rotated = Llama(nope.config).eval()
        rotated.load_state_dict(nope.state_dict())
        assert (rotated(ids()) - reference).abs().max() > 1e-2
        ours = import_hf(tmp_path / "olmo_hybrid").eval()
        reference = ours(ids())
        for change in ({"norm_placement": "post"}, {"allow_neg_eigval": False}):
            config = ModelConfig(
                **{
                    **vars(ours.config),
                    "linear_attention": {**vars(ours.config.linear_attention), **change},
                }
            )
            other = Llama(config).eval()
            state = {key: value for key, value in ours.state_dict().items() if key in other.state_dict()}
            other.load_state_dict(state, strict=False)
            if change.get("norm_placement"):  # the pre-norms become post-norms of the same weights
                for index, block in enumerate(other.blocks):
                    if config.layer_kinds()[index] == "linear":
                        block.attn_post_norm.weight.copy_(ours.blocks[index].attn_norm.weight)
                        block.mlp_post_norm.weight.copy_(ours.blocks[index].mlp_norm.weight)
            assert (other(ids()) - reference).abs().max() > 1e-2


def test_qwen3_next_maps_its_designs(tmp_path):
    hf = build("qwen3_next")
    hf.save_pretrained(tmp_path)
    model = import_hf(tmp_path)
    config = model.config
    assert config.layer_kinds() == ["linear", "linear", "full", "linear"]
    assert (config.rotary_fraction, config.partial_rotary, config.rope_base) == (0.25, "first", 3e4)
    assert (config.norm_offset, config.attention_gate, config.qk_norm) == (True, "elementwise", "head")
    assert config.linear_attention.variant == "qwen3_next"
    doubled = hf.model.layers[2].self_attn.q_proj.weight.view(4, 2, 32, 64)  # per head: query rows, gate rows
    assert torch.equal(model.blocks[2].attn.wq.weight, doubled[:, 0].reshape(128, 64))
    assert torch.equal(model.blocks[2].attn.wg.weight, doubled[:, 1].reshape(128, 64))
    assert torch.equal(
        model.blocks[2].attn.wg.bias, hf.model.layers[2].self_attn.q_proj.bias.view(4, 2, 32)[:, 1].flatten()
    )


def test_qwen3_next_reads_the_older_config_form(tmp_path):
    """transformers 4.x's form: `rope_theta` and `partial_rotary_factor` at the top level, no
    `layer_types` but `full_attention_interval`."""
    build("qwen3_next-mlp-only").save_pretrained(tmp_path)
    config = import_hf(tmp_path).config
    values = json.loads((tmp_path / "config.json").read_text())
    assert values["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]  # transformers' default: interval 4
    for key in ("rope_parameters", "layer_types"):
        values.pop(key)
    legacy = {**values, "rope_theta": 10000.0, "partial_rotary_factor": 0.5, "full_attention_interval": 4}
    (tmp_path / "config.json").write_text(json.dumps(legacy))
    assert import_hf(tmp_path).config == config
    assert model_config_from_hf({**legacy, "full_attention_interval": 2}).layer_kinds() == ["linear", "full"] * 2


@pytest.mark.parametrize("kind", list(CASES))
def test_export_reloads_in_transformers_with_equal_logits_as_transformers_saves(tmp_path, kind):
    hf = build(kind)
    hf.save_pretrained(tmp_path / "in")
    model = import_hf(tmp_path / "in")
    exported = export_hf(model, tmp_path / "out")
    assert set(load_file(exported / "model.safetensors")) == set(load_file(tmp_path / "in" / "model.safetensors"))
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(exported).eval()
    assert type(reloaded).__name__ == type(hf).__name__
    with torch.no_grad():
        assert (reloaded(ids()).logits - hf(ids()).logits).abs().max() <= TOLERANCE
    assert import_hf(exported).config == model.config


def test_olmo_hybrid_reads_the_modules_names_too(tmp_path):
    """The files as transformers' modules name them (one conv1d, input_layernorm) import alike;
    a missing part of the split convolution is refused in one line."""
    hf = build("olmo_hybrid")
    hf.save_pretrained(tmp_path)
    with torch.no_grad():
        expected = hf(ids()).logits
    save_file({k: v.contiguous() for k, v in hf.state_dict().items()}, tmp_path / "model.safetensors")
    with torch.no_grad():
        assert (import_hf(tmp_path).eval()(ids()) - expected).abs().max() <= TOLERANCE
    hf.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["model.layers.1.linear_attn.v_conv1d.weight"]
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"linear_attn.conv1d.weight is stored in 3 parts, 1 of them missing"):
        import_hf(tmp_path)


def native(variant: str, **fields) -> Llama:
    """A longctx model of `variant`'s design, built by longctx with every norm drawn away from its init."""
    designs = {
        "olmo_hybrid": dict(norm_placement="post", qk_norm="projection", attention_bias="qkvo"),
        "qwen3_next": dict(qk_norm="head", attention_gate="elementwise", rotary_fraction=0.25, head_dim=32),
    }[variant]
    config = ModelConfig(
        vocab_size=320,
        d_model=64,
        n_layers=4,
        n_heads=4,
        n_kv_heads=2,
        d_ff=96,
        init_std=0.1,
        **{**designs, **fields},
        linear_attention={
            "variant": variant,
            "full_every": 2,
            "n_key_heads": 2,
            "n_value_heads": 4,
            "norm_placement": "pre" if variant == "olmo_hybrid" else "",
        },
    )
    torch.manual_seed(0)
    model = Llama(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                parameter.add_(torch.randn_like(parameter) * 0.3)
    return model


@pytest.mark.parametrize(
    "variant, fields",
    [
        ("olmo_hybrid", {}),
        ("olmo_hybrid", {"nope_every": 2}),
        ("qwen3_next", {}),  # no norm offset: written as w - 1
        ("qwen3_next", {"norm_offset": True, "tie_embeddings": True}),
    ],
)
def test_a_model_longctx_built_exports(tmp_path, variant, fields):
    model = native(variant, **fields)
    exported = export_hf(model, tmp_path)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(exported).eval()
    with torch.no_grad():
        mine = model(ids())
        assert mine.abs().max() > 1.0
        assert (reloaded(ids()).logits - mine).abs().max() <= TOLERANCE
    config = json.loads((exported / "config.json").read_text())
    assert config["layer_types"] == ["linear_attention", "full_attention"] * 2
    if "nope_every" in fields:
        assert config["rope_parameters"]["rope_theta"] is None


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"num_experts": 4, "mlp_only_layers": [0, 1]}, "num_experts=4 is not supported: layers [2, 3] are mixtures"),
        ({"num_experts": 4, "decoder_sparse_step": 2}, "num_experts=4 is not supported: layers [1, 3] are mixtures"),
        ({"num_experts": None}, "num_experts=512 is not supported: layers [0, 1, 2, 3] are mixtures"),
        ({"layer_types": ["linear_attention"] * 3 + ["sliding_attention"]}, "layer_types[3]='sliding_attention'"),
        ({"rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 0.1}}, "partial_rotary_factor=0.1"),
    ],
)
def test_qwen3_next_refusals_name_the_key_in_one_line(tmp_path, fields, message):
    build("qwen3_next").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(fields)
    if fields.get("num_experts", 0) is None:
        del config["num_experts"]  # Qwen3NextConfig's default: 512 experts on every layer
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="") as error:
        import_hf(tmp_path)
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    "fields, message",
    [
        # OLMo Hybrid's full layers are post-norm: a pre-norm hybrid of its variant has no family.
        ({"layer_types": ["linear", "full"]}, "cannot export model.norm_placement='pre'"),
        (
            {"n_layers": 3, "layer_types": ["linear", "sliding", "full"], "sliding_window": 4},
            "cannot export sliding layers (model.layer_types / global_every) as olmo_hybrid",
        ),
        (
            {
                "n_layers": 3,
                "layer_types": ["linear", "full", "full"],
                "norm_placement": "post",
                "qk_norm": "projection",
                "nope_layers": [1],
                "linear_attention": {"norm_placement": "pre"},
            },
            "cannot export NoPE full layers [1] beside rotating ones [2] as olmo_hybrid",
        ),
        (
            {"layer_types": ["linear", "full"], "qk_norm": "head", "linear_attention": {"variant": "qwen3_next"}},
            "cannot export model.attention_gate='none': the Qwen3-Next config.json",
        ),
        (
            {
                "layer_types": ["linear", "full"],
                "norm_placement": "post",
                "qk_norm": "projection",
                "attention_bias": "qkv",
                "linear_attention": {"norm_placement": "pre"},
            },
            "cannot export model.attention_bias='qkv' as olmo_hybrid: its attention_bias is q/k/v/o",
        ),
        (
            {
                "layer_types": ["linear", "full"],
                "qk_norm": "head",
                "attention_gate": "elementwise",
                "attention_bias": "qkv",
                "linear_attention": {"variant": "qwen3_next"},
            },
            "cannot export model.attention_bias='qkv' as qwen3_next: its attention_bias is q/k/v/o",
        ),
    ],
)
def test_export_refuses_what_no_family_writes_in_one_line(fields, message):
    with pytest.raises(CheckpointError, match="") as error:
        hf_config(ModelConfig(**fields))
    assert message in str(error.value) and "\n" not in str(error.value)
