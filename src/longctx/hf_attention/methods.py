"""Which position method a Hugging Face model runs, with which parameters, on which RoPE.

The parameters are longctx's own (`eval.position_method.<method>.*`, resolved by
`PositionMethodConfig.resolved` against the training length L: StRing's S = L/3, W = 128,
the baselines' STRING §4.2 protocol), stored in the model's config under
`longctx_position_method` = {"name", "training_length", "params"} so that
`save_pretrained` / `from_pretrained(dir, attn_implementation="longctx_<name>")` keep
them. A config without them (any HF checkpoint) runs the method's defaults.

The method runs on *relative* rotations (`relative_method`): transformers hands the
attention function queries and keys already rotated at their own positions p by the
model's RoPE (with its `attention_scaling`), and RoPE rotations compose, so a pass that
puts a query at position f(p) rotates the given query by f(p) - p, and a pass that puts
a key at g(n) rotates the given key by g(n) - n (ReRoPE's keys at 0: by -n). Nothing is
un-rotated, `attention_scaling` stays where transformers put it (on q and k, as longctx's
own YaRN does), and only the model's inverse frequencies are needed: computed from the
config by transformers' own functions (`inverse_frequencies`), the values of the
model's rotary embedding.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import torch
from torch import nn

from longctx.config.methods.registry import method_names, method_spec
from longctx.config.position_methods import PositionMethodConfig
from longctx.errors import ConfigError, HFAttentionError
from longctx.model.position_methods import AttentionPass, PositionMethod, builder_for
from longctx.model.position_methods.method import own_positions
from longctx.model.rope import RopeScaling, RotaryEmbedding

PREFIX = "longctx_"


def attention_methods() -> tuple[str, ...]:
    """Every registered `passes`-kind method (plugins included): each has an attention
    function, `longctx_<name>`."""
    return method_names("passes")


def rope_methods() -> tuple[str, ...]:
    """Every registered `rope`-kind method with a transformers equivalent (its spec's
    `hf_rope`): `apply` edits the model's rope parameters into it."""
    return tuple(name for name in method_names("rope") if method_spec(name).hf_rope is not None)


CONFIG_KEY = "longctx_position_method"
"""config attribute holding {"name", "training_length", "params"} of the applied method."""
ORIGINAL_ROPE_KEY = "longctx_original_rope_parameters"
"""config attribute holding the model's own rope parameters once ntk/yarn replaced them."""
MODEL_TYPES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "smollm3",
    "gemma3_text",
    "olmo2",
    "olmo3",
    "phi3",
    "gpt_oss",
    "olmo_hybrid",
    "qwen3_next",
)
"""Families whose attention rotates q/k with the config's RoPE (every head dimension, or
the first partial_rotary_factor x D of PARTIAL_ROTARY_TYPES; on a NoPE layer, none), updates the cache, then calls the
attention function with q [B,H,Tq,D] and the layer's cache: the whole cache on a full layer, the kept window
plus the new keys on a sliding layer (transformers' sliding cache layers). gpt-oss (its
experts computed by transformers) hands its sinks as `s_aux`, one logit per head that joins
each softmax once (kernel.py). The hybrids olmo_hybrid and qwen3_next interleave Gated
DeltaNet layers (`linear_attention` in layer_types: a recurrence with no positions, which
never calls the attention function and which the methods leave as they are) with full
attention layers; qwen3_next's output gate (sigmoid of the doubled q_proj's second half,
times the attention output) and both families' q/k norms act outside the function."""
PARTIAL_ROTARY_TYPES = ("phi3", "qwen3_next")
"""Families whose attention rotates the first R = int(p D) channels of each head, rotate-half
within them (transformers' `apply_rotary_pos_emb` with rotary_dim = cos.shape[-1]), under
partial_rotary_factor p: Phi-4-mini's 0.75, Qwen3-Next's 0.25. The methods rotate those R
channels by the R/2 frequencies over R (model/rope.py's `first` partial rotation) and leave
the rest as they are, so every rewritten distance acts on the rotary part only."""
LINEAR = "linear_attention"
"""layer_types entry of a linear-attention (Gated DeltaNet) layer: no positions, no attention function."""
FULL_ONLY_TYPES = ("llama", "mistral", "qwen2", "phi3")
"""Families served with full attention on every layer (their longctx import refuses sliding layers)."""
FULL = "full_attention"
SLIDING = "sliding_attention"
ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")
"""Rope types served: static frequencies, and Phi-3's longrope under longctx_rope (the
attention function gets q/k rotated by whichever set transformers chose and rotates
nothing itself, so it equals eager whatever the set)."""


