"""`olmo3`: OLMo 2's block (qk-norm over the whole q and k projections, norms after the
sublayers; families/olmo2.py) with sliding layers: `layer_types` (default: every 4th layer
full, the rest sliding) and the window `sliding_window` (4,096 in OLMo 3 7B / 32B). RoPE per
layer type: transformers 5's `rope_parameters` {full_attention, sliding_attention}, or
4.x's `rope_theta` for both with `rope_scaling` (YaRN in the long-context checkpoints) on the
full layers only, as transformers applies it. Refused: a scaled RoPE on the sliding layers
(longctx's sliding layers rotate unscaled), `mlp_bias`. Export writes post-norm models with
sliding layers as olmo3 (transformers 5's `rope_parameters` per layer type).
"""

from __future__ import annotations

from longctx.config.model import ModelConfig
from longctx.errors import CheckpointError
from longctx.model.families.common import (
    Family,
    common_fields,
    common_hf_config,
    layer_types_from_hf,
    refuse_fields,
    refuse_qkv_bias,
    refuse_true,
    rope_from_hf,
    scaling_to_hf,
)
from longctx.model.families.llama import MLP_BIAS, PLAIN_BLOCK
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


def write(config: ModelConfig) -> dict:
    """An Olmo3ForCausalLM: OLMo 2's block, `layer_types` with the window, RoPE per layer type
    (full: rope_base + scaling; sliding: sliding_rope_base, unscaled)."""
    if config.nope_indices():
        raise CheckpointError(
            "cannot export NoPE layers (model.nope_layers / nope_every) as olmo3: every layer rotates"
        )
    refuse_fields(
        config, "OLMo 3", {**PLAIN_BLOCK, "norm_placement": "post", "qk_norm": "projection", "rotary_fraction": 1}
    )
    refuse_qkv_bias(config, "olmo3")
    values = common_hf_config(config, "olmo3", "Olmo3ForCausalLM")
    theta, scaling = scaling_to_hf(config)
    for key in ("rope_theta", "rope_scaling"):
        values.pop(key)
    values.update(
        layer_types=[f"{kind}_attention" for kind in config.layer_kinds()],
        sliding_window=config.sliding_window or config.max_position,
        rope_parameters={
            "full_attention": {"rope_type": "default", **(scaling or {}), "rope_theta": theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": config.sliding_rope_base or config.rope_base},
        },
        attention_bias=config.attention_bias == "qkvo",
        bos_token_id=None,  # Olmo3Config's default ids are OLMo's tokenizer's: export_hf writes the run's
        eos_token_id=None,
        pad_token_id=None,
    )
    return values


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
    write=write,
)
