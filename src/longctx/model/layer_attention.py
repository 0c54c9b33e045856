"""Where a layer's attention is decided: its mask and its passes, per layer design, for
training, prefill and decoding (docs/design.md §5 and §8).

Every attention layer asks its forward one question: how do my fresh q and k rotate
before k enters the KV cache, and how do I attend over all keys? The answer is a
`Positions` (`rotate`, `attend`), and `LayerAttention.decide` gives it, once per distinct
layer design (`ModelConfig.layer_specs`) and forward, shared by the layers of that design:

| layer design               | training / prefill                       | decoding step (one token over a cache)   |
| -------------------------- | ---------------------------------------- | ---------------------------------------- |
| full, RoPE                 | `Dense`: cos/sin at the position ids,    | `Step`: cos/sin' of the step, a mask     |
|                            | the document mask (model/attention.py)   | over the fixed-shape read of the cache   |
| sliding (window W)         | `Dense`: the sliding RoPE, the window in | `Step` over the kept + new keys          |
|                            | the mask; cached: kept W - 1 + new keys  |                                          |
| NoPE (`spec.rope` false)   | `Dense` without rotation                 | `Step` without rotation                  |
| full RoPE, position method | `method.prepare`: its passes             | `method.prepare_decode` where every pass |
|                            | (model/position_methods/)                | is a band, else the prefill path         |
| linear (Gated DeltaNet)    | `Recurrence`: where documents start, the | the same: the layer's constant-size      |
|                            | states restart (model/gated_deltanet.py) | states continue from the cache           |

`Step` and the decoding step's keys and masks: model/inference/step.py.

On top, for every row of the table: the attention temperature multiplies the rotated
queries by a factor of their position (`factor`, model/temperature.py) on the layers it
applies to; attention sinks (model/sinks.py) are the layer's own logits that `attend`
takes, refused under a position method (`check_forward`); the output gate (model/gate.py)
acts on what `attend` returns, so nothing here decides it. Under context parallelism a
`Dense` gathers the shard's keys/values before attending (model/sequence_shard.py).

A position method runs only on full RoPE layers; sliding and NoPE layers attend as they
were trained, which is exact only within the method's exact band, and linear layers have
no positions (`check_method_on_layers`): a model where no layer rotates is refused.

A new layer type is one more branch in `LayerAttention.decide` (and what its layers
read), as `linear` is beside `full` and `sliding`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

import torch

from longctx.config.model import LayerSpec, ModelConfig
from longctx.model.attention import AttentionMask, attention, build_mask
from longctx.model.gated_deltanet import Recurrence
from longctx.model.inference.step import DecodeKeys, DecodeMask, Step, signed_sin
from longctx.model.rope import RotaryEmbedding, apply_rotary
from longctx.model.sequence_shard import SequenceShard
from longctx.model.temperature import temperature_factor, tempered


class Positions(Protocol):
    """One layer design's attention in one forward. `rotate` runs on a layer's fresh q
    [B, Tq, H, D] and k [B, Tq, Hkv, D] before k enters the KV cache; `attend` maps q and
    all keys/values [B, Tk, Hkv, D] to [B, Tq, H, D]."""

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor | None = None
    ) -> torch.Tensor: ...


class PositionsProvider(Protocol):
    """An alternative to plain RoPE that the model accepts as `position_method` (the
    evaluation-time methods of model/position_methods/ implement it; the model never
    imports them). Keys of one KV cache must all come from the same provider. What it
    returns is a dataclass with a `factor` field, which the temperature fills."""

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

    def prepare_decode(self, position_ids: torch.Tensor, keys: DecodeKeys, dtype: torch.dtype) -> Positions:
        """A decoding step's (only where `fixed_shape_step` says the provider has one)."""
        ...


