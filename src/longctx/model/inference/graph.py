"""A decoding step recorded once and replayed: CUDA graphs for cached decoding.

    mode = decoding_mode("graph+kernel", model, position_method)   # eval.cuda_decoding
    cache = model.new_kv_cache(B, T + new_tokens, decode_kernel=mode.kernel)
    ...                                                   # the prefill, under no_grad
    graph = DecodeGraph(model, cache, position_method)    # where mode.graph
    for _ in range(new_tokens):
        logits = graph.step(next_ids)                     # [B, 1] -> [B, 1, vocab]

Why: a decoding step of a small model on a GPU waits on Python, not on the GPU: ~20 us of
dispatch per aten operation, ~400 operations per step for a 22-layer model, against ~1 ms
of memory traffic (docs/benchmarks.md, "Decode step operations"). A CUDA graph replays
the recorded kernels with one launch, so the step costs what the GPU does.

What makes a step replayable (model/inference/step.py, model/inference/kv_cache.py): it reads and writes
fixed shapes (the whole preallocated cache under a mask), it never reads a value back to
the host, and every position it depends on lives on the device: the new index `end`, each
row's document start and next position, all updated in place. The host keeps only the
cache's `length`, which this class advances after each replay. Sliding layers read
min(length, W - 1) + 1 keys, a host number that stops changing once the window is full:
that number is the step's shape.

When a step is recorded: never at the first call of its shape. Each step runs eagerly,
inside the recorder's `warm_up` (on CUDA a side stream, as torch's CUDA-graph notes
require: kernels chosen, cuBLAS and the decoding kernel's workspaces allocated on the
stream the capture runs on, under autocast the weights cast once: `WeightCasts`), until a
step has the shape of the eager step before it; that step is recorded and replayed, and
every later one replayed. So the first step is eager, and a model with sliding layers is
recorded only at the second step after its window is full. The returned logits are the
graph's output buffer: the next step overwrites them. Without CUDA (or with `record=None`)
every step runs eagerly. `record` is pluggable so that CPU tests can record a step by
tracing (`torch.fx.experimental.proxy_tensor.make_fx` bakes host numbers into the trace
exactly as a CUDA graph does) and prove that replaying it equals running the model.

Whether to record at all, and whether the decoding kernel runs, is `decoding_mode`'s
decision (eval.cuda_decoding, the model and the position method): nothing is recorded for
a model with sharded parameters (a DTensor parameter or an FSDP2-managed module), whose
forward all-gathers and frees its weights on side streams that a graph would freeze.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.overrides import TorchFunctionMode

from longctx.config.eval import CUDA_DECODING
from longctx.model.inference.kv_cache import KVCache
from longctx.model.layer_attention import PositionsProvider, fixed_shape_step
from longctx.model.llama import Llama

Recorded = Callable[[], torch.Tensor]
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DecodingMode:
    """How one generation's decoding steps run (`decoding_mode`)."""

    graph: bool
    """Record the steps and replay them (`DecodeGraph`; eager off CUDA)."""
    kernel: bool
    """The steps' attention in the Triton decoding kernel where it can run (CUDA):
    `model.new_kv_cache(..., decode_kernel=kernel)`."""


def sharded(model: nn.Module) -> bool:
    """Whether any parameter is a DTensor or any module is managed by FSDP2 (`fully_shard`)."""
    return any(isinstance(p, DTensor) for p in model.parameters()) or any(
        isinstance(m, FSDPModule) for m in model.modules()
    )


def decoding_mode(setting: str, model: Llama, position_method: PositionsProvider | None = None) -> DecodingMode:
    """`eval.cuda_decoding` (eager | kernel | graph | graph+kernel, config/eval.py) for
    this model and position method. A graph is recorded only where the step has a fixed
    shape (layer_attention.fixed_shape_step), the model does not re-run its sequence mid-decoding (longrope,
    model/inference/generation.py) and no parameter is sharded: a sharded model's forward gathers and
    frees its weights, collectively and on side streams, which a recorded graph would
    replay against freed memory; it decodes eagerly, and says so in one log line."""
    if setting not in CUDA_DECODING:
        raise ValueError(f"cuda_decoding {setting!r} is not one of {CUDA_DECODING}")
    graph = setting in ("graph", "graph+kernel")
    if graph and sharded(model):
        logger.info("cuda_decoding=%s: the model's parameters are sharded (FSDP); decoding eagerly", setting)
        graph = False
    longrope = model.config.rope_scaling.type == "longrope"
    return DecodingMode(graph and fixed_shape_step(1, position_method) and not longrope, setting.endswith("kernel"))


class Recorder(Protocol):
    """How `DecodeGraph` records a step: eager steps run inside `warm_up`, then `record`."""

    def warm_up(self) -> AbstractContextManager[Any]:
        """Where the eager steps before the recording run (the stream the recording uses)."""
        ...

    def record(self, step: Recorded) -> tuple[Recorded, bool]:
        """Record `step`; return its replay and whether recording already ran it once."""
        ...


