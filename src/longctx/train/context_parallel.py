"""Context parallelism (CP): N ranks share each packed row, through torch's own CP API.

The world is a 2-D device mesh (data_parallel x context_parallel), D x N = world size,
ranks of one CP group adjacent (global rank = d x N + c). The D data-parallel groups read
different rows (data/packing.py with rank d of D); the N ranks of a group read the same
rows, and before each forward every [B, T] tensor of the batch contract (input ids,
labels, position and document ids) is dealt out along the sequence by torch's
`_context_parallel_shard` after a load balancer's rearrangement:

- `head_tail` (`_HeadTailLoadBalancer`): the row cut into 2N chunks, rank c taking chunk c
  and chunk 2N-1-c. Under a causal mask the work of query q grows with q, so each rank
  holds one cheap and one dear chunk; correct for any packing (the mask reads row indices,
  model/sequence_shard.py), balanced exactly for one document per row.
- `document` (`per_document_head_tail`): the same inside every document, so each rank's
  work is 1/N of every document's |doc|^2 / 2 whatever the documents. Every document's
  length must divide by 2N: `data.packing=documents` pads each (data/row_padding.py;
  unlabelled, outside f(i)). Ours, not torch's `_PerDocumentHeadTailLoadBalancer`: on
  torch 2.11 (the GPU image's) that class lays the chunks out document by document, so the
  contiguous N shards cut across documents instead of giving every rank a head and a tail
  of each (max/mean work 1.34 on documents of 200, 8 and 48 tokens at N = 4); torch 2.14
  lays them out rank by rank, as here.

The position ids travel with their tokens, so the position transforms (PoSE, RandPos,
LongRecipe, SkipAlign rows, DroPE) are the unsharded ones (`unshard` restores them).
FSDP2 shards parameters over the flattened D x N mesh (torchtitan's dp_shard_cp):
gradients are reduce-scattered over all ranks, a CP group's contributions summed. The
loss: each rank sums its local tokens' cross-entropy; train/module.py all-reduces the
labelled-token count over the world, so the step's gradient is that of
sum(CE) / (labelled tokens of the global batch), as on one process.

`work_per_rank` is the measured balance: the (query, key) pairs each rank's queries
attend, sum over its queries q of (q - first_seen(q) + 1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch
from lightning.pytorch.strategies import ModelParallelStrategy

from longctx.batch import document_start_index
from longctx.errors import ConfigError
from longctx.model.sequence_shard import SequenceShard

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

DATA_PARALLEL, CONTEXT_PARALLEL = "data_parallel", "context_parallel"
SHARDED_KEYS = ("input_ids", "labels", "position_ids", "document_ids")
"""The batch contract's [B, T] tensors, all dealt out along the sequence."""


def context_parallel_mesh(data_parallel: int, context_parallel: int, device_type: str) -> DeviceMesh:
    """The (data_parallel, context_parallel) mesh over the world's ranks."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(
        device_type, (data_parallel, context_parallel), mesh_dim_names=(DATA_PARALLEL, CONTEXT_PARALLEL)
    )


def fsdp_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The 1-D mesh FSDP2 shards over: data_parallel alone, or both dimensions flattened."""
    if CONTEXT_PARALLEL not in (mesh.mesh_dim_names or ()):
        return mesh[DATA_PARALLEL]
    return mesh[DATA_PARALLEL, CONTEXT_PARALLEL]._flatten("data_context_parallel")


