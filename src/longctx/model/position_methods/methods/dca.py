"""Dual Chunk Attention: intra, successive and inter-chunk passes (An et al., 2024)."""

from __future__ import annotations

import torch

from longctx.model.position_methods.method import PositionMethod
from longctx.model.position_methods.plan import UNBOUNDED, AttentionPass
from longctx.model.position_methods.registry import register_builder
from longctx.model.rope import RotaryEmbedding


@register_builder("dca")
def dca_method(rotary: RotaryEmbedding, chunk_size: int, local_window: int) -> PositionMethod:
    """Dual Chunk Attention with chunk size s and local window w (c = s + w)."""
    if chunk_size <= 0 or not 0 < local_window <= chunk_size:
        raise ValueError(
            f"DCA needs chunk_size > 0 and 0 < local_window <= chunk_size, got {chunk_size}, {local_window}"
        )
    s, last = chunk_size, chunk_size + local_window - 1

    def in_chunk(p: torch.Tensor) -> torch.Tensor:
        return torch.remainder(p, s)

    def intra(p):
        return torch.zeros_like(p), in_chunk(p)

    def successive(p):
        return in_chunk(p) + 1, in_chunk(p) + s

    def inter(p):
        return in_chunk(p) + s + 1, torch.full_like(p, UNBOUNDED)

    passes = [
        AttentionPass("intra", intra, in_chunk, in_chunk, chunk=(s, 0)),
        AttentionPass("successive", successive, lambda p: (in_chunk(p) + s).clamp(max=last), in_chunk, chunk=(s, 1)),
        AttentionPass("inter", inter, lambda p: torch.full_like(p, last), in_chunk, chunk=(s, 2)),
    ]
    params = {"chunk_size": chunk_size, "local_window": local_window}
    # Keys closer than the local window w are exact: the previous chunk's keys sit at
    # distance <= w only while the query's clamp (in_chunk + s <= s + w - 1) is not reached.
    return PositionMethod("dca", rotary, passes, params=params, exact_below=local_window)
