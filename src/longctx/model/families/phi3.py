"""`phi3` (Phi-3, Phi-3.5, Phi-4-mini): Llama's block with fused projections, read by rows:
`qkv_proj` = [q (n_heads x D); k (n_kv_heads x D); v (n_kv_heads x D)] and `gate_up_proj` =
[gate (d_ff); up (d_ff)] (transformers' Phi3MLP: gate, up = chunk(2)). Partial RoPE:
`partial_rotary_factor` p (Phi-4-mini 0.75) rotates the first p·D channels of each head
(`rotary_fraction`, `partial_rotary: first`). A `sliding_window` below
`max_position_embeddings` makes every layer slide (transformers' Phi-3 passes it to every
layer: Phi-3-mini-4k's 2,047).

Refused: `longrope` (and the "su" / "yarn" names transformers maps onto it) — transformers
rotates a forward with the long factors iff its largest position + 1 exceeds
`original_max_position_embeddings`, so cached generation switches factors mid-sequence while
earlier keys keep the short rotation; longctx's RoPE has one rotation per position. Not
written by export.
"""

from __future__ import annotations

from longctx.config.model import ModelConfig
from longctx.errors import CheckpointError
from longctx.model.families.common import LLAMA_LAYER_NAMES, Family, common_fields

LONGROPE = ("longrope", "su", "yarn")

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
    parameters = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    kind = parameters.get("rope_type", parameters.get("type", "default"))
    if kind in LONGROPE:
        raise CheckpointError(
            f"{source}: rope_type={kind!r} is not supported: transformers' longrope switches short/long factors "
            "per forward (long iff its largest position + 1 > original_max_position_embeddings), which longctx's "
            "RoPE does not reproduce"
        )
    fields = common_fields(hf, source)
    fraction = parameters.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    if int(head_dim * fraction) % 2:
        raise CheckpointError(f"{source}: partial_rotary_factor={fraction} rotates an odd number of channels")
    window = hf.get("sliding_window")
    layers: dict = {}
    if window is not None and window < fields["max_position"]:
        layers = dict(layer_types=["sliding"] * hf["num_hidden_layers"], sliding_window=int(window))
    return ModelConfig(**fields, **layers, rotary_fraction=float(fraction), partial_rotary="first")


PHI3 = Family(
    "phi3",
    "Phi3ForCausalLM",
    read,
    layer_names=LAYER_NAMES,
    fused=fused,
    refused=(
        "rope_type longrope (su, yarn): its factors switch per forward with the sequence length",
        "hidden_act other than silu",
    ),
)
