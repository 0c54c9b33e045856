"""StRing and the other position methods inside Llama-family and 2025-26 Hugging Face models.

    import longctx.hf_attention as hfa          # registers longctx_rope, longctx_string, longctx_rerope,
                                                # longctx_self_extend, longctx_dca (attention + mask)
    model = AutoModelForCausalLM.from_pretrained(d, attn_implementation="longctx_string")   # S = L/3, W = 128
    hfa.apply(model, "string", shift=2730, local_window=128)   # longctx's parameter names; stored in the config
    hfa.apply(model, "yarn")                     # ntk / yarn: a rope-parameter edit, no attention function
    model.save_pretrained(out)                   # from_pretrained(out, attn_implementation="longctx_string")

transformers' official extension points (`AttentionInterface`, `AttentionMaskInterface`,
transformers 5.23): every `generate` (DynamicCache, StaticCache, left padding), pipeline,
lm-eval `hf` run or training script that loads the model with one of these names runs
longctx's own kernels (model/position_methods: blockwise pure torch on CPU, the varlen
flash passes on CUDA) with a compact mask and one position plan per layer type per forward
(kernel.py).
Parameters are `eval.position_method.<method>.*` with longctx's defaults, resolved against
the training length L = max_position_embeddings (`training_length=` overrides it), the
baselines by STRING §4.2's protocol (methods.py). llama, mistral, qwen2, qwen3, smollm3,
gemma3_text, olmo2, olmo3, phi3, gpt_oss and the linear-attention hybrids olmo_hybrid and
qwen3_next with a static RoPE (default, linear, llama3, yarn) are served (gpt-oss's sinks join
each softmax once, the merged passes' too; partial RoPE, Phi-3's and Qwen3-Next's, on the
rotary channels only), Phi-3's `longrope` under `longctx_rope` only (methods.check_model says
why no other method); the method runs on the full layers that rotate, sliding and NoPE layers
attend as trained, and linear-attention layers (no positions) are left as they are
(docs/design.md §8). Anything the functions
cannot reproduce exactly is refused in one line (errors.HFAttentionError): a window on every
layer shorter than the sequence, a method narrower than a hybrid's window, paged /
continuous-batching caches, dynamic RoPE, longrope under a method, soft-capping, another attention
family, a rope-free model (released OLMo Hybrid: nothing to act on), padding between tokens,
unknown or out-of-range parameters.

This package is the only part of longctx's library that needs transformers for the
methods (the `hf` extra); nothing else imports it, so `import longctx` stays free of it.
"""

from __future__ import annotations

import copy
from typing import Any

from transformers import AttentionInterface, AttentionMaskInterface, __version__

from longctx.config.methods.registry import MethodSpec, load_plugins, method_spec, on_register
from longctx.errors import HFAttentionError
from longctx.hf_attention.kernel import CompactMask, attention_function, mask_function
from longctx.hf_attention.methods import (
    CONFIG_KEY,
    ORIGINAL_ROPE_KEY,
    PREFIX,
    attention_methods,
    attention_name,
    check_model,
    fail,
    layer_designs,
    method_for,
    partial_rotary_factor,
    per_layer_type,
    resolve,
    rope_methods,
    rope_parameters,
    training_length_of,
    with_full_rope,
)

TESTED_TRANSFORMERS = "5.23.0"
"""The transformers version these functions are tested against (the `hf` extra's pin)."""

__all__ = [
    "ATTENTION_NAMES",
    "CONFIG_KEY",
    "METHODS",
    "TESTED_TRANSFORMERS",
    "CompactMask",
    "HFAttentionError",
    "apply",
    "register",
    "transformers_version",
]


def transformers_version() -> str:
    return __version__


def _register_spec(spec: MethodSpec) -> None:
    if spec.kind == "passes":
        AttentionInterface.register(attention_name(spec.name), attention_function(spec.name))
        AttentionMaskInterface.register(attention_name(spec.name), mask_function(spec.name))


def register() -> None:
    """Register longctx_<method> for every attention method, as an attention function and
    as a mask function (without the latter transformers would hand the function no mask
    and padding would be silently ignored). Idempotent; done on import, and a method
    registered later (a plugin, `longctx.model.position_methods.position_method`) is
    registered with transformers as it is added. Plugins (LONGCTX_PLUGINS, installed entry
    points) load first, so `from_pretrained(..., attn_implementation="longctx_<plugin>")`
    finds its function after `import longctx.hf_attention` alone."""
    if not _REGISTERED:
        _REGISTERED.append(True)
        load_plugins()
        on_register(_register_spec)


_REGISTERED: list[bool] = []


register()
METHODS = attention_methods() + rope_methods()
"""What `apply` runs, as of import (`attention_methods()` sees later registrations)."""
ATTENTION_NAMES = tuple(attention_name(method) for method in attention_methods())


