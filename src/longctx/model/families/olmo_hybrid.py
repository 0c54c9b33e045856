"""`olmo_hybrid` (OLMo Hybrid, allenai; transformers' OlmoHybridForCausalLM): Gated DeltaNet
`linear_attention` layers interleaved with `full_attention` layers (`layer_types`; by
default every 4th layer full, as the released 7B), two kinds of block:

- a full layer is OLMo 3's block (families/olmo3.py): qk-norm over the whole q and k
  projections, norms after the sublayers (`norm_placement: post`), head_dim = width / heads;
- a linear layer is a Llama block (norms before the sublayers,
  `linear_attention.norm_placement: pre`) around OLMo Hybrid's Gated DeltaNet: separate
  q/k/v/a/b projections, the output gate `g_proj`, beta x 2 with `linear_allow_neg_eigval`
  (true by default), the gated norm's eps 1e-5 (`variant: olmo_hybrid`).

RoPE: the released checkpoints set `rope_theta` null (in `rope_parameters`, or at the top
level): transformers builds no rotary embedding and the full layers are NoPE (read as
`nope_layers` = the full layers), so the model has no positions but the linear layers' order.
With a `rope_theta` (transformers' default 10,000 where `rope_parameters` is absent) the full
layers rotate every channel, with the `rope_type` scalings longctx reads (families/common.py).

The files name two norms otherwise than the modules (`attention_layer_norm` /
`feedforward_layer_norm`) and split the convolution into `q_conv1d`, `k_conv1d`, `v_conv1d`;
either form is read, the released one written (families/stored.py). More value heads than
key heads (`linear_num_value_heads`) are read as transformers' kernels compute them, each key
head serving consecutive value heads. Export refuses a `head_dim` other than width / heads and
a mix of NoPE and rotating full layers.
"""

from __future__ import annotations

from longctx.config.linear_attention import LinearAttention
from longctx.config.model import ModelConfig
from longctx.errors import CheckpointError
from longctx.model.families.common import (
    NO_SPECIAL_IDS,
    Family,
    common_fields,
    common_hf_config,
    refuse_fields,
    rope_parameters_to_hf,
)
from longctx.model.families.hybrid import LINEAR_COMMON, check_layout, hybrid_layer_types, linear_heads
from longctx.model.families.olmo2 import LAYER_NAMES, OLMO_BLOCK
from longctx.model.families.stored import Join, StoredForm

DEFAULTS = {"rms_norm_eps": 1e-6, "max_position_embeddings": 65536}
"""OlmoHybridConfig's defaults for fields a config.json may omit."""

LINEAR_NAMES = {
    **LINEAR_COMMON,
    **{f"attn.{name}.weight": f"linear_attn.{name}.weight" for name in ("q_proj", "k_proj", "v_proj", "a_proj")},
    "attn.b_proj.weight": "linear_attn.b_proj.weight",
    "attn.g_proj.weight": "linear_attn.g_proj.weight",
    "attn.norm_weight": "linear_attn.o_norm.weight",
    "attn.wo.weight": "linear_attn.o_proj.weight",
}


def _conv_rows(config: ModelConfig) -> tuple[int, int, int]:
    n_key, n_value, key_dim, value_dim = config.linear_attention.heads(config.n_heads, config.head_size)
    return n_key * key_dim, n_key * key_dim, n_value * value_dim


STORED = StoredForm(
    renames=(("attention_layer_norm", "input_layernorm"), ("feedforward_layer_norm", "post_attention_layernorm")),
    joins=(
        Join(
            "linear_attn.conv1d.weight",
            ("linear_attn.q_conv1d.weight", "linear_attn.k_conv1d.weight", "linear_attn.v_conv1d.weight"),
            _conv_rows,
        ),
    ),
)


def rope_free(hf: dict) -> bool:
    """`rope_theta` null (OLMo Hybrid as released): transformers builds no rotary embedding."""
    parameters = hf.get("rope_parameters")
    if isinstance(parameters, dict) and "rope_theta" in parameters:
        return parameters["rope_theta"] is None
    return "rope_theta" in hf and hf["rope_theta"] is None


