"""A decoding step recorded once and replayed: CUDA graphs for cached decoding.

    graph = DecodeGraph(model, cache, position_method)   # after the prefill, under no_grad
    for _ in range(new_tokens):
        logits = graph.step(next_ids)                     # [B, 1] -> [B, 1, vocab]

Why: a decoding step of a small model on a GPU waits on Python, not on the GPU: ~20 us of
dispatch per aten operation, ~400 operations per step for a 22-layer model, against ~1 ms
of memory traffic (docs/benchmarks.md, "Decode step operations"). A CUDA graph replays
the recorded kernels with one launch, so the step costs what the GPU does.

What makes a step replayable (model/decode.py, model/kv_cache.py): it reads and writes
fixed shapes (the whole preallocated cache under a mask), it never reads a value back to
the host, and every position it depends on lives on the device: the new index `end`, each
row's document start and next position, all updated in place. The host keeps only the
cache's `length`, which this class advances after each replay. Sliding layers read
min(length, W - 1) + 1 keys, a host number that stops changing once the window is full,
so a model with sliding layers is recorded only from then on.

The first `step` runs eagerly (kernels chosen, workspaces allocated, under autocast the
weights cast once: `WeightCasts`), the second is recorded and replayed, every later one
replayed. The returned logits are the graph's output buffer: the next step overwrites
them. Without CUDA (or with `record=None`) every step runs eagerly. `record` is pluggable
so that CPU tests can record a step by tracing (`torch.fx.experimental.proxy_tensor.make_fx`
bakes host numbers into the trace exactly as a CUDA graph does) and prove that replaying
it equals running the model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from longctx.model.kv_cache import KVCache
from longctx.model.llama import Llama
from longctx.model.positions import PositionsProvider

Recorded = Callable[[], torch.Tensor]


class Recorder(Protocol):
    def __call__(self, step: Recorded) -> tuple[Recorded, bool]:
        """Record `step`; return its replay and whether recording already ran it once."""
        ...


def cuda_graph(step: Recorded) -> tuple[Recorded, bool]:
    """`step` captured as a CUDA graph (capture records without running it). Under
    autocast the capture runs without autocast's weight cache (torch's CUDA-graph rule: a
    cached cast made during capture would be freed under the graph); the step's weights
    arrive cast already (`WeightCasts`, made in the eager first step)."""
    graph = torch.cuda.CUDAGraph()
    autocast = torch.is_autocast_enabled("cuda")
    precision = torch.get_autocast_dtype("cuda")
    with torch.autocast("cuda", dtype=precision, enabled=autocast, cache_enabled=False), torch.cuda.graph(graph):
        out = step()

    def replay() -> torch.Tensor:
        graph.replay()
        return out

    return replay, False


class WeightCasts(TorchFunctionMode):
    """Under autocast, every `F.linear`'s float32 weight and bias cast to autocast's dtype
    once and reused by every later call, so a recorded step reads bf16 weights instead of
    casting them at every replay.

    Why: a CUDA graph is captured without autocast's weight cache (`cuda_graph`), so each
    replay would read the fp32 weights and write their bf16 casts before reading those:
    three times a bf16 step's weight bytes. Autocast's cache never held the inference
    layout's fused q/k/v and gate/up weights anyway (it keeps only leaf tensors, and those
    are views of one buffer), so eager steps cast them at every step too. A cast here is
    the one autocast makes (`.to(dtype)`, round to nearest even): the results are bitwise
    autocast's. The casts are keyed by storage, offset, shape and stride and assume the
    weights do not change while they live (one generation's decoding)."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.dtype = dtype
        self.casts: dict[tuple, torch.Tensor] = {}

    def _cast(self, tensor: Any) -> Any:
        if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.float32:
            return tensor
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.stride())
        if key not in self.casts:
            self.casts[key] = tensor.to(self.dtype)
        return self.casts[key]

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and len(args) >= 2:
            args = (args[0], *(self._cast(a) for a in args[1:]))
            if "bias" in kwargs:
                kwargs = kwargs | {"bias": self._cast(kwargs["bias"])}
        return func(*args, **kwargs)


def recordable(position_method: PositionsProvider | None) -> bool:
    """Whether decoding under `position_method` has a fixed-shape step (model/decode.py)."""
    return position_method is None or bool(getattr(position_method, "fixed_shape_decoding", False))


class DecodeGraph:
    """One cache's decoding steps, recorded once and replayed (module docstring)."""

    def __init__(
        self,
        model: Llama,
        cache: KVCache,
        position_method: PositionsProvider | None = None,
        *,
        attention_backend: str | None = None,
        record: Recorder | str | None = "auto",
    ):
        if not recordable(position_method):
            name = getattr(position_method, "name", type(position_method).__name__)
            raise ValueError(f"position method {name!r} has no fixed-shape decoding step to record; run it eagerly")
        if cache.length == 0:
            raise ValueError("record decoding after the prefill: the KV cache is empty")
        self.model, self.cache, self.position_method = model, cache, position_method
        self.attention_backend = attention_backend
        device = cache.document_ids.device
        if record == "auto":
            record = cuda_graph if device.type == "cuda" else None
        self.record: Recorder | None = record  # type: ignore[assignment]
        self.ids = torch.zeros(cache.document_ids.shape[0], 1, dtype=torch.long, device=device)
        """The recorded step's input: each step's ids are copied in."""
        self.replay: Recorded | None = None
        self.steps = 0
        autocast = torch.is_autocast_enabled(device.type) and self.record is not None
        self.casts = WeightCasts(torch.get_autocast_dtype(device.type)) if autocast else None
        """Recorded steps under autocast read weights cast once (`WeightCasts`)."""

    def step(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits [B, 1, vocab] of the next tokens `ids` [B, 1], written into the cache."""
        if ids.shape != self.ids.shape:
            raise ValueError(f"ids have shape {tuple(ids.shape)}; this graph decodes {tuple(self.ids.shape)}")
        if self.cache.length + 1 > self.cache.max_len:
            raise ValueError(f"KV cache holds {self.cache.max_len} positions; all are used")
        self.ids.copy_(ids)
        self.steps += 1
        if self.replay is not None:
            out = self.replay()
            self.cache.advance_host(1)
            return out
        if self.record is None or self.steps == 1 or not self._window_full():
            return self._forward()
        replay, ran = self.record(self._forward)  # the recording's host code advances the host length once
        self.replay = replay
        return replay() if not ran else self._last

    def _forward(self) -> torch.Tensor:
        if self.casts is not None and not self.casts.casts:
            # the casts made in the first step replace autocast's (one bf16 copy, not two)
            torch.clear_autocast_cache()
        with self.casts if self.casts is not None else contextlib.nullcontext():
            self._last = self.model(
                self.ids,
                kv_cache=self.cache,
                position_method=self.position_method,
                attention_backend=self.attention_backend,
            )
        return self._last

    def _window_full(self) -> bool:
        """Sliding layers read a fixed number of keys once length >= W - 1."""
        return not self.cache.window or self.cache.length >= self.cache.keep
