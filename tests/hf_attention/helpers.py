"""Shared by the longctx.hf_attention tests: tiny random transformers models of each
family and rope type, the methods' small parameters, and longctx's own model on the same
weights (import_hf) as the reference."""

import torch

from longctx.config.position_methods import PositionMethodConfig
from longctx.model.hf import import_hf
from longctx.model.position_methods import build_position_method
from tests.model.hf_models import build_hf

FAMILIES = ("llama-bias", "llama-tied", "mistral", "qwen2", "qwen2-tied")
"""tests/model/hf_models.VARIANTS: GQA 4/2 heads everywhere, q/k/v(/o) biases (llama-bias,
qwen2), tied embeddings (llama-tied, qwen2-tied); max_position_embeddings L = 256."""
ROPES = {
    "default": None,
    "linear": {"rope_type": "linear", "rope_theta": 20000.0, "factor": 2.0},
    "llama3": {
        "rope_type": "llama3",
        "rope_theta": 20000.0,
        "factor": 4.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
    "yarn": {"rope_type": "yarn", "rope_theta": 20000.0, "factor": 4.0, "original_max_position_embeddings": 64},
}
PARAMS = {
    "rope": {},
    "rope-repo": {"repo_score_scale": True},
    "string": {"shift": 30, "local_window": 5},
    "string-repo": {"shift": 30, "local_window": 5, "compat": "repo"},
    "rerope": {"window": 20},
    "self_extend": {"neighbor_window": 16, "group_size": 4},
    "dca": {"chunk_size": 40, "local_window": 8},
    "ntk": {},
    "yarn": {},
}
"""Parameters small enough that sequences of ~100 tokens reach every pass; ntk and yarn
take STRING §4.2's protocol against L = 256; rope-repo: RoPE with StRing-repo's temperature."""
ATTENTION_ARMS = ("rope", "string", "string-repo", "rerope", "self_extend", "dca")
TOKENS = 100


def method_of(arm: str) -> str:
    return arm.removesuffix("-repo")


def build(family: str = "llama-tied", rope: str = "default", dtype=torch.float64, **overrides):
    extra = {} if ROPES[rope] is None else {"rope_parameters": dict(ROPES[rope])}
    model = build_hf(family, pad_token_id=0, **extra, **overrides).to(dtype)
    model.generation_config.pad_token_id = 0
    return model


def tokens(batch: int = 2, length: int = TOKENS, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(1, 384, (batch, length), generator=generator)


def own_method(model, arm: str):
    """longctx's PositionMethod of `arm` for longctx's model `model`."""
    method = method_of(arm)
    config = PositionMethodConfig(name=method)
    for key, value in PARAMS[arm].items():
        setattr(getattr(config, method), key, value)
    return build_position_method(config, model.config)


def own_model(hf_model, directory):
    """longctx's model on `hf_model`'s weights (saved, then import_hf), float64."""
    hf_model.save_pretrained(directory)
    return import_hf(directory, dtype=torch.float64)
