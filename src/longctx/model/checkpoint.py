"""Reading and writing model weights without unpickling arbitrary objects.

Two formats are read:

- `*.safetensors` written by `save_model`: the weights plus the ModelConfig as JSON in
  the file's metadata, so one file is a complete model.
- `*.ckpt` / `*.pt` (Lightning or plain torch): loaded with `torch.load(weights_only=True)`,
  which only rebuilds tensors and primitive containers. The weights are taken from
  `state_dict` (with a `model.` prefix stripped, as a LightningModule holding the model as
  `self.model` writes them) and the ModelConfig from `hyper_parameters["model"]`.

A HF directory (config.json + safetensors) is read by `longctx.model.hf.import_hf`;
`load_model` dispatches to it for directories.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from longctx.config.model import ModelConfig, config_dict
from longctx.errors import CheckpointError
from longctx.model.llama import Llama
from longctx.model.rope import RopeScaling

CONFIG_METADATA_KEY = "longctx_model_config"


def experiment_settings(path: str | Path) -> dict | None:
    """The whole experiment config (a plain dict) a training checkpoint was written with:
    `hyper_parameters["config"]` (`"experiment"` in checkpoints of earlier versions); None
    for files that hold no such record (safetensors, plain weights)."""
    if not str(path).endswith((".ckpt", ".pt")):
        return None
    checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    hyper_parameters = checkpoint.get("hyper_parameters") or {}
    settings = hyper_parameters.get("config", hyper_parameters.get("experiment"))
    return settings if isinstance(settings, dict) else None


def save_model(model: Llama, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().cpu().contiguous() for name, t in model.state_dict().items()}
    save_file(tensors, path, metadata={CONFIG_METADATA_KEY: json.dumps(config_dict(model.config))})
    return path


def model_config_from_dict(values: dict, source: str) -> ModelConfig:
    values = dict(values)
    scaling = values.pop("rope_scaling", {}) or {}
    try:
        return ModelConfig(**values, rope_scaling=RopeScaling(**scaling))
    except TypeError as error:
        raise CheckpointError(f"{source}: model config does not match ModelConfig: {error}") from None


def load_model(path: str | Path) -> Llama:
    """Load a model from a longctx .safetensors, a Lightning/torch checkpoint, or an HF directory."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    if path.is_dir():
        from longctx.model.hf import import_hf

        return import_hf(path)
    if path.suffix == ".safetensors":
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            if CONFIG_METADATA_KEY not in metadata:
                raise CheckpointError(
                    f"{path}: no '{CONFIG_METADATA_KEY}' metadata; was it written by longctx save_model?"
                )
            config = model_config_from_dict(json.loads(metadata[CONFIG_METADATA_KEY]), str(path))
            state = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118 (safe_open is not iterable)
    else:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
            raise CheckpointError(f"{path}: expected a dict with a 'state_dict' entry (a Lightning checkpoint)")
        model_values = (checkpoint.get("hyper_parameters") or {}).get("model")
        if not isinstance(model_values, dict):
            raise CheckpointError(f"{path}: hyper_parameters['model'] (the model config) is missing")
        config = model_config_from_dict(model_values, str(path))
        state = {name.removeprefix("model."): t for name, t in checkpoint["state_dict"].items()}
    model = Llama(config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: weights do not match the config (missing {missing[:5]}, unexpected {unexpected[:5]})"
        )
    return model
