"""How every evaluation runs a model: its device, its precision, its position method and
whether it fits, decided here once for the engine's cells (eval/cells.py), the
effective-length search and the in-training probe.

- device: `eval.device` (auto = cuda when available, else cpu; cuda:LOCAL_RANK on a
  torchrun rank);
- precision: bf16 autocast on CUDA (the flash kernels' dtype, half the KV cache), the fp32
  weights on CPU (the reference); the memory estimate counts the same bytes per value;
- position method: None for plain RoPE (the model's own path), else the configured method
  (StRing, a baseline, RoPE with the repo's score scale) on the model's device;
- attention temperature: `eval.attn_temperature` replaces the checkpoint's
  `model.attn_temperature` when its type is not `model` (`with_eval_temperature`, applied
  where evaluation loads a checkpoint);
- memory: before a cell's prompts, KV cache or activations exist, a cell that cannot fit
  is refused with its limit named (eval/memory_estimate.py's estimate against the device's free
  memory).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator

import torch
from torch.distributed.tensor import DTensor

from longctx.config.eval import EvalConfig
from longctx.config.position_methods import PositionMethodConfig
from longctx.errors import ConfigError
from longctx.eval.memory_estimate import (
    GIB,
    available_memory,
    check_evaluation_memory,
    estimate_evaluation_memory,
)
from longctx.model.layer_attention import check_method_on_layers
from longctx.model.llama import Llama
from longctx.model.position_methods import PositionMethod, build_position_method


def evaluation_device(name: str) -> torch.device:
    """`eval.device` resolved: auto = cuda when available, else cpu; a torchrun rank's cuda
    is cuda:LOCAL_RANK (one GPU per rank of a node)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and "LOCAL_RANK" in os.environ:
        name = f"cuda:{os.environ['LOCAL_RANK']}"
    return torch.device(name)


def with_eval_temperature(model: Llama, settings: EvalConfig) -> Llama:
    """`model` with `eval.attn_temperature` in place of its own when the setting's type is
    not `model` (the model reads its temperature at every forward; no weight changes)."""
    temperature = settings.attn_temperature
    if temperature.type != "model":
        model.config = dataclasses.replace(model.config, attn_temperature=dataclasses.replace(temperature))
    return model


def model_device(model: Llama) -> torch.device:
    return model.tok_embeddings.weight.device


def position_method(config: PositionMethodConfig, model: Llama) -> PositionMethod | None:
    """None for plain RoPE (the model's own path), else the method on the model's device;
    refused (naming `eval.position_method.name`) where the model has no layer it can act on."""
    if config.name == "rope" and not config.params_of("rope").repo_score_scale:
        return None
    method = build_position_method(config, model.config)
    try:
        check_method_on_layers(method, model.layer_specs, model.config)
    except ValueError as error:
        raise ConfigError("eval.position_method.name", str(error)) from None
    return method.to(model_device(model))


def compute_bytes(device: torch.device) -> int:
    """Bytes per activation value: bf16 under CUDA autocast, fp32 on CPU."""
    return 2 if device.type == "cuda" else 4


@contextlib.contextmanager
def evaluating(model: Llama) -> Iterator[None]:
    """The model in eval mode, without gradients, in the device's precision; its training
    mode is restored afterwards."""
    device = model_device(model)
    precision = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), precision:
            yield
    finally:
        model.train(was_training)


def check_memory(
    model: Llama,
    longest: int,
    *,
    rows: int,
    tests: int,
    new_tokens: int,
    prefill_chunk_tokens: int,
    limit_gib: float = 0.0,
) -> None:
    """Refuse, naming the limit, prompts of `longest` tokens decoded `rows` at a time that
    cannot fit the model's device (eval/memory_estimate.py); `limit_gib` (eval.memory_limit_gib,
    0: the device's free memory) bounds what the evaluation may use, the weights this rank
    holds (its shards, for a sharded model) included."""
    device = model_device(model)
    cuda = device.type == "cuda"
    estimate = estimate_evaluation_memory(
        model.config,
        longest,
        rows=rows,
        tests=tests,
        new_tokens=new_tokens,
        prefill_chunk_tokens=prefill_chunk_tokens,
        compute_bytes=compute_bytes(device),
        dense_attention=not cuda,
    )
    available, source = available_memory(device)
    if limit_gib > 0:
        held = sum(_local(p).numel() * p.element_size() for p in model.parameters())
        available, source = int(limit_gib * GIB) - held, "eval.memory_limit_gib less the weights this rank holds"
    check_evaluation_memory(estimate, available, source, length=longest)


def _local(parameter: torch.Tensor) -> torch.Tensor:
    """This rank's part of a parameter (a DTensor's shard; a plain tensor whole)."""
    return parameter.to_local() if isinstance(parameter, DTensor) else parameter
