"""`qwen3` (dense): Qwen2's block with per-head qk-norm (q_norm/k_norm of head_dim, before
RoPE), head_dim decoupled from the width, no biases unless `attention_bias` (then q/k/v/o).

Sliding layers: `use_sliding_window` with `sliding_window` W makes layers >=
`max_window_layers` slide (transformers' `layer_types`); they rotate as the full layers do,
which longctx's sliding layers do only without RoPE scaling, so a scaled RoPE with sliding
layers is refused. Released Qwen3 checkpoints set `use_sliding_window: false`.
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
    refuse_hybrid,
    refuse_true,
)
from longctx.model.families.llama import MLP_BIAS, MLP_REFUSED, PLAIN_BLOCK

DEFAULTS = {"head_dim": 128, "rms_norm_eps": 1e-6, "max_position_embeddings": 32768}
"""Qwen3Config's defaults for fields a config.json may omit."""


def read(hf: dict, source: str) -> ModelConfig:
    hf = {**DEFAULTS, **hf}
    refuse_true(hf, source, MLP_BIAS)
    fields = common_fields(hf, source)
    layers = layer_types_from_hf(hf, source, switch="use_sliding_window")
    if layers and fields["rope_scaling"].type != "none":
        raise CheckpointError(
            f"{source}: sliding layers (use_sliding_window=true) with rope scaling "
            f"{fields['rope_scaling'].type!r} are not supported (longctx's sliding layers rotate unscaled)"
        )
    return ModelConfig(
        **fields,
        **layers,
        qk_norm="head",
    )


def write(config: ModelConfig) -> dict:
    """A Qwen3ForCausalLM: per-head qk-norm, every layer full and rotating."""
    refuse_hybrid(config, "qwen3")
    refuse_fields(config, "Qwen3", {"qk_norm": "head", "rotary_fraction": 1, **PLAIN_BLOCK})
    values = common_hf_config(config, "qwen3", "Qwen3ForCausalLM")
    values.update(
        use_sliding_window=False,
        sliding_window=None,
        max_window_layers=config.n_layers,
    )
    return values


QWEN3 = Family(
    "qwen3",
    "Qwen3ForCausalLM",
    read,
    refused=(
        *MLP_REFUSED,
        "use_sliding_window=true together with rope scaling: longctx's sliding layers rotate unscaled",
    ),
    write=write,
)
