"""Run under torchrun (gloo, CPU): one training micro-step under context parallelism
against one process on the same rows, in float64.

    python -m torch.distributed.run --nproc-per-node=4 --standalone tests/train/cp_equivalence.py 2 OUT.json

argv: the CP size N (the data-parallel size is world / N), the JSON file rank 0 writes,
optionally the load balancer (head_tail | document). The model mixes the designs CP must
carry: sliding and full layers (window 12 over rows of 64 with documents longer than it),
a NoPE layer, GQA, qk-norm. Each data-parallel rank d trains row d of the global batch;
its CP group shards it (train/context_parallel.py), every layer gathers keys/values, the
loss is normalised as train/module.py does (local sum / local capacity, FSDP2's mean over
the world, then rescaled by the all-reduced capacity / labelled); activation checkpointing
on, so the backward's recomputation gathers again. The reference: one
unsharded model, sum(CE) / labelled over all rows, backward. Written: the largest
differences of the loss, of every parameter gradient (full tensors) and of the position
ids after the round trip through the shards, and the work per rank."""

import copy
import json
import sys

import numpy as np
import torch
import torch.distributed as dist

from longctx.batch import IGNORE_INDEX
from longctx.config import load
from longctx.data.positions import INSTRUCTION, RESPONSE, skipalign_position_ids
from longctx.data.transforms import PositionTransform
from longctx.model.llama import Llama
from longctx.train.context_parallel import (
    context_parallel_mesh,
    fsdp_mesh,
    shard_batch,
    unshard,
)
from longctx.train.module import rescale_gradients, shard_model

WINDOW = 64
MODEL = [
    "model.vocab_size=97",
    "model.d_model=32",
    "model.n_heads=4",
    "model.n_kv_heads=2",
    "model.d_ff=64",
    "model.n_layers=3",
    "model.max_position=64",
    "model.layer_types=[sliding,full,full]",
    "model.sliding_window=12",
    "model.nope_layers=[2]",
    "model.qk_norm=head",
    "model.attention_backend=sdpa",
    "data.window=64",
    "train.global_batch_tokens=64",
    "train.micro_batch_size=1",
]


def rows(count: int, size: int, balance: str) -> dict[str, torch.Tensor]:
    """`count` packed rows: documents of uneven lengths (multiples of 2N for `document`),
    position ids reset per document then shifted (as a transform would), labels with gaps."""
    generator = torch.Generator().manual_seed(7)
    step = 2 * size if balance == "document" else 1
    documents, positions = [], []
    for _ in range(count):
        lengths, left = [], WINDOW
        while left:
            length = min(left, step * int(torch.randint(1, 40 // step + 1, (1,), generator=generator)))
            lengths.append(length)
            left -= length
        documents.append(torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)]))
        positions.append(torch.cat([torch.arange(n) * 2 + 3 for n in lengths]))
    input_ids = torch.randint(0, 97, (count, WINDOW), generator=generator)
    labels = torch.randint(0, 97, (count, WINDOW), generator=generator)
    labels[torch.rand(count, WINDOW, generator=generator) < 0.2] = IGNORE_INDEX
    return {
        "input_ids": input_ids,
        "labels": labels,
        "position_ids": torch.stack(positions),
        "document_ids": torch.stack(documents),
    }


def summed_loss(model: Llama, batch: dict[str, torch.Tensor], **kwargs) -> torch.Tensor:
    ids = (batch["input_ids"], batch["position_ids"], batch["document_ids"])
    return model(*ids, labels=batch["labels"], loss_chunk_tokens=16, **kwargs)


def flex_forward_difference(reference: Llama, mine, local, shard, mesh) -> float:
    """The largest difference, over the CP group, of this rank's logits through compiled
    FlexAttention with the shard's BlockMask (keys all-gathered) from one process's sdpa
    logits at the same row positions: float32 (CPU flex takes no float64), no grad (CPU
    flex has no backward), a plain copy of the reference weights on every rank."""
    model = copy.deepcopy(reference).float()
    with torch.no_grad():
        ids = (mine["input_ids"], mine["position_ids"], mine["document_ids"])
        expected = model(*ids).gather(1, shard.query_index[..., None].expand(-1, -1, 97))
        local_ids = (local["input_ids"], local["position_ids"], local["document_ids"])
        got = model(*local_ids, sequence_shard=shard, attention_backend="flex")
    difference = torch.tensor([float((got - expected).abs().max())])
    dist.all_reduce(difference, op=dist.ReduceOp.MAX, group=mesh.get_group("context_parallel"))
    return float(difference)


