"""What the linear-attention hybrids' families (olmo_hybrid, qwen3_next) share: their
`layer_types` of `linear_attention` and `full_attention` layers, the names of a linear
layer's tensors (transformers' `linear_attn.*`), and the export checks of the layer layout.

A linear layer is longctx's Gated DeltaNet (model/gated_deltanet.py), whose parameters carry
transformers' names for its variant but the convolution (`conv_weight`, transformers'
`conv1d.weight`, the same [C, 1, K] taps), the gated norm's weight and the output projection.
"""

from __future__ import annotations

from longctx.config.model import ModelConfig
from longctx.errors import CheckpointError

KINDS = {"linear_attention": "linear", "full_attention": "full"}
"""transformers' layer type -> longctx's."""

LINEAR_COMMON = {
    "attn_norm.weight": "input_layernorm.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "attn.conv_weight": "linear_attn.conv1d.weight",
    "attn.A_log": "linear_attn.A_log",
    "attn.dt_bias": "linear_attn.dt_bias",
    "mlp.gate.weight": "mlp.gate_proj.weight",
    "mlp.up.weight": "mlp.up_proj.weight",
    "mlp.down.weight": "mlp.down_proj.weight",
}
"""Our per-layer name -> the HF name in a linear layer (a pre-norm block in both families)."""


def hybrid_layer_types(hf: dict, source: str, default: list[str]) -> list[str]:
    """longctx's `layer_types` of a config.json's `layer_types` (or `default` without one):
    each `linear_attention` or `full_attention`, at least one of each."""
    types = hf.get("layer_types") or default
    n_layers = hf["num_hidden_layers"]
    if len(types) != n_layers:
        raise CheckpointError(f"{source}: layer_types has {len(types)} entries, num_hidden_layers is {n_layers}")
    for index, kind in enumerate(types):
        if kind not in KINDS:
            raise CheckpointError(
                f"{source}: layer_types[{index}]={kind!r} is not supported (linear_attention or full_attention)"
            )
    return [KINDS[kind] for kind in types]


def check_layout(config: ModelConfig, architecture: str) -> list[str]:
    """Export: the model's layers are linear and full ones, at least one full; returns
    transformers' `layer_types` (which full layers rotate, each family checks)."""
    kinds = config.layer_kinds()
    if "sliding" in kinds:
        raise CheckpointError(
            f"cannot export sliding layers (model.layer_types / global_every) as {architecture}: its layers are "
            "linear_attention or full_attention (evaluate the checkpoint with longctx itself)"
        )
    if "full" not in kinds:
        raise CheckpointError(f"cannot export a model of linear layers only as {architecture}: it needs a full layer")
    return [f"{kind}_attention" for kind in kinds]


def linear_heads(config: ModelConfig) -> dict:
    """transformers' `linear_*` fields of the model's linear layers."""
    spec = config.linear_attention
    n_key, n_value, key_dim, value_dim = spec.heads(config.n_heads, config.head_size)
    return {
        "linear_num_key_heads": n_key,
        "linear_num_value_heads": n_value,
        "linear_key_head_dim": key_dim,
        "linear_value_head_dim": value_dim,
        "linear_conv_kernel_dim": spec.conv_size,
    }
