"""`phi3` (Phi-3, Phi-3.5, Phi-4-mini): Llama's block with fused projections, read by rows:
`qkv_proj` = [q (n_heads x D); k (n_kv_heads x D); v (n_kv_heads x D)] and `gate_up_proj` =
[gate (d_ff); up (d_ff)] (transformers' Phi3MLP: gate, up = chunk(2)). Partial RoPE:
`partial_rotary_factor` p (Phi-4-mini 0.75) rotates the first p·D channels of each head
(`rotary_fraction`, `partial_rotary: first`). A `sliding_window` below
`max_position_embeddings` makes every layer slide (transformers' Phi-3 passes it to every
layer: Phi-3-mini-4k's 2,047).

`longrope` (Phi-3-128k, Phi-3.5, Phi-4-mini; "yarn" and "su" are transformers' older names
for it) as transformers reads it (`Phi3Config`, `_compute_longrope_parameters`):
L_orig = the top-level `original_max_position_embeddings` (Phi3Config's default 4,096;
transformers overwrites the rope dict's with it under every name), factor = the dict's `factor` or max_position_embeddings /
L_orig, and cos/sin times `attention_factor` or sqrt(1 + ln(factor) / ln(L_orig)); a forward
rotates by theta_i / long_factor[i] iff its largest position + 1 > L_orig, else by
short_factor (model/rope.py, which also says why cached generation across L_orig matches).
The attention factor is resolved at import and written back explicitly by export.

Export writes a Phi3ForCausalLM (fused weights by the same rows) for a model of Llama's
block whose RoPE is partial (`first`) or longrope, or whose every layer slides.
"""

from __future__ import annotations

import dataclasses

from longctx.config.model import ModelConfig
from longctx.errors import CheckpointError
from longctx.model.families.common import (
    LLAMA_LAYER_NAMES,
    NO_SPECIAL_IDS,
    Family,
    common_fields,
    common_hf_config,
    refuse_fields,
    scaling_to_hf,
)
from longctx.model.families.llama import PLAIN_BLOCK
from longctx.model.rope import RopeScaling, longrope_attention_factor

LONGROPE = ("longrope", "su", "yarn")
ORIGINAL_DEFAULT = 4096
"""Phi3Config's `original_max_position_embeddings` when config.json omits it."""

LAYER_NAMES = {
    **{ours: theirs for ours, theirs in LLAMA_LAYER_NAMES.items() if ".bias" not in ours and "attn.q_norm" not in ours},
    "attn.wq.weight": "self_attn.qkv_proj.weight",
    "attn.wk.weight": "self_attn.qkv_proj.weight",
    "attn.wv.weight": "self_attn.qkv_proj.weight",
    "mlp.gate.weight": "mlp.gate_up_proj.weight",
    "mlp.up.weight": "mlp.gate_up_proj.weight",
}


def fused(name: str, config: ModelConfig) -> tuple[int, int] | None:
    """Rows of our q/k/v in qkv_proj and of gate/up in gate_up_proj."""
    q, kv, ff = config.n_heads * config.head_size, config.n_kv_heads * config.head_size, config.d_ff
    return {
        "attn.wq.weight": (0, q),
        "attn.wk.weight": (q, q + kv),
        "attn.wv.weight": (q + kv, q + 2 * kv),
        "mlp.gate.weight": (0, ff),
        "mlp.up.weight": (ff, 2 * ff),
    }.get(name)