def transformed_rows(row: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The row's position ids under each position transform (PoSE, RandPos, LongRecipe:
    data/transforms.py, to a 4x target; SkipAlign's skipped ids, data/positions.py), [1, T]
    each; DroPE rows keep their ids (its layers are NoPE)."""
    ends_sentence = np.arange(97) % 7 == 0
    rows = {}
    for method in ("pose", "randpos", "longrecipe"):
        transform = PositionTransform(method, 4 * WINDOW, seed=3, ends_sentence=ends_sentence)
        rows[method] = transform.apply({key: value[0] for key, value in row.items()}, 5)["position_ids"][None]
    skipped = skipalign_position_ids(
        [16, 16, 32], [INSTRUCTION, RESPONSE, INSTRUCTION], 4 * WINDOW, "all", 0.5, np.random.default_rng(0)
    )
    rows["skipalign"] = torch.as_tensor(skipped)[None]
    return rows


def transforms_round_trip(row: dict[str, torch.Tensor], mesh, balance: str) -> dict[str, bool]:
    """Each transform's position ids, sharded with the row and gathered back: equal?"""
    equal = {}
    for method, positions in transformed_rows(row).items():
        local, shard, _ = shard_batch({**row, "position_ids": positions}, mesh, balance)
        equal[method] = bool(torch.equal(unshard(local["position_ids"], shard, mesh), positions))
    return equal


def main(argv: list[str]) -> None:
    dist.init_process_group("gloo")
    torch.set_default_dtype(torch.float64)
    size, out = int(argv[0]), argv[1]
    balance = argv[2] if len(argv) > 2 else "head_tail"
    data_parallel = dist.get_world_size() // size
    config = load([], MODEL)
    torch.manual_seed(0)
    reference = Llama(config.model)
    sharded = Llama(config.model)
    sharded.load_state_dict(reference.state_dict())
    batch = rows(data_parallel, size, balance)

    loss_sum = summed_loss(reference, batch)
    labelled = (batch["labels"] != IGNORE_INDEX).sum()
    (loss_sum / labelled).backward()

    mesh = context_parallel_mesh(data_parallel, size, "cpu")
    sharded.activation_checkpointing = True  # the backward recomputes each block, its all-gather too
    shard_model(sharded, fsdp_mesh(mesh), "32-true")
    row = mesh.get_local_rank("data_parallel")
    mine = {key: value[row : row + 1] for key, value in batch.items()}
    local, shard, work = shard_batch(mine, mesh["context_parallel"], balance)
    local_sum = summed_loss(sharded, local, sequence_shard=shard, attention_backend="sdpa")
    capacity = local["labels"].numel()
    (local_sum / capacity).backward()
    totals = torch.stack(
        [local_sum.detach(), (local["labels"] != IGNORE_INDEX).sum().double(), torch.tensor(float(capacity))]
    )
    dist.all_reduce(totals)
    rescale_gradients(list(sharded.parameters()), totals[2], totals[1])

    gradients = {}
    for (name, expected), parameter in zip(reference.named_parameters(), sharded.parameters(), strict=True):
        got = parameter.grad.full_tensor()  # a collective: every rank takes part
        gradients[name] = float((got - expected.grad).abs().max())
    positions = unshard(local["position_ids"], shard, mesh["context_parallel"])
    transforms = transforms_round_trip(mine, mesh["context_parallel"], balance)
    flex = flex_forward_difference(reference, mine, local, shard, mesh) if "flex" in argv[3:] else None
    if dist.get_rank() == 0:
        result = {
            "loss": float(totals[0] / totals[1]),
            "reference_loss": float(loss_sum / labelled),
            "gradients": gradients,
            "largest_gradient": max(float(p.grad.abs().max()) for p in reference.parameters()),
            "positions_equal": bool(torch.equal(positions, mine["position_ids"])),
            "transforms_equal": transforms,
            "work_per_rank": work.tolist(),
            "flex_forward": flex,
        }
        with open(out, "w") as file:
            json.dump(result, file, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