class CudaGraph:
    """Steps captured as a CUDA graph on one side stream, warmed up on it first (torch's
    CUDA-graph notes: lazy initialisation such as cuBLAS workspaces happens per stream, and
    must not happen during the capture)."""

    def __init__(self, device: torch.device):
        self.stream = torch.cuda.Stream(device)

    @contextlib.contextmanager
    def warm_up(self) -> Iterator[None]:
        current = torch.cuda.current_stream(self.stream.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            yield
        current.wait_stream(self.stream)

    def record(self, step: Recorded) -> tuple[Recorded, bool]:
        """`step` captured (capture records without running it). Under autocast the capture
        runs without autocast's weight cache (torch's CUDA-graph rule: a cached cast made
        during capture would be freed under the graph); the step's weights arrive cast
        already (`WeightCasts`, made in the eager first step)."""
        graph = torch.cuda.CUDAGraph()
        autocast = torch.is_autocast_enabled("cuda")
        precision = torch.get_autocast_dtype("cuda")
        with (
            torch.autocast("cuda", dtype=precision, enabled=autocast, cache_enabled=False),
            torch.cuda.graph(graph, stream=self.stream),
        ):
            out = step()

        def replay() -> torch.Tensor:
            graph.replay()
            return out

        return replay, False


class WeightCasts(TorchFunctionMode):
    """Under autocast, every `F.linear`'s float32 weight and bias cast to autocast's dtype
    once and reused by every later call, so a recorded step reads bf16 weights instead of
    casting them at every replay.

    Why: a CUDA graph is captured without autocast's weight cache (`CudaGraph`), so each
    replay would read the fp32 weights and write their bf16 casts before reading those:
    three times a bf16 step's weight bytes. Autocast's cache never held the inference
    layout's fused q/k/v and gate/up weights anyway (it keeps only leaf tensors, and those
    are views of one buffer), so eager steps cast them at every step too. A cast here is
    the one autocast makes (`.to(dtype)`, round to nearest even): the results are bitwise
    autocast's. The casts are keyed by the tensor itself (a Parameter, or the fused
    layout's buffer), held with it so that its id is not reused, and by its version
    counter, so an in-place change of its values casts again; not by its memory address,
    which another weight may occupy once this one's storage is freed or refilled (FSDP's
    all-gather buffers are)."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.dtype = dtype
        self.casts: dict[int, tuple[torch.Tensor, int, torch.Tensor]] = {}
        """id(tensor) -> (tensor, its version when cast, the cast)."""

    def _cast(self, tensor: Any) -> Any:
        if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.float32:
            return tensor
        held = self.casts.get(id(tensor))
        if held is None or held[0] is not tensor or held[1] != tensor._version:
            held = (tensor, tensor._version, tensor.to(self.dtype))
            self.casts[id(tensor)] = held
        return held[2]

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and len(args) >= 2:
            args = (args[0], *(self._cast(a) for a in args[1:]))
            if "bias" in kwargs:
                kwargs = kwargs | {"bias": self._cast(kwargs["bias"])}
        return func(*args, **kwargs)


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
        if not fixed_shape_step(1, position_method):
            name = getattr(position_method, "name", type(position_method).__name__)
            raise ValueError(f"position method {name!r} has no fixed-shape decoding step to record; run it eagerly")
        if sharded(model):
            raise ValueError("the model's parameters are sharded (FSDP): decode it eagerly, not as a recorded graph")
        if cache.length == 0:
            raise ValueError("record decoding after the prefill: the KV cache is empty")
        self.model, self.cache, self.position_method = model, cache, position_method
        self.attention_backend = attention_backend
        device = cache.document_ids.device
        if record == "auto":
            record = CudaGraph(device) if device.type == "cuda" else None
        self.record: Recorder | None = record  # type: ignore[assignment]
        self.ids = torch.zeros(cache.document_ids.shape[0], 1, dtype=torch.long, device=device)
        """The recorded step's input: each step's ids are copied in."""
        self.replay: Recorded | None = None
        self.steps = 0
        self.warmed: int | None = None
        """The shape (the keys a sliding layer reads) of the last eager step, run inside the
        recorder's warm-up."""
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
        if self.record is None:
            return self._forward()
        # what a recorded step fixes besides the cache's buffers: the keys a sliding layer
        # reads, min(length, W - 1) + 1 (1 without sliding layers: every step alike)
        shape = self.cache.window_span(1)
        if shape != self.warmed:  # the first call of this shape runs eagerly, as a warm-up
            with self.record.warm_up():
                out = self._forward()
            self.warmed = shape
            return out
        replay, ran = self.record.record(self._forward)  # the recording's host code advances the host length once
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