def read(hf: dict, source: str) -> ModelConfig:
    hf = {**DEFAULTS, **hf}
    hf.pop("head_dim", None)  # OlmoHybridConfig has none: width / heads, whatever a file says
    nope = rope_free(hf)
    if nope:  # the RoPE fields are unused; longctx keeps its default base
        hf = {key: value for key, value in hf.items() if key not in ("rope_theta", "rope_parameters", "rope_scaling")}
    fields = common_fields(hf, source)
    n_layers = hf["num_hidden_layers"]
    default = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(n_layers)]
    if "full_attention" not in default:
        default[-1] = "full_attention"
    kinds = hybrid_layer_types(hf, source, default)
    heads = fields["n_heads"]
    n_key = hf.get("linear_num_key_heads") or heads
    n_value = hf.get("linear_num_value_heads") or heads
    key_dim = hf.get("linear_key_head_dim") or int(0.75 * hf["hidden_size"] / n_key)
    linear = LinearAttention(
        variant="olmo_hybrid",
        n_key_heads=n_key,
        n_value_heads=n_value,
        key_head_dim=key_dim,
        value_head_dim=hf.get("linear_value_head_dim") or 2 * key_dim,
        conv_size=hf.get("linear_conv_kernel_dim", 4),
        allow_neg_eigval=bool(hf.get("linear_allow_neg_eigval", True)),
        norm_placement="pre",
    )
    return ModelConfig(
        **fields,
        layer_types=kinds,
        nope_layers=[i for i, kind in enumerate(kinds) if kind == "full"] if nope else None,
        **OLMO_BLOCK,
        linear_attention=linear,
    )


def write(config: ModelConfig) -> dict:
    """An OlmoHybridForCausalLM: `layer_types`, the linear layers' heads, RoPE as
    `rope_parameters` or `rope_theta` null where every full layer is NoPE."""
    layer_types = check_layout(config, "olmo_hybrid")
    refuse_fields(config, "OLMo Hybrid", OLMO_BLOCK)
    if config.head_size * config.n_heads != config.d_model:
        raise CheckpointError(
            f"cannot export model.head_dim={config.head_dim} as olmo_hybrid: its head_dim is hidden_size / "
            f"num_attention_heads = {config.d_model / config.n_heads:g}"
        )
    spec = config.linear_attention
    if spec.norm_placement != "pre":
        raise CheckpointError(
            f"cannot export model.linear_attention.norm_placement={spec.norm_placement!r} as olmo_hybrid: its "
            "linear layers are pre-norm blocks ('pre')"
        )
    heads = linear_heads(config)
    full = {i for i, kind in enumerate(config.layer_kinds()) if kind == "full"}
    nope = full & config.nope_indices()
    if nope and nope != full:
        raise CheckpointError(
            f"cannot export NoPE full layers {sorted(nope)} beside rotating ones {sorted(full - nope)} as "
            "olmo_hybrid: its full layers all rotate or (rope_theta null) none (model.nope_layers / nope_every)"
        )
    values = common_hf_config(
        config, "olmo_hybrid", "OlmoHybridForCausalLM", omit=("rope_theta", "rope_scaling", "head_dim")
    )
    values.update(
        layer_types=layer_types,
        rope_parameters={"rope_type": "default", "rope_theta": None} if nope else rope_parameters_to_hf(config),
        linear_allow_neg_eigval=spec.allow_neg_eigval,
        **heads,
        **NO_SPECIAL_IDS,  # OlmoHybridConfig's default ids are OLMo's tokenizer's
    )
    return values


OLMO_HYBRID = Family(
    "olmo_hybrid",
    "OlmoHybridForCausalLM",
    read,
    layer_names=LAYER_NAMES,
    linear_names=LINEAR_NAMES,
    stored=STORED,
    refused=(
        "hidden_act other than silu",
        "export: NoPE and rotating full layers mixed (rope_theta null is all NoPE)",
    ),
    write=write,
)