@dataclass
class Dense:
    """A training or prefill forward's layer without a position method: RoPE at the
    position ids (`cos`/`sin` [B, T, R]; None: a NoPE layer), the queries times the
    temperature `factor` [B, T, 1, 1] where one applies, then attention under `mask` (a
    window for a sliding layer); under a `shard`, keys/values gathered over it first."""

    mask: AttentionMask
    cos: torch.Tensor | None = None
    sin: torch.Tensor | None = None
    factor: torch.Tensor | None = None
    shard: SequenceShard | None = None

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cos is not None and self.sin is not None:
            q, k = apply_rotary(q, self.cos, self.sin), apply_rotary(k, self.cos, self.sin)
        return tempered(q, self.factor), k

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor | None = None
    ) -> torch.Tensor:
        if self.shard is not None:
            k, v = self.shard.gather(k, v)
        return attention(q, k, v, mask=self.mask, sinks=sinks)


@dataclass
class SequenceKeys:
    """The keys of a training or prefill forward: every cached key and the new ones."""

    position_ids: torch.Tensor
    """[B, Tk] every key's position id."""
    document_ids: torch.Tensor
    """[B, Tk] every key's document id."""
    backend: str
    max_seqlen: int | None = None
    """A host bound on every document's length (attention.build_mask)."""
    window_read: int | None = None
    """Over a KV cache: the keys a sliding layer reads (kept + new); None: all of them."""
    shard: SequenceShard | None = None


@dataclass
class LayerAttention:
    """One forward's decisions, layer design by layer design (module docstring)."""

    config: ModelConfig
    ropes: dict[str, RotaryEmbedding]
    """The RoPE of each layer kind that rotates: `full` and `sliding`."""
    position_ids: torch.Tensor
    """[B, Tq] the queries' position ids."""
    keys: SequenceKeys | DecodeKeys
    """A training/prefill forward's keys, or a decoding step's fixed-shape read."""
    dtype: torch.dtype
    """The dtype attention computes in (attention.compute_dtype)."""
    method: PositionsProvider | None = None
    recurrence: Recurrence | None = None
    """What the linear layers read (None in a model without them)."""

    def __post_init__(self) -> None:
        self.masks: dict[int, AttentionMask] = {}
        self.step_masks: dict[int, DecodeMask] = {}
        self.angles: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def all_layers(self, specs: list[LayerSpec]) -> dict[LayerSpec, Positions | Recurrence]:
        """The Positions of every distinct design among `specs`, built once each."""
        return {spec: self.decide(spec) for spec in dict.fromkeys(specs)}

    def decide(self, spec: LayerSpec) -> Positions | Recurrence:
        """The mask and passes of layers of design `spec`: the one branch per layer design."""
        positions: Positions
        if spec.kind == "linear":
            assert self.recurrence is not None, "a model with linear layers passes their Recurrence"
            return self.recurrence
        if self.method is not None and spec.rope and spec.kind == "full":
            positions = self.under_method(self.method)
        elif isinstance(self.keys, DecodeKeys):
            positions = Step(self.step_mask(spec.window), *self.rotation(spec, signed=True))
        else:
            cos, sin = self.rotation(spec)
            positions = Dense(self.mask(spec.window), cos, sin, shard=self.keys.shard)
        factor = self.factor(spec)
        return positions if factor is None else dataclasses.replace(positions, factor=factor)  # type: ignore[type-var]

    def under_method(self, method: PositionsProvider) -> Positions:
        """A full RoPE layer under the position method: a decoding step's band passes, or
        the method's plan over every key of a training/prefill forward."""
        if isinstance(self.keys, DecodeKeys):
            return method.prepare_decode(self.position_ids, self.keys, self.dtype)
        keys, q_len = self.keys, self.position_ids.shape[1]
        return method.prepare(
            self.position_ids, keys.position_ids, keys.document_ids, q_len, backend=keys.backend, dtype=self.dtype
        )

    def rotation(self, spec: LayerSpec, signed: bool = False) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """cos/sin of the layer kind's RoPE at the queries' positions, once per kind and
        forward (sin' = signed_sin for a decoding step); None for a NoPE layer."""
        if not spec.rope:
            return None, None
        if spec.kind not in self.angles:
            cos, sin = self.ropes[spec.kind](self.position_ids, self.dtype)
            self.angles[spec.kind] = (cos, signed_sin(sin) if signed else sin)
        return self.angles[spec.kind]

    def mask(self, window: int) -> AttentionMask:
        """A training/prefill forward's mask for layers of `window` (0: full), built once."""
        assert isinstance(self.keys, SequenceKeys)
        keys = self.keys
        if keys.shard is not None:
            return keys.shard.mask(window, keys.backend)
        if window not in self.masks:
            documents = keys.document_ids
            if window and keys.window_read is not None:  # a sliding layer reads only its kept keys + the new
                documents = documents[:, documents.shape[1] - keys.window_read :]
            q_len = self.position_ids.shape[1]
            self.masks[window] = build_mask(
                documents, q_len, keys.backend, dtype=self.dtype, max_seqlen=keys.max_seqlen, window=window
            )
        return self.masks[window]

    def step_mask(self, window: int) -> DecodeMask:
        """A decoding step's one-pass mask for layers of `window`, built once per step."""
        assert isinstance(self.keys, DecodeKeys)
        if window not in self.step_masks:
            span = self.keys.held if window else None
            self.step_masks[window] = DecodeMask(self.keys.allowed([(0, None)], span), self.dtype, self.keys.kernel)
        return self.step_masks[window]

    def factor(self, spec: LayerSpec) -> torch.Tensor | None:
        """The temperature's factor where it applies to `spec`, else None (read from the
        config at every forward: an evaluation may override it)."""
        temperature = self.config.attn_temperature
        if not temperature.applies_to(spec.rope):
            return None
        max_position = self.config.max_position
        return temperature_factor(
            temperature, self.position_ids, window=spec.window, max_position=max_position, dtype=self.dtype
        )