def attention_name(method: str) -> str:
    return PREFIX + method


def fail(method: str, reason: str) -> HFAttentionError:
    """The one-line refusal: `longctx_<method>: <reason>`."""
    return HFAttentionError(f"{attention_name(method)}: {reason}")


def _coerce(method: str, key: str, value: Any, default: Any) -> Any:
    """`value` as the type of the field's default (model_args and JSON hand strings and ints)."""
    kind = type(default)
    try:
        if kind is bool:
            if isinstance(value, str):
                if value.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(value)
                return value.lower() in ("true", "1")
            return bool(value)
        if kind is int and isinstance(value, float) and not value.is_integer():
            raise ValueError(value)
        return kind(value)
    except (TypeError, ValueError):
        raise fail(method, f"parameter {key}={value!r} is not a {kind.__name__}") from None


def resolve(method: str, params: dict[str, Any], training_length: int) -> dict[str, Any]:
    """longctx's parameters of `method` with `params` set and the rest resolved against the
    training length (the 0-valued ones by STRING §4.2's protocol); an unknown or
    out-of-range parameter is a one-line error naming it."""
    if method not in method_names():
        raise HFAttentionError(f"unknown position method {method!r}; longctx has {method_names()}")
    known = {field.name: field.default for field in dataclasses.fields(method_spec(method).params)}
    values = {}
    for key, value in params.items():
        if key not in known:
            names = ", ".join(known) or "none"
            raise fail(method, f"unknown parameter {key!r} (the parameters of {method}: {names})")
        values[key] = _coerce(method, key, value, known[key])
    config = PositionMethodConfig().with_params(method, values)
    try:
        return config.resolved(training_length, prefix="")
    except ConfigError as error:
        raise fail(method, f"parameter {error.key.rpartition('.')[2]}: {error.message}") from None
    except ValueError as error:  # baseline_protocol: a training length too short
        raise fail(method, str(error)) from None


def training_length_of(config, override: int | None = None) -> int:
    """L: `override`, else max_position_embeddings (as longctx's import_hf reads it)."""
    length = override if override is not None else getattr(config, "max_position_embeddings", None)
    if not isinstance(length, int) or isinstance(length, bool) or length <= 0:
        raise HFAttentionError(f"training_length must be a positive integer, got {length!r}")
    return length


def per_layer_type(parameters: object) -> bool:
    """True for rope parameters keyed by layer type (Gemma 3, OLMo 3: {full_attention, sliding_attention})."""
    return isinstance(parameters, dict) and isinstance(parameters.get(FULL), dict)


def rope_parameters(config) -> dict:
    """The rope parameters of the full-attention layers (transformers 5's `rope_parameters`, or
    its `full_attention` entry where they are keyed by layer type), rope_type included: the
    RoPE the position methods run on."""
    parameters = getattr(config, "rope_parameters", None)
    if isinstance(parameters, dict) and per_layer_type(parameters):
        return parameters[FULL]
    if not isinstance(parameters, dict):
        raise HFAttentionError(
            f"config has rope_parameters={parameters!r}, expected a dict (one RoPE, or one per layer type)"
        )
    return parameters