def read(hf: dict, source: str) -> ModelConfig:
    parameters = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    kind = parameters.get("rope_type", parameters.get("type", "default"))
    fraction = parameters.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    if int(head_dim * fraction) % 2:
        raise CheckpointError(f"{source}: partial_rotary_factor={fraction} rotates an odd number of channels")
    longrope = kind in LONGROPE and "longctx_rope_scaling" not in hf
    if longrope:
        base = parameters.get("rope_theta") or hf.get("rope_theta") or 10000.0
        plain = {key: value for key, value in hf.items() if key not in ("rope_scaling", "rope_parameters")}
        fields = common_fields({**plain, "rope_theta": base}, source, bias_flag=False)
        fields["rope_scaling"] = longrope_from_hf(hf, parameters, kind, int(head_dim * fraction) // 2, source)
    else:
        fields = common_fields(hf, source, bias_flag=False)
    window = hf.get("sliding_window")
    layers: dict = {}
    if window is not None and window < fields["max_position"]:
        layers = dict(layer_types=["sliding"] * hf["num_hidden_layers"], sliding_window=int(window))
    return ModelConfig(**fields, **layers, rotary_fraction=float(fraction), partial_rotary="first")


def longrope_from_hf(hf: dict, parameters: dict, kind: str, pairs: int, source: str) -> RopeScaling:
    """longrope's RopeScaling by transformers' rules (module docstring), attention factor resolved."""
    where = f"{source}: rope_type={kind!r}"
    original = int(hf.get("original_max_position_embeddings", ORIGINAL_DEFAULT))  # never the rope dict's
    short, long = (
        _factors(parameters.get(name), pairs, f"{where}: {name}") for name in ("short_factor", "long_factor")
    )
    factor = parameters.get("factor") or hf.get("max_position_embeddings", 4096) / original
    scaling = RopeScaling(
        "longrope",
        factor=max(float(factor), 1.0),
        original_max_position=original,
        short_factor=short,
        long_factor=long,
    )
    attention = parameters.get("attention_factor")
    resolved = float(attention) if attention is not None else longrope_attention_factor(scaling, original)
    if resolved <= 0:
        raise CheckpointError(f"{where}: attention_factor={attention} must be > 0")
    scaling.attention_factor = resolved
    return scaling


def _factors(values: object, pairs: int, where: str) -> list[float]:
    """One number > 0 per rotated pair, or a one-line refusal naming the field."""
    if not isinstance(values, list) or len(values) != pairs:
        raise CheckpointError(f"{where} must be {pairs} factors > 0 (one per rotated pair)")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values):
        raise CheckpointError(f"{where} must be {pairs} factors > 0 (one per rotated pair)")
    return [float(v) for v in values]


def write(config: ModelConfig) -> dict:
    """A Phi3ForCausalLM: Llama's block without biases, partial RoPE as
    `partial_rotary_factor`, longrope as `rope_scaling` with the top-level
    `original_max_position_embeddings`, a window on every layer as `sliding_window`."""
    kinds = config.layer_kinds()
    if config.nope_indices() or ("sliding" in kinds and "full" in kinds):
        raise CheckpointError(
            "cannot export NoPE layers or a mix of sliding and full layers as phi3: its window applies to every layer"
        )
    if config.rotary_fraction != 1 and config.partial_rotary != "first":
        raise CheckpointError(
            f"cannot export model.partial_rotary={config.partial_rotary!r} as phi3: its partial_rotary_factor "
            "rotates the first channels"
        )
    if config.attention_bias != "none":
        raise CheckpointError(f"cannot export model.attention_bias={config.attention_bias!r} as phi3: it has none")
    refuse_fields(config, "Phi-3", {"qk_norm": "none", **PLAIN_BLOCK})
    scaling = config.rope_scaling
    longrope = scaling.type == "longrope"
    if not longrope and scaling.type not in ("none", "ntk"):
        raise CheckpointError(f"cannot export rope scaling {scaling.type!r} as phi3: its RoPE is default or longrope")
    if longrope and config.head_dim and config.head_size * config.n_heads != config.d_model:
        raise CheckpointError(
            "cannot export longrope with a decoupled model.head_dim as phi3: Phi3Config checks the factors "
            "against hidden_size / num_attention_heads"
        )
    values = common_hf_config(
        dataclasses.replace(config, rope_scaling=RopeScaling()), "phi3", "Phi3ForCausalLM", bias_flag=False
    )
    values["longctx_rope_scaling"] = dataclasses.asdict(scaling)
    original = scaling.original_max_position or config.max_position
    rope_scaling = None
    if longrope:
        rope_scaling = {
            "rope_type": "longrope",
            "short_factor": list(scaling.short_factor),
            "long_factor": list(scaling.long_factor),
            "factor": scaling.factor,
            "attention_factor": longrope_attention_factor(scaling, config.max_position),
            "original_max_position_embeddings": original,
        }
    else:
        values["rope_theta"] = scaling_to_hf(config)[0]  # ntk: the larger base
    values.update(
        rope_scaling=rope_scaling,
        original_max_position_embeddings=original,
        partial_rotary_factor=config.rotary_fraction,
        sliding_window=config.sliding_window if "sliding" in kinds else None,
        **NO_SPECIAL_IDS,  # Phi3Config's defaults are Phi's tokenizer's (32,000)
    )
    return values


def exports(config: ModelConfig) -> bool:
    """A model export writes as phi3: partial (`first`) RoPE, longrope, or every layer sliding."""
    kinds = config.layer_kinds()
    every_layer_slides = "full" not in kinds
    return (
        config.rope_scaling.type == "longrope"
        or (config.rotary_fraction != 1 and config.partial_rotary == "first")
        or every_layer_slides
    )


PHI3 = Family(
    "phi3",
    "Phi3ForCausalLM",
    read,
    layer_names=LAYER_NAMES,
    fused=fused,
    refused=(
        "hidden_act other than silu",
        "longrope without short_factor / long_factor of one factor > 0 per rotated pair",
    ),
    write=write,
)
