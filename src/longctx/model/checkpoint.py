"""Reading and writing model weights without unpickling arbitrary objects.

Two formats are read:

- `*.safetensors` written by `save_model`: the weights plus the ModelConfig as JSON in
  the file's metadata, so one file is a complete model.
- `*.ckpt` / `*.pt` (Lightning or plain torch): loaded with `torch.load(weights_only=True)`,
  which only rebuilds tensors and primitive containers. The weights are taken from
  `state_dict` (with a `model.` prefix stripped, as a LightningModule holding the model as
  `self.model` writes them) and the ModelConfig from `hyper_parameters["model"]`.

A HF directory (config.json + weights) is read by `longctx.model.hf.import_hf`;
`load_model` dispatches to it for directories.

Every format is loaded the same way (model/materialize.py): the model is built on the meta
device, allocated once in the requested dtype and device, and filled one tensor at a
time, so loading a bf16 model for evaluation never holds an fp32 copy. A file that
cannot be read (truncated, corrupted, not a checkpoint) is an error naming it, raised
before the model is allocated.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

from longctx.config.model import ModelConfig, config_dict
from longctx.errors import CheckpointError
from longctx.model.llama import Llama
from longctx.model.materialize import materialize, meta_model, weights
from longctx.model.rope import RopeScaling
from longctx.model.weight_files import SafetensorsFile, load_torch_file

CONFIG_METADATA_KEY = "longctx_model_config"


def experiment_settings(path: str | Path) -> dict | None:
    """The whole experiment config (a plain dict) a training checkpoint was written with:
    `hyper_parameters["config"]` (`"experiment"` in checkpoints of earlier versions); None
    for files that hold no such record (safetensors, plain weights)."""
    if not str(path).endswith((".ckpt", ".pt")):
        return None
    checkpoint = load_torch_file(Path(path))
    hyper_parameters = checkpoint.get("hyper_parameters") or {}
    settings = hyper_parameters.get("config", hyper_parameters.get("experiment"))
    return settings if isinstance(settings, dict) else None


def save_model(model: Llama, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().cpu().contiguous() for name, t in weights(model).items()}
    save_file(tensors, path, metadata={CONFIG_METADATA_KEY: json.dumps(config_dict(model.config))})
    return path


def model_config_from_dict(values: dict, source: str) -> ModelConfig:
    values = dict(values)
    scaling = values.pop("rope_scaling", {}) or {}
    try:
        return ModelConfig(**values, rope_scaling=RopeScaling(**scaling))
    except TypeError as error:
        raise CheckpointError(f"{source}: model config does not match ModelConfig: {error}") from None


def load_model(path: str | Path, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> Llama:
    """Load a model from a longctx .safetensors, a Lightning/torch checkpoint, or an HF
    directory, with parameters of `dtype` on `device`."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    if path.is_dir():
        from longctx.model.hf import import_hf

        return import_hf(path, dtype=dtype, device=device)
    if path.suffix == ".safetensors":
        file = SafetensorsFile(path)
        if CONFIG_METADATA_KEY not in file.metadata:
            raise CheckpointError(f"{path}: no '{CONFIG_METADATA_KEY}' metadata; was it written by longctx save_model?")
        config = model_config_from_dict(json.loads(file.metadata[CONFIG_METADATA_KEY]), str(path))
        shapes = {name: file.shape(name) for name in file.entries}
        read: Callable[[str], torch.Tensor] = file.read
    else:
        checkpoint = load_torch_file(path)
        if "state_dict" not in checkpoint:
            raise CheckpointError(f"{path}: expected a dict with a 'state_dict' entry (a Lightning checkpoint)")
        model_values = (checkpoint.get("hyper_parameters") or {}).get("model")
        if not isinstance(model_values, dict):
            raise CheckpointError(f"{path}: hyper_parameters['model'] (the model config) is missing")
        config = model_config_from_dict(model_values, str(path))
        state = {name.removeprefix("model."): t for name, t in checkpoint["state_dict"].items()}
        shapes = {name: tuple(t.shape) for name, t in state.items()}
        read = state.__getitem__
    model = meta_model(config)
    expected = {name: tuple(t.shape) for name, t in weights(model).items()}
    if config.tie_embeddings:
        shapes.pop("output.weight", None)  # a tied model's state dict names the embedding twice
    if shapes != expected:
        missing = [n for n in expected if n not in shapes]
        unexpected = [n for n in shapes if n not in expected]
        wrong = [f"{n} {shapes[n]} vs {expected[n]}" for n in expected if n in shapes and shapes[n] != expected[n]]
        raise CheckpointError(
            f"{path}: weights do not match the config (missing {missing[:5]}, unexpected {unexpected[:5]}, "
            f"shapes {wrong[:5]})"
        )
    return materialize(model, read, dtype, device)
