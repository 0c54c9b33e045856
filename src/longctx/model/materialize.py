"""Building a model from stored tensors without holding it twice.

    model = meta_model(config)                      # shapes only, no memory
    materialize(model, read, torch.bfloat16, "cuda")  # allocate once, copy tensor by tensor

Used by every loader (model/checkpoint.py for longctx files, model/hf.py for HF
directories): the model is allocated once in the target dtype and device and each
parameter filled from `read(name)`, so the peak is the model in that dtype plus one stored
tensor, not an fp32 model plus a second copy of every tensor. `weights(model)` is the
state dict with a tied head named once (the embedding).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from longctx.config.model import ModelConfig
from longctx.model.llama import Llama
from longctx.model.rope import RotaryEmbedding


def weights(model: Llama) -> dict[str, torch.Tensor]:
    """The model's state dict with each tensor once: a tied head is the embedding, so
    `output.weight` is left out (safetensors refuses two names for one storage)."""
    state = model.state_dict()
    if model.config.tie_embeddings:
        state.pop("output.weight")
    return state


def meta_model(config: ModelConfig) -> Llama:
    """A Llama of `config` whose tensors are on the meta device (shapes only, no memory)."""
    with torch.device("meta"):
        return Llama(config)


def materialize(
    model: Llama, read: Callable[[str], torch.Tensor], dtype: torch.dtype, device: torch.device | str
) -> Llama:
    """Allocate the meta `model` in `dtype` on `device` and copy each tensor of
    `weights(model)` from `read(name)` (converted on the copy), one at a time."""
    config = model.config
    model.to(dtype=dtype).to_empty(device=device)
    if config.tie_embeddings:
        model.output.weight = model.tok_embeddings.weight
    for module in model.modules():
        if isinstance(module, RotaryEmbedding):  # buffers are not in the files: computed here
            module.reset_frequencies(device)
    parameters = dict(model.named_parameters())
    with torch.no_grad():
        for name in weights(model):
            parameters[name].copy_(read(name))
    return model