def with_full_rope(config, full: dict) -> dict:
    """The config's rope_parameters with the full-attention layers' replaced by `full` (the
    sliding layers' entry, where there is one, kept: they attend as trained)."""
    parameters = getattr(config, "rope_parameters", None)
    if isinstance(parameters, dict) and per_layer_type(parameters):
        return {**copy.deepcopy(parameters), FULL: copy.deepcopy(full)}
    return copy.deepcopy(full)


def layer_designs(config) -> list[tuple[int | None, bool]]:
    """(window, rotates) of each layer as transformers runs it: window W on a sliding layer
    (layer_types[i] == sliding_attention with a sliding_window in force; SmolLM3 also needs
    use_sliding_window), None on a full one; rotates False on a NoPE layer (SmolLM3's
    no_rope_layers[i] == 0; every layer of a rope-free model, `has_rope`) and on a
    linear-attention layer (no positions)."""
    n_layers = config.num_hidden_layers
    types = getattr(config, "layer_types", None) or [FULL] * n_layers
    window = getattr(config, "sliding_window", None)
    if config.model_type == "smollm3" and not getattr(config, "use_sliding_window", False):
        window = None
    uses_rope = getattr(config, "no_rope_layers", None) or [1] * n_layers
    rope = has_rope(config)
    return [
        (window if kind == SLIDING else None, rope and kind != LINEAR and bool(uses))
        for kind, uses in zip(types, uses_rope, strict=True)
    ]


def has_rope(config) -> bool:
    """False for a model whose attention rotates nothing: rope_parameters None, or a
    `rope_theta` of None in the full layers' entry. transformers' OLMo Hybrid then builds no
    rotary embedding (`OlmoHybridModel.rotary_emb` is None) and its full layers are NoPE,
    as in the released checkpoints (config.json: rope_theta null)."""
    parameters = getattr(config, "rope_parameters", None)
    if not isinstance(parameters, dict):
        return parameters is not None
    full = parameters[FULL] if per_layer_type(parameters) else parameters
    return full.get("rope_theta", 0) is not None


def rotary_full_layers(config) -> list[int]:
    """The layers a method runs on: full attention layers that rotate (docs/design.md §8)."""
    return [index for index, (window, rotates) in enumerate(layer_designs(config)) if window is None and rotates]


def trained_window(config) -> int | None:
    """The sliding layers' window (the layers a method leaves as trained), None without any."""
    windows = [window for window, _ in layer_designs(config) if window is not None]
    return max(windows) if windows else None


