"""`qwen3_next` (Qwen3-Next; transformers' Qwen3NextForCausalLM), its dense form: Gated
DeltaNet `linear_attention` layers and a `full_attention` layer every `full_attention_interval`
(4; `layer_types`), every block pre-norm, and:

- every RMSNorm (the block's two, the final one, the per-head q/k norms) multiplies by
  1 + weight (`norm_offset`, the weights as stored); the linear layers' gated norm by weight;
- the full layers' q_proj is doubled: per head h, head_dim query rows then head_dim gate
  rows, the attention output times sigmoid(gate) before o_proj (`attention_gate:
  elementwise`, model/gate.py; read into `wq` and `wg` by rows, `Family.fused`);
- RoPE on the first `partial_rotary_factor` (0.25) of each head's channels, rotate-half within
  them, frequencies over those channels (`rotary_fraction`, `partial_rotary: first`);
- the linear layers' fused `in_proj_qkvz` / `in_proj_ba`, grouped per key head, more value
  heads than key heads (`linear_attention.variant: qwen3_next`, the same layout in longctx).

Refused: the mixture of experts. A layer i has experts unless i is in `mlp_only_layers`, or
`num_experts` is 0, or (i + 1) is not a multiple of `decoder_sparse_step`
(transformers' Qwen3NextDecoderLayer); the dense form, every layer a Qwen3NextMLP of
`intermediate_size`, is what longctx's model is (`num_experts: 0`, as export writes).
A model without `norm_offset` is exported with weight - 1 in those norms (families/stored.py).
"""

from __future__ import annotations

from longctx.config.linear_attention import LinearAttention
from longctx.config.model import ModelConfig
from longctx.errors import CheckpointError
from longctx.model.families.common import (
    LLAMA_LAYER_NAMES,
    NO_SPECIAL_IDS,
    Family,
    common_fields,
    common_hf_config,
    refuse_fields,
    rope_parameters_to_hf,
)
from longctx.model.families.hybrid import LINEAR_COMMON, check_layout, hybrid_layer_types, linear_heads
from longctx.model.families.llama import PLAIN_BLOCK
from longctx.model.families.stored import StoredForm

DEFAULTS = {
    "head_dim": 256,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 32768,
    "num_experts": 512,
    "decoder_sparse_step": 1,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
}
"""Qwen3NextConfig's defaults for fields a config.json may omit."""

LAYER_NAMES = {
    **LLAMA_LAYER_NAMES,
    "attn.wg.weight": "self_attn.q_proj.weight",
    "attn.wg.bias": "self_attn.q_proj.bias",
}
"""The full layers: Qwen3's names, the gate's rows in q_proj (`fused`)."""

LINEAR_NAMES = {
    **LINEAR_COMMON,
    "attn.in_proj_qkvz.weight": "linear_attn.in_proj_qkvz.weight",
    "attn.in_proj_ba.weight": "linear_attn.in_proj_ba.weight",
    "attn.norm_weight": "linear_attn.norm.weight",
    "attn.wo.weight": "linear_attn.out_proj.weight",
}

STORED = StoredForm(
    offset_norms=(
        ".input_layernorm.weight",
        ".post_attention_layernorm.weight",
        ".self_attn.q_norm.weight",
        ".self_attn.k_norm.weight",
        "model.norm.weight",
    )
)


def fused(name: str, config: ModelConfig) -> tuple[int, int, int] | None:
    """wq and wg (weight and bias): the first and second head_dim rows of each head's 2 x
    head_dim rows of q_proj."""
    size = config.head_size
    return {"wq": (0, size, config.n_heads), "wg": (size, 2 * size, config.n_heads)}.get(name.split(".")[1])