class ContextParallelStrategy(ModelParallelStrategy):
    """Lightning's FSDP2 strategy on a (data_parallel, context_parallel) mesh; consolidated
    checkpoints (one file, resumable at any world and CP size)."""

    def __init__(self, data_parallel_size: int, context_parallel_size: int):
        super().__init__(
            data_parallel_size=data_parallel_size * context_parallel_size,
            tensor_parallel_size=1,
            save_distributed_checkpoint=False,
        )
        self.context_parallel_size = context_parallel_size

    def setup_environment(self) -> None:
        super().setup_environment()
        size = self.context_parallel_size
        self._device_mesh = context_parallel_mesh(self.world_size // size, size, self.root_device.type)
        assert self.lightning_module is not None
        self.lightning_module._device_mesh = self._device_mesh
        if self.global_rank == 0:
            print(f"device mesh: {describe_mesh(self._device_mesh)}", flush=True)


def describe_mesh(mesh: DeviceMesh) -> str:
    names = mesh.mesh_dim_names or ()
    shape = " x ".join(f"{name} {size}" for name, size in zip(names, mesh.shape, strict=True))
    return f"{shape} ({mesh.device_type}, ranks {mesh.mesh.flatten().tolist()})"


def balance_indices(document_ids: torch.Tensor, size: int, method: str) -> torch.Tensor:
    """[1 or B, T] int64: the rearrangement whose contiguous N chunks are the ranks' shards."""
    from torch.distributed.tensor.experimental._context_parallel import _HeadTailLoadBalancer

    length = document_ids.shape[1]
    if length % (2 * size):
        raise ConfigError("train.context_parallel", f"a row of {length} tokens is not a multiple of 2 x {size}")
    if method == "head_tail":
        return _HeadTailLoadBalancer(length, size, document_ids.device)._generate_indices().long()
    lengths = document_lengths(document_ids)
    odd = [n for row in lengths for n in row if n % (2 * size)]
    if odd:
        raise ConfigError(
            "train.load_balance",
            f"document needs every document a multiple of 2 x train.context_parallel = {2 * size} tokens; "
            f"found {odd[0]} (data.packing=documents pads them)",
        )
    return torch.stack([per_document_head_tail(row, size, document_ids.device) for row in lengths])


def per_document_head_tail(lengths: list[int], size: int, device: torch.device) -> torch.Tensor:
    """[T]: the rearrangement whose contiguous N chunks give rank c, of every document (cut
    into 2N equal chunks), its chunk c and chunk 2N-1-c, documents in row order."""
    heads = torch.arange(size, device=device)
    tails = 2 * size - 1 - heads
    ranks, start = [], 0
    for length in lengths:
        chunks = torch.arange(start, start + length, device=device).view(2 * size, length // (2 * size))
        ranks.append(torch.cat([chunks[heads], chunks[tails]], dim=1))  # [N, 2 x chunk]: rank c's pieces
        start += length
    return torch.cat(ranks, dim=1).reshape(-1)


def document_lengths(document_ids: torch.Tensor) -> list[list[int]]:
    """Per row, the lengths of its documents in order (documents are contiguous runs)."""
    rows = []
    for row in document_ids:
        _, counts = torch.unique_consecutive(row, return_counts=True)
        rows.append(counts.tolist())
    return rows


def shard_batch(
    batch: dict[str, torch.Tensor], mesh: DeviceMesh, method: str = "head_tail"
) -> tuple[dict[str, torch.Tensor], SequenceShard, torch.Tensor]:
    """This rank's part of `batch` along the sequence, the shard that attention gathers
    over and the work per rank (full attention); `mesh`: the 1-D context-parallel mesh."""
    from torch.distributed.tensor.experimental._context_parallel import _context_parallel_shard

    documents = batch["document_ids"]
    index = balance_indices(documents, mesh.size(), method)
    rows = torch.arange(documents.shape[1], device=documents.device).expand_as(documents)
    tensors = [batch[key] for key in SHARDED_KEYS] + [rows]
    local = cast(list[torch.Tensor], _context_parallel_shard(mesh, tensors, [1] * len(tensors), _rearranged(index)))
    shard = SequenceShard(local[-1], documents, torch.argsort(index, dim=1), mesh.get_group().group_name)
    work = work_per_rank(documents, index, mesh.size())
    return dict(zip(SHARDED_KEYS, local[:-1], strict=True)), shard, work


def _rearranged(index: torch.Tensor):
    """A torch `_LoadBalancer` whose indices are already made: the one rearrangement
    serves every tensor of the batch."""
    from torch.distributed.tensor.experimental._context_parallel import _LoadBalancer

    class Rearranged(_LoadBalancer):
        def _generate_indices(self, restore: bool = False) -> torch.Tensor:
            return torch.argsort(index, dim=1) if restore else index

    return Rearranged()


def unshard(local: torch.Tensor, shard: SequenceShard, mesh: DeviceMesh) -> torch.Tensor:
    """The whole [B, T] tensor in row order from every rank's [B, T/N] part (a collective)."""
    import torch.distributed as dist

    parts = [torch.empty_like(local) for _ in range(mesh.size())]
    dist.all_gather(parts, local.contiguous(), group=mesh.get_group())
    gathered = torch.cat(parts, dim=1)
    return gathered.gather(1, shard.restore.expand(gathered.shape[0], -1))


def work_per_rank(document_ids: torch.Tensor, index: torch.Tensor, size: int, window: int = 0) -> torch.Tensor:
    """[N] float64: the attended (query, key) pairs of each rank's queries under `index`."""
    starts = document_start_index(document_ids)
    positions = torch.arange(document_ids.shape[1], device=document_ids.device)
    if window:
        starts = torch.maximum(starts, positions - window + 1)
    work = (positions - starts + 1).double().gather(1, index.expand(document_ids.shape[0], -1))
    return work.view(work.shape[0], size, -1).sum(dim=(0, 2))


def imbalance(work: torch.Tensor) -> torch.Tensor:
    """max / mean of the ranks' work: 1 = perfectly balanced."""
    return work.max() / work.mean().clamp(min=1)
