"""What the model asks of a layer's positions: the `Positions` one forward builds per layer
design, the `PositionsProvider` an evaluation-time position method implements
(model/position_methods/; the model never imports them), and the layers a method may act on
(`check_method_on_layers`)."""

from __future__ import annotations

from typing import Protocol

import torch

from longctx.config.model import LayerSpec, ModelConfig


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


def check_method_on_layers(method: PositionsProvider, specs: list[LayerSpec], config: ModelConfig) -> None:
    """A position method acts on the full layers that rotate and leaves the others as trained
    (docs/design.md §8): sliding layers are exact only if it equals RoPE at every distance
    the window holds (StRing: W <= S; ReRoPE: W <= its window, no log scaling; Self-Extend:
    W <= its neighbour window; DCA: W <= its local window); NoPE and linear layers have no
    positions to change, so a model where no layer rotates (a NoPE-only hybrid such as OLMo
    Hybrid as released) is refused. Methods do not carry attention sinks."""
    window = max(spec.window for spec in specs)
    name = getattr(method, "name", type(method).__name__)
    if not any(spec.rope for spec in specs):
        kinds = sorted({spec.kind if spec.kind == "linear" else f"NoPE {spec.kind}" for spec in specs})
        raise ValueError(
            f"position method {name!r} has nothing to act on: no layer of this model rotates (its layers: "
            f"{', '.join(kinds)}); evaluate it under plain positions (eval.position_method.name=rope)"
        )
    if config.attention_sinks:
        raise ValueError(
            f"position method {name!r} does not carry model.attention_sinks: evaluate a model with sinks "
            "under plain RoPE (eval.position_method.name=rope)"
        )
    exact = getattr(method, "exact_below", None)
    if window and (exact is None or window > exact):
        raise ValueError(
            f"position method {name!r} changes distances below {exact}; the sliding layers' window "
            f"model.sliding_window={window} sees them: use a window <= {exact} or a method whose exact band covers it"
        )
