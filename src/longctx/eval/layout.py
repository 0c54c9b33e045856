"""Where an evaluation's models live: whole on every rank, or sharded over a node's ranks.

    layout = choose_layout(model.config, ranks, device, length=131072, rows=1, tests=500, ...)
    ranks = place_models(models, layout, ranks, device)   # moved, or sharded with FSDP2

The rule, decided once before any cell from the memory estimate (eval/memory_estimate.py)
of the grid's longest cell, held against what one rank's device may use
(`eval.memory_limit_gib`, else the device's free memory: CUDA's mem_get_info, MemAvailable
on CPU):

- the whole estimate fits: every rank holds the whole model (data parallel; eval/ranks.py
  deals the grid to the ranks);
- else, under torchrun with L ranks per node, the estimate with the weights (and their
  bf16 casts) divided by L fits: each node's ranks shard the weights with FSDP2
  (`fully_shard` per block, then the root, as training does). The KV cache, the prompts and
  the prefill's activations stay whole on every rank: each rank runs the whole batch, and
  every forward gathers one block's weights at a time (a collective over the node's ranks,
  which therefore decode the same batches as one worker). The grid is dealt to the nodes;
- else the evaluation is refused, naming both estimates and the limit.

Sharding changes nothing but where the weights are: the gathered block is the same tensor,
so logits equal an unsharded forward (tested on CPU with 2 gloo ranks, to 1e-6).
CUDA graphs stay off for a sharded model: a recorded step cannot replay the gathers.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from longctx.config.model import ModelConfig
from longctx.eval.memory_estimate import (
    GIB,
    EvaluationMemoryError,
    MemoryEstimate,
    available_memory,
    estimate_evaluation_memory,
)
from longctx.eval.model_setup import compute_bytes
from longctx.eval.ranks import Ranks
from longctx.model.llama import Llama


@dataclass(frozen=True)
class Layout:
    """The chosen layout: `shard` ranks per model (1: whole on every rank) and why."""

    shard: int
    estimate: MemoryEstimate
    """Per rank, under this layout."""
    limit: int
    source: str

    def describe(self) -> str:
        where = "whole on every rank" if self.shard == 1 else f"sharded with FSDP2 over {self.shard} ranks of each node"
        kept = "" if self.shard == 1 else " (weights sharded; KV cache, prompts and prefill activations whole)"
        return (
            f"models {where}: estimated {self.estimate.describe()} per rank{kept}, "
            f"limit {self.limit / GIB:.2f} GiB ({self.source})"
        )


def device_limit(device: torch.device, limit_gib: float) -> tuple[int, str]:
    """(bytes one rank may use, where the number comes from): eval.memory_limit_gib when set."""
    if limit_gib > 0:
        return int(limit_gib * GIB), "eval.memory_limit_gib"
    return available_memory(device)


def sharded(estimate: MemoryEstimate, shard: int) -> MemoryEstimate:
    """The estimate of one of `shard` ranks holding a shard of the weights (module docstring)."""
    return dataclasses.replace(
        estimate,
        weights=math.ceil(estimate.weights / shard),
        weight_casts=math.ceil(estimate.weight_casts / shard),
    )


def choose_layout(
    config: ModelConfig,
    ranks: Ranks,
    device: torch.device,
    *,
    length: int,
    rows: int,
    tests: int,
    new_tokens: int,
    prefill_chunk_tokens: int,
    limit_gib: float = 0.0,
) -> Layout:
    """The module's rule for the largest model's `config` at the grid's longest `length`."""
    whole = estimate_evaluation_memory(
        config,
        length,
        rows=rows,
        tests=tests,
        new_tokens=new_tokens,
        prefill_chunk_tokens=prefill_chunk_tokens,
        compute_bytes=compute_bytes(device),
        dense_attention=device.type != "cuda",
    )
    limit, source = device_limit(device, limit_gib)
    if whole.total <= limit:
        return Layout(1, whole, limit, source)
    shard = ranks.local_world
    split = sharded(whole, shard)
    if shard > 1 and ranks.world % shard == 0 and split.total <= limit:
        return Layout(shard, split, limit, source)
    why = (
        f"sharded over the node's {shard} ranks it still needs {split.describe()}"
        if shard > 1
        else "one rank per node cannot shard it: run under torchrun with several ranks per node (--nproc-per-node)"
    )
    raise EvaluationMemoryError(
        f"length {length:,} needs an estimated {whole.describe()} per rank, more than the {limit / GIB:.2f} GiB "
        f"available ({source}) on one device; {why}. Evaluate shorter lengths, fewer rows per forward "
        "(eval.niah.batch_tokens), smaller prefill chunks (eval.niah.prefill_chunk_tokens), or use more or "
        "larger devices per node"
    )


def place_models(models: dict[str, Llama], layout: Layout, ranks: Ranks, device: torch.device) -> Ranks:
    """Each model on `device` whole, or sharded over its node's ranks (the layout); returns
    the ranks the grid is dealt to (with shard > 1: a worker per node, its process group)."""
    if layout.shard == 1:
        for model in models.values():
            model.to(device)
        return ranks
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (ranks.world // layout.shard, layout.shard), mesh_dim_names=("node", "shard"))
    for model in models.values():
        for block in model.blocks:
            fully_shard(block, mesh=mesh["shard"])
        fully_shard(model, mesh=mesh["shard"])
    return dataclasses.replace(ranks, shard=layout.shard, replica_group=mesh.get_group("shard"))