def check_model(config, method: str, training_length: int) -> None:
    """Refuse, in one line, a model whose attention the functions cannot reproduce exactly.

    `longrope` runs plain `longctx_rope` only: the methods rotate by relative angles with one
    set of frequencies (`relative_method`), but longrope's set changes with each forward's
    largest position, and a cache that crossed the switch in a raw cached forward holds keys
    of both sets, so no rewritten distance would be exact; ntk / yarn would drop its factors.
    longctx's own model refuses the methods on longrope for the same reason.

    A rope-free model (no full attention layer rotates: released OLMo Hybrid, whose
    `rope_theta` is None) is refused for every method, `rope`, ntk and yarn included: the
    methods rewrite RoPE distances on the full layers that rotate, and it has none."""
    model_type = getattr(config, "model_type", None)
    if model_type not in MODEL_TYPES:
        raise fail(
            method,
            f"model_type {model_type!r} is not supported: {MODEL_TYPES} call the attention function with "
            "q/k rotated by the config's RoPE and the layer's cache",
        )
    if not rotary_full_layers(config):
        why = (
            "rope_theta=None: its attention layers are NoPE, as in the released OLMo Hybrid checkpoints"
            if not has_rope(config)
            else "every full attention layer is NoPE"
        )
        raise fail(
            method,
            f"{model_type} is a rope-free model ({why}): no full attention layer rotates, so the method has "
            "nothing to act on",
        )
    for key, what in (
        ("attn_logit_softcapping", "attention logit soft-capping"),
        ("use_bidirectional_attention", "bidirectional attention"),
    ):
        if getattr(config, key, None):
            raise fail(method, f"{key}={getattr(config, key)} is not supported ({what} is not reproduced)")
    rope_type = rope_parameters(config).get("rope_type", "default")
    if rope_type == "longrope" and method != "rope":
        raise fail(
            method,
            "rope_type 'longrope' runs under longctx_rope only: its frequencies switch with the forward's largest "
            "position and a cache crossing the switch holds keys of both sets, so no method's distances are exact",
        )
    if rope_type == "dynamic":
        raise fail(
            method,
            f"rope_type {rope_type!r} is not supported: its frequencies change with the sequence length at run time",
        )
    if rope_type not in ROPE_TYPES:
        raise fail(method, f"rope_type {rope_type!r} is not supported (static rope types: {ROPE_TYPES})")
    partial = partial_rotary_factor(config)
    if partial != 1.0 and model_type not in PARTIAL_ROTARY_TYPES:
        raise fail(
            method,
            f"partial_rotary_factor={partial} is not supported on {model_type} (partial RoPE: {PARTIAL_ROTARY_TYPES})",
        )
    if model_type not in FULL_ONLY_TYPES:
        return
    if getattr(config, "use_sliding_window", False):
        raise fail(method, "use_sliding_window=true is not supported (full attention only)")
    sliding = [kind for kind in getattr(config, "layer_types", None) or [] if kind != FULL]
    if sliding:
        raise fail(method, f"layer_types has {sliding[0]!r} layers; full attention only")
    window = getattr(config, "sliding_window", None)
    if model_type in ("mistral", "phi3") and window is not None and window < training_length:
        raise fail(
            method,
            f"sliding_window={window} is shorter than the training length {training_length}: "
            "the methods need full attention over the sequence",
        )


def partial_rotary_factor(config) -> float:
    """p of transformers' `partial_rotary_factor` (Phi-3/4, Qwen3-Next: the first p x D channels rotate), 1 = all."""
    partial = rope_parameters(config).get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
    return 1.0 if partial is None else float(partial)


