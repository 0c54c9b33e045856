"""`olmo3`: OLMo 2's block (qk-norm over the whole q and k projections, norms after the
sublayers; families/olmo2.py) with sliding layers: `layer_types` (default: every 4th layer
full, the rest sliding) and the window `sliding_window` (4,096 in OLMo 3 7B / 32B). RoPE per
layer type: transformers 5's `rope_parameters` {full_attention, sliding_attention}, or
4.x's `rope_theta` for both with `rope_scaling` (YaRN in the long-context checkpoints) on the
full layers only, as transformers applies it. Refused: a scaled RoPE on the sliding layers
(longctx's sliding layers rotate unscaled), `mlp_bias`. Not written by export.
"""

from __future__ import annotations

from longctx.config.model import ModelConfig
from longctx.errors import CheckpointError
from longctx.model.families.common import Family, common_fields, layer_types_from_hf, refuse_true, rope_from_hf
from longctx.model.families.llama import MLP_BIAS
from longctx.model.families.olmo2 import LAYER_NAMES

DEFAULTS = {"rope_theta": 500000.0, "sliding_window": 4096, "max_position_embeddings": 2048}
"""Olmo3Config's defaults for fields a config.json may omit."""


def read(hf: dict, source: str) -> ModelConfig:
    hf = {**DEFAULTS, **hf}
    refuse_true(hf, source, MLP_BIAS)
    fields = common_fields(hf, source)
    if hf.get("layer_types") is None:
        n_layers = hf["num_hidden_layers"]
        hf["layer_types"] = ["full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(n_layers)]
    layers = layer_types_from_hf(hf, source)
    parameters = hf.get("rope_parameters") or {}
    if "full_attention" in parameters or "sliding_attention" in parameters:
        for layer_type in ("full_attention", "sliding_attention"):
            if not parameters.get(layer_type):
                raise CheckpointError(f"{source}: rope_parameters has no {layer_type!r} entry")
        fields["rope_base"], fields["rope_scaling"] = rope_from_hf(hf, source, "full_attention")
        local_base, local_scaling = rope_from_hf(hf, source, "sliding_attention")
        if local_scaling.type != "none":
            raise CheckpointError(
                f"{source}: rope_parameters.sliding_attention.rope_type={local_scaling.type!r} is not supported "
                "(longctx's sliding layers rotate unscaled)"
            )
    else:
        local_base = float(hf["rope_theta"])
    return ModelConfig(
        **fields,
        **layers,
        sliding_rope_base=local_base if layers else 0.0,
        qk_norm="projection",
        norm_placement="post",
        attention_bias="qkvo" if hf.get("attention_bias") else "none",
    )


OLMO3 = Family(
    "olmo3",
    "Olmo3ForCausalLM",
    read,
    layer_names=LAYER_NAMES,
    refused=(
        "mlp_bias: longctx's MLP has no biases",
        "hidden_act other than silu",
        "rope scaling on the sliding layers: longctx's sliding layers rotate unscaled",
    ),
)