def fixed_shape_step(q_len: int, method: PositionsProvider | None) -> bool:
    """Whether a forward of `q_len` tokens over a KV cache is a fixed-shape decoding step
    (model/inference/step.py): one token per row, under plain RoPE or a method whose
    decoding passes are distance bands over rotated keys (rope, ntk, yarn, StRing)."""
    return q_len == 1 and (method is None or bool(getattr(method, "fixed_shape_decoding", False)))


def check_forward(
    config: ModelConfig,
    specs: list[LayerSpec],
    backend: str,
    method: PositionsProvider | None = None,
    cached: bool = False,
    shard: SequenceShard | None = None,
) -> None:
    """What no layer's decision can serve, refused before any work: sinks on xformers, a
    sequence shard with a cache or a method, a method the layers cannot carry
    (`check_method_on_layers`)."""
    if config.attention_sinks and backend == "xformers":
        raise ValueError("attention backend 'xformers' has no attention sinks; use flash, flex, sdpa or varlen")
    if shard is not None and (cached or method is not None):
        raise ValueError("a sequence shard trains: it takes no kv_cache and no position_method")
    if method is not None:
        check_method_on_layers(method, specs, config)


def check_method_on_layers(method: PositionsProvider, specs: list[LayerSpec], config: ModelConfig) -> None:
    """A position method acts on the full layers that rotate and leaves the others as
    trained (docs/design.md §8): sliding layers are exact only if it equals RoPE at every
    distance the window holds (StRing: W <= S; ReRoPE: W <= its window, no log scaling;
    Self-Extend: W <= its neighbour window; DCA: W <= its local window); NoPE and linear
    layers have no positions to change, so a model where no layer rotates (a NoPE-only
    hybrid such as OLMo Hybrid as released) is refused. Methods do not carry sinks."""
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
    window = max(spec.window for spec in specs)
    exact = getattr(method, "exact_below", None)
    if window and (exact is None or window > exact):
        raise ValueError(
            f"position method {name!r} changes distances below {exact}; the sliding layers' window "
            f"model.sliding_window={window} sees them: use a window <= {exact} or a method whose exact band covers it"
        )