def inverse_frequencies(config) -> torch.Tensor:
    """theta_i of the model's rotary embedding, computed as transformers computes them
    (float32): the default formula of LlamaRotaryEmbedding, else ROPE_INIT_FUNCTIONS."""
    parameters = rope_parameters(config)
    rope_type = parameters.get("rope_type", "default")
    if rope_type == "default":
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        dim = int(head_dim * partial_rotary_factor(config))
        return 1.0 / (parameters["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    layer_type = {"layer_type": FULL} if per_layer_type(config.rope_parameters) else {}
    inv_freq, _ = ROPE_INIT_FUNCTIONS[rope_type](config, None, **layer_type)
    return inv_freq.float()


class FixedRotary(RotaryEmbedding):
    """A RotaryEmbedding with given inverse frequencies and no attention factor: the
    relative rotations of `relative_method`. Moves keep the float32 frequencies."""

    def __init__(self, inv_freq: torch.Tensor):
        nn.Module.__init__(self)
        self.head_dim = 2 * inv_freq.shape[0]
        self.scaling = RopeScaling()
        self.position_scale = 1.0
        self.attention_factor = 1.0
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)
        self.register_buffer("long_inv_freq", None, persistent=False)

    def _apply(self, fn, recurse=True):
        exact = self.inv_freq
        nn.Module._apply(self, fn, recurse)
        self.inv_freq = exact.to(self.inv_freq.device)
        return self


def relative_method(method: PositionMethod, inv_freq: torch.Tensor) -> PositionMethod:
    """`method` on already-rotated q/k (module docstring): each pass's query map f becomes
    f(p) - p and, for methods that rotate keys at rewritten positions, each key map g
    becomes g(n) - n (a key at its own position: 0, the identity rotation)."""
    own_keys = method.caches_rotated_keys
    relative_maps: dict[int, Any] = {}

    def relative(position_map):
        if id(position_map) not in relative_maps:
            if position_map is None:
                relative_maps[id(position_map)] = torch.zeros_like
            else:
                relative_maps[id(position_map)] = lambda p, f=position_map: f(p) - p
        return relative_maps[id(position_map)]

    def convert(attention_pass: AttentionPass) -> AttentionPass:
        keys = None if own_keys else relative(attention_pass.key_positions)
        return dataclasses.replace(
            attention_pass, query_positions=relative(attention_pass.query_positions), key_positions=keys
        )

    converted = PositionMethod(
        method.name,
        FixedRotary(inv_freq),
        [convert(p) for p in method.passes],
        params=method.params,
        score_multiplier=method.score_multiplier,
        query_scale=method.query_scale,
        decode_passes=None if method.decode_passes is None else [convert(p) for p in method.decode_passes],
        exact_below=method.exact_below,
    )
    passes = [*method.passes, *(method.decode_passes or [])]
    converted.rotation_free = all(p.query_positions is own_positions and p.key_positions is None for p in passes)
    return converted


def longctx_method(method: str, params: dict[str, Any], rotary: RotaryEmbedding) -> PositionMethod:
    """longctx's PositionMethod of an attention method with resolved `params`."""
    try:
        return builder_for(method)(rotary, **params)
    except ValueError as error:
        raise fail(method, str(error)) from None


def stored_settings(config, method: str) -> tuple[dict[str, Any], int | None]:
    """(params, training_length) stored in `config` for `method`, or ({}, None)."""
    stored = getattr(config, CONFIG_KEY, None)
    if isinstance(stored, dict) and stored.get("name") == method:
        return dict(stored.get("params") or {}), stored.get("training_length")
    return {}, None


_BUILT: dict[str, PositionMethod] = {}
"""Relative methods by a key of everything they depend on: built once per model setting."""


def method_for(config, method: str) -> PositionMethod:
    """The relative PositionMethod the attention function runs for a model's config:
    the stored parameters of `method` (else its defaults), checked and cached."""
    params, stored_length = stored_settings(config, method)
    length = training_length_of(config, stored_length)
    key = json.dumps(
        [
            method,
            params,
            length,
            getattr(config, "rope_parameters", None),
            getattr(config, "head_dim", None),
            config.model_type,
            trained_window(config),
        ],
        sort_keys=True,
        default=str,
    )
    if key not in _BUILT:
        check_model(config, method, length)
        resolved = resolve(method, params, length)
        if rope_parameters(config).get("rope_type") == "longrope" and resolved.get("repo_score_scale"):
            raise fail(method, "rope_type 'longrope' runs plain longctx_rope only (repo_score_scale is a method)")
        inv_freq = inverse_frequencies(config)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        partial = partial_rotary_factor(config)
        if partial == 1.0:
            head_dim = 2 * inv_freq.shape[0]
        # the builders' checks see the model's partial rotation (ReRoPE's log-n scaling is refused under it)
        placeholder = RotaryEmbedding(head_dim, 10000.0, RopeScaling(), length, rotary_fraction=partial)
        own = longctx_method(method, resolved, placeholder)
        check_window(own, method, trained_window(config))
        _BUILT[key] = relative_method(own, inv_freq)
    return _BUILT[key]


def check_window(method: PositionMethod, name: str, window: int | None) -> None:
    """A method leaves the sliding layers as trained (longctx's model does the same,
    docs/design.md §8): exact only if it equals RoPE at every distance the window holds
    (`exact_below`: StRing's S, ReRoPE's window, Self-Extend's neighbour window, DCA's
    local window; 0 with a score temperature)."""
    if window is not None and window > method.exact_below:
        raise fail(
            name,
            f"the method changes distances below {method.exact_below}, and the sliding layers' window "
            f"sliding_window={window} sees them: use parameters whose exact band covers the window",
        )
