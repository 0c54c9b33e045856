"""The attention designs (docs/design.md §5) against transformers 5.x on random small weights copied into
longctx's model: Qwen3 (per-head qk-norm, decoupled head_dim), Phi-3 (`first` partial
rotation, transformers' partial_rotary_factor), Llama with the `proportional` rope type
(p-RoPE, Gemma 4's), Llama with a decoupled head_dim (also through export and import), and
OLMo 2's attention (qk-norm over the whole projections; OLMo 2 blocks are post-norm, so the
attention module is compared on the same input). float32 logits within 1e-4 (test_hf.py's
tolerance; the logits are several units)."""

import pytest
import torch

from longctx.config.model import ModelConfig
from longctx.model.hf import export_hf, hf_name, import_hf
from longctx.model.llama import Llama

transformers = pytest.importorskip("transformers")

SHAPE = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)
TOLERANCE = 1e-4


def ours_from(hf_model, **fields) -> Llama:
    """A longctx model of the HF model's shape with `fields`, the HF weights copied in by
    longctx's name map (model/hf.py's `hf_name`; q_norm/k_norm: self_attn.q_norm/k_norm)."""
    hf = hf_model.config
    config = ModelConfig.from_preset(
        "debug",
        vocab_size=hf.vocab_size,
        d_model=hf.hidden_size,
        d_ff=hf.intermediate_size,
        n_layers=hf.num_hidden_layers,
        n_heads=hf.num_attention_heads,
        n_kv_heads=hf.num_key_value_heads,
        norm_eps=hf.rms_norm_eps,
        rope_base=hf.rope_parameters["rope_theta"],
        max_position=hf.max_position_embeddings,
        **fields,
    )
    model = Llama(config).eval()
    theirs = hf_model.state_dict()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.copy_(split(theirs, name))
    return model


def split(theirs: dict, name: str) -> torch.Tensor:
    """Our tensor from the HF state dict; Phi-3's fused qkv_proj and gate_up_proj split."""
    key = hf_name(name)
    if key in theirs:
        return theirs[key]
    layer = key.split(".")[2]
    kind = name.rsplit(".", 2)[-2]
    fused = theirs.get(f"model.layers.{layer}.self_attn.qkv_proj.weight")
    if kind in ("wq", "wk", "wv") and fused is not None:
        return fused.split(_qkv_rows(theirs, layer), dim=0)[("wq", "wk", "wv").index(kind)]
    gate, up = theirs[f"model.layers.{layer}.mlp.gate_up_proj.weight"].chunk(2, dim=0)
    return gate if kind == "gate" else up


def _qkv_rows(theirs: dict, layer: str) -> list[int]:
    out = theirs[f"model.layers.{layer}.self_attn.o_proj.weight"].shape[1]
    total = theirs[f"model.layers.{layer}.self_attn.qkv_proj.weight"].shape[0]
    return [out, (total - out) // 2, (total - out) // 2]


def random_hf(class_name: str, **overrides):
    config_class = getattr(transformers, class_name.replace("ForCausalLM", "Config"))
    torch.manual_seed(0)
    config = config_class(**{**SHAPE, "initializer_range": 0.1, **overrides})
    model = getattr(transformers, class_name)(config).eval()
    with torch.no_grad():  # norms away from 1: a misplaced or mis-shaped norm shows
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.add_(0.3 * torch.randn_like(parameter))
    return model


def compare(hf_model, model: Llama, length: int = 96) -> float:
    ids = torch.randint(0, SHAPE["vocab_size"], (2, length))
    with torch.no_grad():
        ours, theirs = model(ids), hf_model(ids).logits
    assert ours.abs().max() > 1.0
    return (ours - theirs).abs().max().item()


def test_qwen3_per_head_qk_norm_with_a_decoupled_head_dim():
    hf = random_hf("Qwen3ForCausalLM", head_dim=24, rope_theta=20000.0, attn_implementation="eager")
    model = ours_from(hf, head_dim=24, qk_norm="head")
    assert compare(hf, model) <= TOLERANCE
    model.config.qk_norm = "none"  # negative control: the same weights without the norm
    for block in model.blocks:
        block.attn.qk_norm = "none"
    assert compare(hf, model) > 1e-2


@pytest.mark.parametrize("fraction", [0.5, 0.75])
def test_phi3_partial_rotary_factor_is_first(fraction):
    hf = random_hf(
        "Phi3ForCausalLM", partial_rotary_factor=fraction, rope_theta=10000.0, pad_token_id=0, eos_token_id=1
    )
    hf.config._attn_implementation = "eager"
    model = ours_from(hf, rotary_fraction=fraction, partial_rotary="first")
    assert model.rope.rotary_dim == int(16 * fraction)
    assert compare(hf, model) <= TOLERANCE
    assert compare(hf, ours_from(hf, rotary_fraction=fraction, partial_rotary="p-rope")) > 1e-2


@pytest.mark.parametrize("fraction", [0.25, 0.5])
def test_llama_proportional_rope_is_p_rope(fraction):
    rope = {"rope_type": "proportional", "rope_theta": 10000.0, "partial_rotary_factor": fraction}
    hf = random_hf("LlamaForCausalLM", head_dim=32, rope_parameters=rope, attn_implementation="eager")
    model = ours_from(hf, head_dim=32, rotary_fraction=fraction, partial_rotary="p-rope")
    assert compare(hf, model) <= TOLERANCE


def test_llama_with_a_decoupled_head_dim_exports_and_imports(tmp_path):
    hf = random_hf("LlamaForCausalLM", head_dim=24, rope_theta=20000.0, attn_implementation="eager")
    model = ours_from(hf, head_dim=24)
    assert compare(hf, model) <= TOLERANCE
    export_hf(model, tmp_path / "ours")
    reloaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "ours", attn_implementation="eager").eval()
    assert reloaded.config.head_dim == 24
    assert compare(reloaded, model) <= TOLERANCE
    hf.save_pretrained(tmp_path / "theirs")
    imported = import_hf(tmp_path / "theirs")
    assert (imported.config.head_dim, imported.config.head_size) == (24, 24)
    assert compare(hf, imported) <= TOLERANCE


