"""Hugging Face `LlamaForCausalLM` interop: a directory with config.json + model.safetensors.

    longctx export-hf runs/tiny/last.ckpt hf/tiny     # then transformers/vLLM/lm-eval load hf/tiny
    export_hf(model, "hf/tiny");  model = import_hf("hf/tiny")

Our parameter names are short (`blocks.3.attn.wq`); this module owns the one mapping to
the HF names (`model.layers.3.self_attn.q_proj`). The channel layout is already HF's
rotate-half RoPE layout, so no weight is permuted.

RoPE scaling is written in the `rope_theta` + `rope_scaling` form that transformers 4.x,
5.x and vLLM all read. HF has no static NTK-aware type; NTK scaling *is* a larger base
(base * factor^(d/(d-2))), so it is exported as that `rope_theta`, exact for any reader.
The original settings are kept under `longctx_rope_scaling` so `import_hf` restores them.

`export-hf` also writes the run's tokenizer (tokenizer.json + tokenizer_config.json) and the
bos/eos/pad ids (config.json, generation_config.json), so `AutoTokenizer` loads the
directory and `generate()` stops at EOS. `import_hf` refuses configs our Llama cannot
represent (another activation, biases, tied embeddings, other RoPE types), naming the field.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from longctx.config.model import ModelConfig
from longctx.data.tokenizer import Tokenizer
from longctx.errors import CheckpointError
from longctx.model.llama import Llama
from longctx.model.rope import RopeScaling

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
GENERATION_CONFIG_FILE = "generation_config.json"

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn.wq.weight": "self_attn.q_proj.weight",
    "attn.wk.weight": "self_attn.k_proj.weight",
    "attn.wv.weight": "self_attn.v_proj.weight",
    "attn.wo.weight": "self_attn.o_proj.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "mlp.gate.weight": "mlp.gate_proj.weight",
    "mlp.up.weight": "mlp.up_proj.weight",
    "mlp.down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_name(name: str) -> str:
    """Our parameter name -> the HF LlamaForCausalLM name."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    _, layer, rest = name.split(".", 2)  # blocks.{i}.rest
    return f"model.layers.{layer}.{_LAYER_NAMES[rest]}"


def hf_config(config: ModelConfig) -> dict:
    scaling = config.rope_scaling
    rope_theta = config.rope_base
    original = scaling.original_max_position or config.max_position
    rope_scaling: dict | None
    if scaling.type == "none":
        rope_scaling = None
    elif scaling.type == "ntk":
        rope_theta = config.rope_base * scaling.factor ** (config.head_dim / (config.head_dim - 2))
        rope_scaling = None
    elif scaling.type == "linear":
        rope_scaling = {"rope_type": "linear", "factor": scaling.factor}
    elif scaling.type == "yarn":
        rope_scaling = {
            "rope_type": "yarn",
            "factor": scaling.factor,
            "original_max_position_embeddings": original,
            "beta_fast": scaling.beta_fast,
            "beta_slow": scaling.beta_slow,
        }
        if scaling.attention_factor > 0:
            rope_scaling["attention_factor"] = scaling.attention_factor
    elif scaling.type == "llama3":
        rope_scaling = {
            "rope_type": "llama3",
            "factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": original,
        }
    else:
        raise CheckpointError(f"cannot export rope scaling type {scaling.type!r}")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.d_ff,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_position,
        "rms_norm_eps": config.norm_eps,
        "rope_theta": rope_theta,
        "rope_scaling": rope_scaling,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": config.init_std,
        "torch_dtype": "float32",
        "longctx_preset": config.preset,
        "longctx_rope_base": config.rope_base,
        "longctx_rope_scaling": dataclasses.asdict(scaling),
    }


