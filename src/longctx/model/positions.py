"""What the model asks of a layer's positions: the `Positions` one forward builds per layer
design, and the `PositionsProvider` an evaluation-time position method implements
(model/position_methods/; the model never imports them)."""

from __future__ import annotations

from typing import Protocol

import torch


class Positions(Protocol):
    """How one forward pass places tokens: built once per forward, used by every layer.
    `rotate` runs on a layer's fresh q [B, Tq, H, D] and k [B, Tq, Hkv, D] before k enters
    the KV cache; `attend` maps q and all keys/values [B, Tk, Hkv, D] to [B, Tq, H, D]."""

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor | None = None
    ) -> torch.Tensor: ...


class PositionsProvider(Protocol):
    """An alternative to plain RoPE that the model accepts as `position_method` (the
    evaluation-time methods of model/position_methods/ implement it; this module never
    imports them). Keys of one KV cache must all come from the same provider."""

    def prepare(
        self,
        position_ids: torch.Tensor,
        key_position_ids: torch.Tensor,
        key_document_ids: torch.Tensor,
        q_len: int,
        *,
        backend: str,
        dtype: torch.dtype,
    ) -> Positions:
        """Per-forward state for queries at position_ids [B, Tq] over all keys (cached +
        new) at key_position_ids / key_document_ids [B, Tk]; dtype: the activations'."""
        ...