@pytest.mark.parametrize("field,value", [("qk_norm", "projection"), ("rotary_fraction", 0.5)])
def test_export_refuses_what_the_llama_config_cannot_carry(tmp_path, field, value):
    """p-rope has no config.json field (`first` partial rotation exports as phi3)."""
    from longctx.errors import CheckpointError

    extra = {"partial_rotary": "p-rope"} if field == "rotary_fraction" else {}
    model = Llama(ModelConfig.from_preset("debug", **{field: value}, **extra))
    with pytest.raises(CheckpointError, match=f"^cannot export model.{field}="):
        export_hf(model, tmp_path)


def test_olmo2_attention_normalises_the_whole_projections():
    """OLMo 2's attention module (q_norm over n_heads x head_dim, k_norm over n_kv_heads x
    head_dim, before the split into heads and before RoPE) on the input our first block's
    attention receives, with our weights, equals our attention's output."""
    hf_config = transformers.Olmo2Config(**{**SHAPE, "head_dim": 24}, rope_theta=20000.0)
    hf_config._attn_implementation = "eager"
    attention = transformers.models.olmo2.modeling_olmo2.Olmo2Attention(hf_config, layer_idx=0).eval()
    rotary = transformers.models.olmo2.modeling_olmo2.Olmo2RotaryEmbedding(hf_config)
    model = Llama(
        ModelConfig.from_preset(
            "debug", vocab_size=256, d_ff=96, head_dim=24, qk_norm="projection", rope_base=20000.0, init_std=0.1
        )
    ).eval()
    ours = model.blocks[0].attn
    assert (ours.q_norm.weight.shape, ours.k_norm.weight.shape) == ((4 * 24,), (2 * 24,))
    with torch.no_grad():
        for parameter in (ours.q_norm.weight, ours.k_norm.weight):
            parameter.add_(0.3 * torch.randn_like(parameter))
        for theirs, mine in (
            ("q_proj", "wq"),
            ("k_proj", "wk"),
            ("v_proj", "wv"),
            ("o_proj", "wo"),
            ("q_norm", "q_norm"),
            ("k_norm", "k_norm"),
        ):
            getattr(attention, theirs).weight.copy_(getattr(ours, mine).weight)
    seen = {}
    hooks = [ours.register_forward_hook(lambda module, args, out: seen.update(x=args[0], out=out))]
    ids = torch.randint(0, 256, (2, 40))
    with torch.no_grad():
        model(ids)
        for hook in hooks:
            hook.remove()
        x = seen["x"]
        position_ids = torch.arange(40)[None].expand(2, -1)
        causal = torch.full((40, 40), float("-inf")).triu(1)[None, None]
        theirs, _ = attention(x, rotary(x, position_ids), causal)
    assert seen["out"].abs().max() > 0.1
    assert (seen["out"] - theirs).abs().max() <= 1e-5
