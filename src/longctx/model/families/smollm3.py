"""`smollm3`: Llama's block with NoPE layers. transformers' `no_rope_layers[i] == 1` means
layer i *uses* RoPE (default: every `no_rope_layer_interval`-th layer, 3, 7, ..., rotates
nothing); longctx's `nope_layers` lists the layers that do not. Sliding layers where
`use_sliding_window` and `layer_types` say so (transformers' default slides the NoPE
layers). Export writes NoPE models without sliding layers as smollm3.
"""

from __future__ import annotations

from longctx.config.model import ModelConfig
from longctx.errors import CheckpointError
from longctx.model.families.common import (
    NO_SPECIAL_IDS,
    Family,
    common_fields,
    common_hf_config,
    layer_types_from_hf,
    refuse_fields,
    refuse_true,
)
from longctx.model.families.llama import MLP_BIAS, MLP_REFUSED, PLAIN_BLOCK

DEFAULTS = {"rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "tie_word_embeddings": True}
"""SmolLM3Config's defaults for fields a config.json may omit."""


def read(hf: dict, source: str) -> ModelConfig:
    hf = {**DEFAULTS, **hf}
    refuse_true(hf, source, MLP_BIAS)
    fields = common_fields(hf, source)
    n_layers = hf["num_hidden_layers"]
    uses_rope = hf.get("no_rope_layers")
    if uses_rope is None:
        interval = hf.get("no_rope_layer_interval", 4)
        uses_rope = [int((i + 1) % interval != 0) for i in range(n_layers)]
    if len(uses_rope) != n_layers or any(flag not in (0, 1) for flag in uses_rope):
        raise CheckpointError(f"{source}: no_rope_layers={uses_rope} is not {n_layers} flags of 0 or 1")
    nope = [i for i, flag in enumerate(uses_rope) if not flag]
    layers = layer_types_from_hf(hf, source, switch="use_sliding_window")
    rotating_sliding = [
        i for i, kind in enumerate(layers.get("layer_types", [])) if kind == "sliding" and i not in nope
    ]
    if rotating_sliding and fields["rope_scaling"].type != "none":
        raise CheckpointError(
            f"{source}: layer {rotating_sliding[0]} slides and rotates with rope scaling "
            f"{fields['rope_scaling'].type!r}: not supported (longctx's sliding layers rotate unscaled)"
        )
    return ModelConfig(**fields, **layers, nope_layers=nope or None)


def write(config: ModelConfig) -> dict:
    """A SmolLM3ForCausalLM: full layers, the NoPE ones as `no_rope_layers` zeros."""
    if "sliding" in config.layer_kinds():
        raise CheckpointError(
            "cannot export a model with sliding layers as smollm3 (model.layer_types / global_every): "
            "evaluate the checkpoint with longctx itself"
        )
    refuse_fields(config, "SmolLM3", {"qk_norm": "none", "rotary_fraction": 1, **PLAIN_BLOCK})
    nope = config.nope_indices()
    values = common_hf_config(config, "smollm3", "SmolLM3ForCausalLM")
    values.update(
        no_rope_layers=[0 if i in nope else 1 for i in range(config.n_layers)],
        use_sliding_window=False,
        sliding_window=None,
        layer_types=["full_attention"] * config.n_layers,
        mlp_bias=False,
        **NO_SPECIAL_IDS,  # SmolLM3Config's defaults are Llama 3's ids, outside most vocabularies
    )
    return values


SMOLLM3 = Family(
    "smollm3",
    "SmolLM3ForCausalLM",
    read,
    refused=(*MLP_REFUSED, "a sliding layer that rotates, with rope scaling: longctx's sliding layers rotate unscaled"),
    write=write,
)