def export_hf(
    model: Llama, out_dir: str | Path, dtype: torch.dtype | None = None, tokenizer: Tokenizer | None = None
) -> Path:
    """Write `model` as an HF LlamaForCausalLM directory; returns the directory.

    With `tokenizer`, the directory is complete for `AutoTokenizer` + `AutoModelForCausalLM`
    + `generate()`: tokenizer.json and tokenizer_config.json, the bos/eos/pad ids in
    config.json and generation_config.json (without them transformers falls back to
    Llama's eos id 2, an ordinary token of our vocabularies, and generation never stops).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach().to("cpu", dtype=dtype or tensor.dtype).contiguous()
        tensors[hf_name(name)] = tensor
    config = hf_config(model.config)
    if dtype is not None:
        config["torch_dtype"] = str(dtype).removeprefix("torch.")
    if tokenizer is not None:
        if tokenizer.vocab_size > model.config.vocab_size:
            raise CheckpointError(
                f"tokenizer {tokenizer.name} has {tokenizer.vocab_size} tokens, the model's vocab_size is "
                f"{model.config.vocab_size}: not the tokenizer this model was trained with"
            )
        special_ids = {
            "bos_token_id": tokenizer.bos_id,
            "eos_token_id": tokenizer.eos_id,
            "pad_token_id": tokenizer.pad_id,
        }
        config.update(special_ids)
        _write_tokenizer(tokenizer, out, model.config.max_position)
        (out / GENERATION_CONFIG_FILE).write_text(json.dumps(special_ids, indent=2) + "\n")
    save_file(tensors, out / WEIGHTS_FILE, metadata={"format": "pt"})
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return out


def _write_tokenizer(tokenizer: Tokenizer, out: Path, max_position: int) -> None:
    """tokenizer.json (the HF `tokenizers` definition) and the tokenizer_config.json that
    `AutoTokenizer` reads: the special tokens by spelling, no BOS/EOS added on encode (as
    `Tokenizer.encode`), the model's context as `model_max_length`."""
    tokenizer.hf_tokenizer.save(str(out / TOKENIZER_FILE))
    spelled = {
        name: None if token_id is None else tokenizer.token(token_id)
        for name, token_id in (
            ("bos_token", tokenizer.bos_id),
            ("eos_token", tokenizer.eos_id),
            ("pad_token", tokenizer.pad_id),
        )
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **spelled,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": max_position,
        "clean_up_tokenization_spaces": False,
    }
    (out / TOKENIZER_CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")


UNSUPPORTED = {
    "tie_word_embeddings": "tied input and output embeddings",
    "attention_bias": "biases in the attention projections",
    "mlp_bias": "biases in the MLP projections",
}
"""config.json fields that must be false: our Llama has untied embeddings and no biases."""


def model_config_from_hf(hf: dict, source: str = CONFIG_FILE) -> ModelConfig:
    """Map an HF Llama config.json dict to a ModelConfig, refusing what the model cannot
    represent (the weights would load and the logits silently differ)."""
    if hf.get("model_type") != "llama":
        raise CheckpointError(f"{source}: model_type is {hf.get('model_type')!r}, expected 'llama'")
    for field, meaning in UNSUPPORTED.items():
        if hf.get(field):
            raise CheckpointError(
                f"{source}: {field}={json.dumps(hf[field])} is not supported (longctx models have no {meaning})"
            )
    activation = hf.get("hidden_act", "silu")
    if activation not in ("silu", "swish"):
        raise CheckpointError(
            f"{source}: hidden_act={activation!r} is not supported (longctx models use SwiGLU with silu)"
        )
    if hf.get("pretraining_tp", 1) != 1:
        raise CheckpointError(f"{source}: pretraining_tp={hf['pretraining_tp']} is not supported (only 1)")
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    if head_dim * hf["num_attention_heads"] != hf["hidden_size"]:
        raise CheckpointError(f"{source}: head_dim {head_dim} x heads != hidden_size {hf['hidden_size']}")
    if "longctx_rope_scaling" in hf:
        base = hf["longctx_rope_base"]
        scaling = RopeScaling(**hf["longctx_rope_scaling"])
    else:
        base = hf.get("rope_theta") or (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        field = "rope_scaling" if hf.get("rope_scaling") else "rope_parameters"
        scaling = _scaling_from_hf(hf.get(field), f"{source}: {field}")
    return ModelConfig(
        preset=hf.get("longctx_preset", "debug"),
        vocab_size=hf["vocab_size"],
        d_model=hf["hidden_size"],
        n_layers=hf["num_hidden_layers"],
        n_heads=hf["num_attention_heads"],
        n_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
        d_ff=hf["intermediate_size"],
        norm_eps=hf.get("rms_norm_eps", 1e-5),
        rope_base=float(base),
        rope_scaling=scaling,
        max_position=hf.get("max_position_embeddings", 2048),
        init_std=hf.get("initializer_range", 0.02),
    )


def _scaling_from_hf(rope: dict | None, where: str) -> RopeScaling:
    rope = rope or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return RopeScaling()
    for key in ("mscale", "mscale_all_dim"):  # DeepSeek's YaRN variant
        if rope.get(key):
            raise CheckpointError(f"{where}.{key}={rope[key]} is not supported (YaRN without mscale only)")
    original = rope.get("original_max_position_embeddings", 0)
    if kind == "linear":
        return RopeScaling("linear", factor=rope["factor"])
    if kind == "yarn":
        return RopeScaling(
            "yarn",
            factor=rope["factor"],
            original_max_position=original,
            beta_fast=rope.get("beta_fast") or 32.0,
            beta_slow=rope.get("beta_slow") or 1.0,
            attention_factor=rope.get("attention_factor") or 0.0,
        )
    if kind == "llama3":
        return RopeScaling(
            "llama3",
            factor=rope["factor"],
            original_max_position=original,
            low_freq_factor=rope["low_freq_factor"],
            high_freq_factor=rope["high_freq_factor"],
        )
    raise CheckpointError(f"{where}.rope_type={kind!r} is not supported (default, linear, yarn, llama3)")


def import_hf(directory: str | Path) -> Llama:
    """Load an HF LlamaForCausalLM directory (config.json + *.safetensors) into a Llama."""
    directory = Path(directory)
    config_path = directory / CONFIG_FILE
    if not config_path.exists():
        raise FileNotFoundError(f"{config_path} not found: not a Hugging Face model directory")
    config = model_config_from_hf(json.loads(config_path.read_text()), str(config_path))
    weight_files = sorted(directory.glob("*.safetensors"))
    if not weight_files:
        raise FileNotFoundError(f"no *.safetensors in {directory}")
    hf_tensors = {}
    for path in weight_files:
        hf_tensors.update(load_file(path))
    model = Llama(config)
    state = {}
    for name, ours in model.state_dict().items():
        key = hf_name(name)
        if key not in hf_tensors:
            raise CheckpointError(f"{directory}: tensor {key} (for {name}) is missing")
        if hf_tensors[key].shape != ours.shape:
            raise CheckpointError(
                f"{directory}: {key} has shape {tuple(hf_tensors[key].shape)}, expected {tuple(ours.shape)}"
            )
        state[name] = hf_tensors.pop(key)
    unused = [k for k in hf_tensors if not k.endswith("rotary_emb.inv_freq")]
    if unused:
        raise CheckpointError(f"{directory}: unexpected tensors {unused[:5]}{' ...' if len(unused) > 5 else ''}")
    model.load_state_dict(state)
    return model