def _rotary_modules(model) -> list[tuple[Any, str, Any]]:
    """(parent, attribute, module) of every rotary embedding of the model (one RoPE:
    `inv_freq`; one per layer type, Gemma 3 and OLMo 3: `full_attention_inv_freq`)."""
    found = []
    for parent in model.modules():
        for attribute, child in parent.named_children():
            if hasattr(child, "rope_type") and (
                hasattr(child, "inv_freq") or hasattr(child, "full_attention_inv_freq")
            ):
                found.append((parent, attribute, child))
    return found


def _set_rope(model, parameters: dict) -> None:
    """Replace the config's rope parameters and rebuild the model's rotary embeddings from them."""
    config = model.config
    if parameters == rope_parameters(config):
        return
    rotaries = _rotary_modules(model)
    if not rotaries:
        raise HFAttentionError(f"{type(model).__name__} has no rotary embedding module to rebuild")
    config.rope_parameters = with_full_rope(config, parameters)
    for parent, attribute, old in rotaries:
        device = next(iter(old.buffers())).device
        new = type(old)(config=config).to(device)
        setattr(parent, attribute, new)


def _rope_edit(config, method: str, own_rope: dict, resolved: dict) -> dict:
    """The rope parameters that run `rope`-kind `method` in the model: its spec's `hf_rope`."""
    shared = [i for i, (window, rotates) in enumerate(layer_designs(config)) if window is not None and rotates]
    if shared and not per_layer_type(config.rope_parameters):
        raise fail(
            method,
            f"layer {shared[0]} slides and rotates with the full layers' RoPE: {method} would rescale it too "
            "(longctx's sliding layers rotate unscaled)",
        )
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    head_dim = int(head_dim * partial_rotary_factor(config))  # NTK's d: the rotated channels (model/rope.py)
    hf_rope = method_spec(method).hf_rope
    assert hf_rope is not None  # rope_methods() has only methods with one
    edited = hf_rope(own_rope, resolved, head_dim)
    if edited["rope_type"] == "yarn" and config.model_type == "phi3":
        raise fail(
            method, "transformers' Phi-3 config reads rope_type 'yarn' as longrope: use ntk, or an attention method"
        )
    return edited


def apply(model, method: str, *, training_length: int | None = None, **params: Any):
    """Run `method` in `model` (a transformers model of methods.MODEL_TYPES); returns it.

    `params` are longctx's (`eval.position_method.<method>.*`: string shift, shift_ratio,
    local_window, compat; rerope window, log_scale_length; self_extend neighbor_window,
    group_size; dca chunk_size, local_window; ntk factor; yarn factor,
    original_max_position, beta_fast, beta_slow; rope repo_score_scale), the rest
    longctx's defaults against the training length L (max_position_embeddings, or
    `training_length`). The resolved parameters are stored in `model.config` (saved by
    `save_pretrained`). Attention methods switch the model's attention to
    longctx_<method>; ntk and yarn (the `rope`-kind methods whose spec has an `hf_rope`)
    replace the rope parameters (the model's own are kept in the config and restored by
    the next `apply`) and rebuild the rotary embedding, leaving the attention
    implementation as it is (a longctx_ one becomes sdpa)."""
    methods = attention_methods() + rope_methods()
    if method not in methods:
        raise HFAttentionError(f"unknown method {method!r}; longctx.hf_attention applies {methods}")
    config = model.config
    length = training_length_of(config, training_length)
    original = getattr(config, ORIGINAL_ROPE_KEY, None)
    own_rope = copy.deepcopy(original) if isinstance(original, dict) else copy.deepcopy(rope_parameters(config))
    probe = copy.copy(config)
    probe.rope_parameters = with_full_rope(config, own_rope)
    check_model(probe, method, length)
    resolved = resolve(method, params, length)
    settings = {"name": method, "training_length": length, "params": resolved}
    if method in attention_methods():
        _set_rope(model, own_rope)
        if hasattr(config, ORIGINAL_ROPE_KEY):
            delattr(config, ORIGINAL_ROPE_KEY)
        setattr(config, CONFIG_KEY, settings)
        method_for(config, method)  # builds and checks it now, not at the first forward
        model.set_attn_implementation(attention_name(method))
        if getattr(model, "generation_config", None) is not None:
            # generate compiles a StaticCache's decoding step on CUDA; the plans read sizes on the host
            model.generation_config.disable_compile = True
        return model
    edited = _rope_edit(config, method, own_rope, resolved)
    _set_rope(model, edited)
    setattr(config, ORIGINAL_ROPE_KEY, own_rope)
    setattr(config, CONFIG_KEY, settings)
    if str(getattr(config, "_attn_implementation", "")).startswith(PREFIX):
        model.set_attn_implementation("sdpa")
    return model