def read(hf: dict, source: str) -> ModelConfig:
    hf = {**DEFAULTS, **hf}
    _refuse_experts(hf, source)
    parameters = hf.get("rope_parameters") or {}
    fraction = parameters.get("partial_rotary_factor", hf.get("partial_rotary_factor", 0.25))
    head_dim = hf["head_dim"]
    if not 0 < fraction <= 1 or int(head_dim * fraction) % 2 or int(head_dim * fraction) == 0:
        raise CheckpointError(
            f"{source}: partial_rotary_factor={fraction} is not supported: it rotates {int(head_dim * fraction)} "
            f"of head_dim={head_dim} channels (a positive even number)"
        )
    fields = common_fields(hf, source)
    interval = hf.get("full_attention_interval", 4)
    default = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(hf["num_hidden_layers"])]
    linear = LinearAttention(
        variant="qwen3_next",
        n_key_heads=hf["linear_num_key_heads"],
        n_value_heads=hf["linear_num_value_heads"],
        key_head_dim=hf["linear_key_head_dim"],
        value_head_dim=hf["linear_value_head_dim"],
        conv_size=hf["linear_conv_kernel_dim"],
    )
    return ModelConfig(
        **fields,
        layer_types=hybrid_layer_types(hf, source, default),
        qk_norm="head",
        norm_offset=True,
        attention_gate="elementwise",
        rotary_fraction=float(fraction),
        partial_rotary="first",
        linear_attention=linear,
    )


def _refuse_experts(hf: dict, source: str) -> None:
    step, experts, dense = hf["decoder_sparse_step"], hf["num_experts"], hf.get("mlp_only_layers") or []
    if experts and (not isinstance(step, int) or step < 1):
        raise CheckpointError(f"{source}: decoder_sparse_step={step!r} is not a positive integer")
    sparse = [i for i in range(hf["num_hidden_layers"]) if experts and i not in dense and (i + 1) % step == 0]
    if sparse:
        raise CheckpointError(
            f"{source}: num_experts={experts} is not supported: layers {sparse} are mixtures of experts (longctx's "
            "model has one dense MLP per layer; dense Qwen3-Next: num_experts 0 or every layer in mlp_only_layers)"
        )


def write(config: ModelConfig) -> dict:
    """A dense Qwen3NextForCausalLM (num_experts 0): `layer_types`, the linear layers' heads,
    RoPE with `partial_rotary_factor` in `rope_parameters`."""
    layer_types = check_layout(config, "qwen3_next")
    llama_block = {key: value for key, value in PLAIN_BLOCK.items() if key != "norm_offset"}  # either offset writes
    refuse_fields(config, "Qwen3-Next", {**llama_block, "qk_norm": "head", "attention_gate": "elementwise"})
    if config.linear_attention.norm_placement not in ("", "pre"):
        raise CheckpointError(
            f"cannot export model.linear_attention.norm_placement={config.linear_attention.norm_placement!r} as "
            "qwen3_next: every block is pre-norm"
        )
    if config.rotary_fraction != 1 and config.partial_rotary != "first":
        raise CheckpointError(
            f"cannot export model.partial_rotary={config.partial_rotary!r} as qwen3_next: its "
            "partial_rotary_factor rotates the first channels ('first')"
        )
    nope = sorted(i for i in config.nope_indices() if config.layer_kinds()[i] == "full")
    if nope:
        raise CheckpointError(
            f"cannot export NoPE full layers {nope} as qwen3_next: its full layers rotate (model.nope_layers / "
            "nope_every)"
        )
    values = common_hf_config(config, "qwen3_next", "Qwen3NextForCausalLM", omit=("rope_theta", "rope_scaling"))
    values.update(
        layer_types=layer_types,
        rope_parameters={**rope_parameters_to_hf(config), "partial_rotary_factor": config.rotary_fraction},
        num_experts=0,
        mlp_only_layers=[],
        decoder_sparse_step=1,
        **linear_heads(config),
        **NO_SPECIAL_IDS,
    )
    return values


QWEN3_NEXT = Family(
    "qwen3_next",
    "Qwen3NextForCausalLM",
    read,
    layer_names=LAYER_NAMES,
    linear_names=LINEAR_NAMES,
    fused=fused,
    stored=STORED,
    refused=(
        "num_experts > 0 with a layer not in mlp_only_layers: a mixture of experts (longctx's model has one dense "
        "MLP per layer)",
        "hidden_act other than silu",
        "partial_rotary_factor rotating an odd number of channels",
    ),
    write=write,
)
