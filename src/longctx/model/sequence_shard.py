"""Attention over a row sharded along the sequence (context parallelism, docs/long_sequences.md).

Rank r of N holds T / N tokens of every [B, T] row, in the order a load balancer dealt
them (train/context_parallel.py): `query_index` [B, T/N] is the row index of each local
token. Each layer computes q, k, v for its local tokens only; attention needs every key
its queries may see, so k and v are all-gathered along the sequence with torch's
`flex_cp_allgather` (torch.distributed.tensor.experimental._context_parallel: an
all-gather whose backward is a reduce-scatter, so a rank's key/value gradients are the sum
over every rank's queries, exactly the unsharded gradient) and put back in row order
(`restore`: the gathered index of row position j). The mask is the unsharded one read at
the local queries' row indices q = query_index[b, i]:

    key j seen by query i  iff  doc[j] == doc[q]  and  j <= q  and (sliding, window W) q - j < W

(docs/design.md §3-§5), so causal, document and per-layer window masks, NoPE layers,
qk-norm, sinks and the attention temperature all work as on one process: every per-token
computation (projections, RoPE at the token's own position id, the MLP, the loss) is
local, and only attention mixes tokens. Backends: `sdpa` builds the dense [B, 1, T/N, T]
mask (the reference, CPU training); `flex` a BlockMask listing, per block of 128 local
queries with row indices in [first, last], the key blocks in [start(first), last],
start(q) the first key q sees (document start, or q - W + 1), which never decreases with
q (so a block is *full* iff its keys lie in [start(last), first]: model/attention.py's
rule with explicit query indices).

The private torch module is imported when a layer first gathers (it exists in torch 2.11
and 2.14; its absence is a clear error, not an import failure of the model).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from longctx.model.attention import FLEX_BLOCK, AttentionMask, first_seen_keys, flex_block_mask

SHARD_BACKENDS = ("sdpa", "flex")
"""Backends that take the explicit query index a shard needs."""


def all_gather_keys(k: torch.Tensor, v: torch.Tensor, group_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """k, v [B, T/N, Hkv, D] of every rank of the group, concatenated rank by rank along
    the sequence: torch's `flex_cp_allgather` (backward: reduce-scatter of the gradients)."""
    try:
        from torch.distributed.tensor.experimental._context_parallel import flex_cp_allgather
    except ImportError as error:  # a private module: say which torch lacks it
        raise RuntimeError(
            f"context parallelism needs torch's flex_cp_allgather (torch >= 2.11); torch {torch.__version__}: {error}"
        ) from None
    return flex_cp_allgather(k, v, 1, group_name)


@dataclass
class SequenceShard:
    """One rank's part of a context-parallel batch, built once per forward."""

    query_index: torch.Tensor
    """[B, T/N] int64: the row index of each local token."""
    document_ids: torch.Tensor
    """[B, T]: the whole row's document ids, in row order."""
    restore: torch.Tensor
    """[1 or B, T] int64: row position j is gathered position restore[b, j]."""
    group_name: str
    """The context-parallel process group (its c10d name)."""
    masks: dict[tuple[int, str], AttentionMask] = field(default_factory=dict)

    def gather(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every rank's k, v [B, T, Hkv, D] in row order."""
        k, v = all_gather_keys(k, v, self.group_name)
        if self.restore.shape[0] == 1:
            order = self.restore[0]
            return k.index_select(1, order), v.index_select(1, order)
        index = self.restore[:, :, None, None].expand(-1, -1, *k.shape[2:])
        return k.gather(1, index), v.gather(1, index)

    def mask(self, window: int, backend: str) -> AttentionMask:
        """The local queries' mask over the whole row (cached per window and backend)."""
        if backend not in SHARD_BACKENDS:
            raise ValueError(
                f"attention backend {backend!r} does not run on a sequence shard; use one of {SHARD_BACKENDS}"
            )
        if (window, backend) not in self.masks:
            build = _dense_shard_mask if backend == "sdpa" else _flex_shard_mask
            extra = build(self.query_index, self.document_ids, window)
            self.masks[window, backend] = AttentionMask(
                backend, self.document_ids, self.query_index.shape[1], window, extra
            )
        return self.masks[window, backend]


def _dense_shard_mask(query_index: torch.Tensor, document_ids: torch.Tensor, window: int) -> torch.Tensor:
    """Boolean [B, 1, T/N, T]: key j >= first_seen(q) and j <= q, q the query's row index."""
    keys = torch.arange(document_ids.shape[1], device=document_ids.device)
    first = first_seen_keys(document_ids, window).gather(1, query_index)
    allowed = (keys[None, None, :] >= first[..., None]) & (keys[None, None, :] <= query_index[..., None])
    return allowed[:, None]


def _flex_shard_mask(query_index: torch.Tensor, document_ids: torch.Tensor, window: int):
    """The BlockMask of the module docstring, O(T + (T/N / 128) x (T / 128)) memory."""
    batch, local = query_index.shape
    q_blocks = -(-local // FLEX_BLOCK)
    padded = F.pad(query_index, (0, q_blocks * FLEX_BLOCK - local), mode="replicate").view(batch, q_blocks, -1)
    first, last = padded.min(-1).values, padded.max(-1).values  # [B, Qb] row indices
    sizes = torch.clamp(local - torch.arange(q_blocks, device=first.device) * FLEX_BLOCK, max=FLEX_BLOCK)
    starts = first_seen_keys(document_ids, window)

    def sharded_mask(b, h, q_idx, kv_idx):
        query = query_index[b, q_idx]
        return (kv_idx >= starts[b, query]) & (kv_idx <= query)

    return flex_block_mask(first, last, sizes == FLEX_BLOCK, starts, local, sharded_mask)
