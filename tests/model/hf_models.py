"""Tiny random Llama / Qwen2 / Mistral models built and saved by transformers (test helper)."""

import json

import torch

SMALL = dict(
    vocab_size=384,
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rope_theta=20000.0,
    initializer_range=0.1,  # logits of several units: a wrong bias or head is far above 1e-4
)

VARIANTS = {
    "llama-tied": ("LlamaForCausalLM", dict(tie_word_embeddings=True, eos_token_id=[2, 3])),
    "llama-bias": ("LlamaForCausalLM", dict(attention_bias=True, tie_word_embeddings=False)),
    "qwen2-tied": ("Qwen2ForCausalLM", dict(tie_word_embeddings=True, use_sliding_window=False)),
    "qwen2": ("Qwen2ForCausalLM", dict(tie_word_embeddings=False)),
    "mistral": ("MistralForCausalLM", dict(sliding_window=None, tie_word_embeddings=False)),
}
LAYOUTS = ("single", "sharded", "bin", "bin-sharded")


def build_hf(kind: str, **overrides):
    """A random transformers model of VARIANTS[kind]; biases drawn too (transformers zeroes them)."""
    import transformers

    class_name, extra = VARIANTS[kind]
    model_class = getattr(transformers, class_name)
    config_class = getattr(transformers, class_name.replace("ForCausalLM", "Config"))
    torch.manual_seed(0)
    model = model_class(config_class(**{**SMALL, **extra, **overrides})).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(".bias"):
                parameter.normal_(std=0.5)
    return model


def save_hf(model, directory, layout: str) -> None:
    """As transformers writes it (safetensors, sharded with an index), or as transformers 4
    wrote .bin checkpoints (transformers 5 writes only safetensors): torch.save of the state
    dict without the tied lm_head, optionally in two shards with pytorch_model.bin.index.json."""
    if layout in ("single", "sharded"):
        model.save_pretrained(directory, max_shard_size="40KB" if layout == "sharded" else "50GB")
        return
    model.config.save_pretrained(directory)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight")
    if layout == "bin":
        torch.save(state, directory / "pytorch_model.bin")
        return
    names = list(state)
    shards = {"pytorch_model-00001-of-00002.bin": names[::2], "pytorch_model-00002-of-00002.bin": names[1::2]}
    for file, keys in shards.items():
        torch.save({k: state[k] for k in keys}, directory / file)
    weight_map = {k: file for file, keys in shards.items() for k in keys}
    (directory / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
