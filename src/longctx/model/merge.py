"""Weight-space model merging (LongRecipe §4.3, Eq. 7): theta_merge = sum_i lambda_i theta_i.

    longctx merge runs/base/checkpoints/last.ckpt runs/replay/checkpoints/last.ckpt \\
        --weights 0.5 0.5 --out runs/merged/model.safetensors
    longctx niah runs/merged/model.safetensors            # evaluate it like any checkpoint

LongRecipe keeps the general abilities of the original short-window model Theta^(o) by
averaging it with the model trained at the longer window with pretraining-data replay,
Theta^(replay): lambda_1 = lambda_2 = 0.5 (their §5.3). Any number of checkpoints may be
merged; the weights must sum to 1 (a convex combination: the merged weights stay on the
scale the norms and the output head were trained at).

The models must have the same architecture, i.e. equal shape-defining config fields
(vocab_size, d_model, n_layers, n_heads, n_kv_heads, d_ff) and identical parameter names
and shapes; every violation is an error naming the field or tensor and the checkpoints.
Fields that do not change shapes may differ — the original and the extended model
usually differ in max_position and RoPE (rope_base, rope_scaling) — and the merged model
takes its config from one of them (`config_from`, default the last, the long-context
model in Eq. 7's order); the differing fields are reported. Sums are taken in float64 and
cast back to the parameters' dtype.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import torch

from longctx.config.model import SHAPE_FIELDS, config_dict
from longctx.errors import CheckpointError
from longctx.model.checkpoint import load_model, save_model
from longctx.model.llama import Llama

WEIGHT_SUM_TOLERANCE = 1e-6


@dataclasses.dataclass
class MergeResult:
    model: Llama
    config_source: str
    """The checkpoint whose config the merged model carries."""
    differing_fields: dict[str, list]
    """Config fields (outside SHAPE_FIELDS) whose values differ between the models: field -> value per model."""


def merge_models(models: dict[str, Llama], weights: list[float], config_from: int = -1) -> MergeResult:
    """Weighted sum of `models` ({source name: model}, in order) with `weights` (one each, summing to 1)."""
    names = list(models)
    _check_weights(names, weights)
    if not -len(names) <= config_from < len(names):
        raise CheckpointError(f"config_from={config_from} is not an index into the {len(names)} checkpoints")
    configs = [config_dict(model.config) for model in models.values()]
    for field in SHAPE_FIELDS:
        values = [getattr(model.config, field) for model in models.values()]  # head_size: a property
        if len(set(values)) > 1:
            listed = ", ".join(f"{value} ({name})" for name, value in zip(names, values, strict=True))
            raise CheckpointError(f"cannot merge models of different shape: {field} is {listed}")
    states = [model.state_dict() for model in models.values()]
    reference = states[0]
    for name, state in zip(names[1:], states[1:], strict=True):
        if state.keys() != reference.keys():
            different = sorted(state.keys() ^ reference.keys())[:5]
            raise CheckpointError(f"{name} and {names[0]} hold different parameters: {different}")
        for key, tensor in state.items():
            if tensor.shape != reference[key].shape:
                raise CheckpointError(
                    f"{key} has shape {tuple(tensor.shape)} in {name} but {tuple(reference[key].shape)} in {names[0]}"
                )
    differing = {
        field: [config[field] for config in configs]
        for field in configs[0]
        if field not in SHAPE_FIELDS and any(config[field] != configs[0][field] for config in configs)
    }
    source = names[config_from]
    merged = Llama(models[source].config)
    with torch.no_grad():
        for key, target in merged.state_dict().items():
            total = sum(weight * state[key].double() for weight, state in zip(weights, states, strict=True))
            target.copy_(total.to(target.dtype))
    return MergeResult(merged, source, differing)


def merge_checkpoints(
    paths: list[str | Path], weights: list[float] | None = None, config_from: int = -1
) -> MergeResult:
    """Load each checkpoint (`load_model`: .safetensors, Lightning .ckpt, HF directory) and
    merge them; weights default to the plain average."""
    if len(paths) < 2:
        raise CheckpointError(f"merging needs at least two checkpoints, got {len(paths)}")
    weights = [1 / len(paths)] * len(paths) if weights is None else list(weights)
    return merge_models({str(path): load_model(path) for path in paths}, weights, config_from)


def save_merged(result: MergeResult, out: str | Path) -> Path:
    return save_model(result.model, out)


def _check_weights(names: list[str], weights: list[float]) -> None:
    if len(names) < 2:
        raise CheckpointError(f"merging needs at least two models, got {len(names)}")
    if len(weights) != len(names):
        raise CheckpointError(f"{len(weights)} weights for {len(names)} checkpoints; give one weight per checkpoint")
    if not all(math.isfinite(weight) for weight in weights):
        raise CheckpointError(f"weights must be finite, got {weights}")
    total = sum(weights)
    if abs(total - 1) > WEIGHT_SUM_TOLERANCE:
        raise CheckpointError(f"weights {weights} sum to {total:g}, not 1 (Eq. 7 averages: --weights 0.5 0.5)")
