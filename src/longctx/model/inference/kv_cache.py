"""The KV cache of cached decoding: full layers keep every key, sliding layers their window.

    cache = model.new_kv_cache(batch_size=B, max_len=T + new_tokens)
    logits = model(prompt, kv_cache=cache)                 # prefill (in chunks or at once)
    logits = model(next_token[:, None], kv_cache=cache)    # decode, positions continue

The design (docs/design.md §8, "The KV cache"):

- All rows advance together (prompts of one batch share a length, as in NIAH); `length`
  counts the positions cached so far. Document and position ids of every cached position
  are kept ([B, max_len] longs, 16 bytes a token for both): packed prompts keep their masks,
  position methods see every key's position, and `next_position` continues each row.
- A full layer's keys/values live in one preallocated [n_full, B, max_len, Hkv, D] tensor;
  a forward writes its new keys at [length, length + T) and reads [0, length + T).
- A sliding layer of window W reads, in a forward of T new tokens, the last
  min(length, W - 1) cached keys and the T new ones: the keys any of its queries can see.
  It keeps only the last W - 1 ([n_sliding, B, W - 1, Hkv, D], in position order), so its
  memory stops growing with the prompt: a Gemma-3-like 5:1 model decoding at 32K holds one
  sixth of an all-full cache plus 5 windows. Reading and keeping are fixed-shape once the
  window is full (W keys read per decoding step), what CUDA-graph capture needs.
- A decoding step (`fixed_reads`, model/inference/step.py) writes at `end`, the length kept on
  the device, and reads the whole buffer; `document_start` [B] holds where each row's
  current document starts, so the step's masks need no host sync.
- `decode_kernel`: the decoding steps' attention runs in the Triton decoding kernel
  (model/inference/kernel.py, CUDA), whose buffers the cache owns (`kernel_buffers`), so two
  generations never share the kernel's output; off, torch's kernels.
- Keys are cached rotated, except on full layers under position methods that rotate keys
  at rewritten positions (ReRoPE, Self-Extend, DCA), which cache them un-rotated; sliding
  and NoPE layers never run a position method, so theirs are always as the layer made them.
"""

from __future__ import annotations

import torch

from longctx.batch import document_start_index
from longctx.config.model import ModelConfig
from longctx.model.inference.kernel import KernelBuffers
from longctx.model.inference.step import DecodeKeys

__all__ = ["KVCache"]


class KVCache:
    """Preallocated keys/values of every layer for batched incremental decoding."""

    def __init__(self, config: ModelConfig, batch_size: int, max_len: int, device=None, decode_kernel: bool = False):
        # Keys/values are allocated at the first `store`, in the dtype the layers compute in:
        # under bf16 autocast the projections give bf16 k/v while the weights stay float32,
        # and a float32 cache would hand the attention kernel bf16 queries with float32 keys
        # (the flash kernels take one dtype and refuse the mix).
        windows = [spec.window for spec in config.layer_specs()]
        self.window = max(windows)
        """W of the sliding layers (0: none slides)."""
        self.keep = min(self.window - 1, max_len) if self.window else 0
        """Keys a sliding layer carries from one forward to the next: W - 1."""
        linear = {i for i, kind in enumerate(config.layer_kinds()) if kind == "linear"}
        self.linear_states: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        """Per linear layer (model/gated_deltanet.py): its convolution and recurrent states,
        constant in size; no keys or values."""
        full = [layer for layer, window in enumerate(windows) if not window and layer not in linear]
        sliding = [layer for layer, window in enumerate(windows) if window]
        self._slot = {layer: index for index, layer in enumerate(full)} | {
            layer: index for index, layer in enumerate(sliding)
        }
        self._sliding = set(sliding)
        per_token = (config.n_kv_heads, config.head_size)
        self._shapes = ((len(full), batch_size, max_len, *per_token), (len(sliding), batch_size, self.keep, *per_token))
        self.keys: torch.Tensor | None = None
        """Full layers' keys [n_full, B, max_len, Hkv, D] (allocated at the first store)."""
        self.values: torch.Tensor | None = None
        self.window_keys: torch.Tensor | None = None
        """Sliding layers' last W - 1 keys [n_sliding, B, W - 1, Hkv, D], in position order."""
        self.window_values: torch.Tensor | None = None
        self.document_ids = torch.zeros(batch_size, max_len, dtype=torch.long, device=device)
        self.position_ids = torch.zeros(batch_size, max_len, dtype=torch.long, device=device)
        self.next_position = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.document_start = torch.zeros(batch_size, dtype=torch.long, device=device)
        """[B] key index where each row's current (last) document starts: a decoding step's
        first visible key, kept on the device so that no step reads document ids back."""
        self.end = torch.zeros(1, dtype=torch.long, device=device)
        """[1] `length` on the device: where a decoding step writes, what its masks compare to."""
        self.key_index = torch.arange(max_len, device=device)
        """[max_len] 0..max_len-1, shared by every step's masks."""
        self.fixed_reads = False
        """Set per forward by the model: full layers write at `end` and return their whole
        buffer (a decoding step, model/inference/step.py), else the slice [0, length + T)."""
        self._length = 0
        self.max_len = max_len
        self.kernel_buffers = KernelBuffers() if decode_kernel else None
        """The decoding kernel's workspaces and output for this cache's steps (model/inference/kernel.py);
        None: the steps' attention runs in torch's kernels."""

    @property
    def length(self) -> int:
        """Positions cached so far (host int; `end` holds it on the device)."""
        return self._length

    @length.setter
    def length(self, value: int) -> None:
        self._length = value
        self.end.fill_(value)

    def continued_documents(self, batch: int, seq: int) -> torch.Tensor:
        """[B, T] document ids of T new tokens that continue each row's last document (0
        for an empty cache); a decoding step reads the last one at `end` - 1 on the device."""
        if self.length == 0:
            return torch.zeros(batch, seq, dtype=torch.long, device=self.document_ids.device)
        if self.fixed_reads:
            return self.document_ids.index_select(1, self.end - 1)
        return self.document_ids[:, self.length - 1 : self.length].expand(batch, seq)

    def write_ids(
        self, new_documents: torch.Tensor | None, document_ids: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Record T new positions' document and position ids [B, T] (`new_documents`: as the
        caller gave them, None when they continue each row's last document); return every
        key's ids so far, [B, length + T]. A decoding step writes at `end` (device), so
        that it can be replayed as a CUDA graph (model/inference/graph.py)."""
        seq = document_ids.shape[1]
        if self.length + seq > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; {self.length} used + {seq} new")
        self.update_document_start(new_documents)
        stop = self.length + seq
        if self.fixed_reads:
            self.document_ids.index_copy_(1, self.end, document_ids)
            self.position_ids.index_copy_(1, self.end, position_ids)
        else:
            self.document_ids[:, self.length : stop] = document_ids
            self.position_ids[:, self.length : stop] = position_ids
        return self.document_ids[:, :stop], self.position_ids[:, :stop]

    def advance(self, position_ids: torch.Tensor) -> None:
        """After a forward of position_ids [B, T]: T more positions cached, each row's next
        position after its last. In place on the device (a replayed graph repeats it)."""
        self._length += position_ids.shape[1]
        if self.fixed_reads:
            self.end.add_(position_ids.shape[1])
        else:
            self.end.fill_(self._length)
        self.next_position.copy_(position_ids[:, -1] + 1)

    def advance_host(self, tokens: int) -> None:
        """The host's count after a replayed step (model/inference/graph.py), whose recorded
        kernels already advanced the device's."""
        self._length += tokens

    def update_document_start(self, document_ids: torch.Tensor | None) -> None:
        """Before writing T new positions of `document_ids` [B, T] (None: they continue each
        row's last document): the start of each row's last document afterwards, from
        device tensors only (`end`, not the host length, so a replayed step stays right).
        It stays where the new tokens continue the cached last document, else it is the
        first new index of the new tokens' last document."""
        if document_ids is None:
            return
        within = document_start_index(document_ids)[:, -1]
        start = within + self.end
        if self.length:
            last = self.document_ids.index_select(1, self.end - 1)[:, 0]
            continues = (within == 0) & (document_ids[:, 0] == last)
            start = torch.where(continues, self.document_start, start)
        self.document_start.copy_(start)

    @property
    def nbytes(self) -> int:
        """Bytes of cached keys and values (0 before the first store)."""
        tensors = (self.keys, self.values, self.window_keys, self.window_values)
        states = sum(conv.nbytes + state.nbytes for conv, state in self.linear_states.values())
        return sum(t.nbytes for t in tensors if t is not None) + states

    def linear_state(self, layer: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """A linear layer's (convolution, recurrent) states after the cached positions (None, None
        before its first forward)."""
        return self.linear_states.get(layer, (None, None))

    def store_linear(self, layer: int, conv: torch.Tensor, state: torch.Tensor) -> None:
        """Keep a linear layer's states after this forward, in place once held (a replayed
        decoding step writes the same buffers)."""
        held = self.linear_states.get(layer)
        if held is None:
            self.linear_states[layer] = conv.detach().clone(), state.detach().clone()
        else:
            held[0].copy_(conv)
            held[1].copy_(state)

    def step_keys(self) -> DecodeKeys:
        """Where a decoding step's token finds its keys (model/inference/step.py), from the
        device tensors the cache keeps: no host sync."""
        return DecodeKeys(self.end, self.document_start, self.key_index, self.window_span(1), self.kernel_buffers)

    def window_span(self, new_tokens: int) -> int:
        """Keys a sliding layer reads in a forward of `new_tokens`: its kept keys + the new."""
        return min(self.length, self.keep) + new_tokens

    def store(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this step's k/v [B, T, Hkv, D] for `layer`; return the keys/values its queries
        attend: all cached up to and including them (full), or the last `window_span(T)`
        (sliding)."""
        if self.keys is None or self.values is None:
            self._allocate(k, v)
        elif (k.dtype, v.dtype) != (self.keys.dtype, self.values.dtype):
            raise TypeError(
                f"KV cache holds {self.keys.dtype} keys/values, this step computed {k.dtype}/{v.dtype}: "
                "prefill and decoding must run under the same precision (autocast on for both or neither)"
            )
        slot = self._slot[layer]
        if layer in self._sliding:
            return self._store_window(slot, k, v)
        assert self.keys is not None and self.values is not None
        if self.fixed_reads:
            self.keys[slot].index_copy_(1, self.end, k)
            self.values[slot].index_copy_(1, self.end, v)
            return self.keys[slot], self.values[slot]
        end = self.length + k.shape[1]
        self.keys[slot, :, self.length : end] = k
        self.values[slot, :, self.length : end] = v
        return self.keys[slot, :, :end], self.values[slot, :, :end]

    def _allocate(self, k: torch.Tensor, v: torch.Tensor) -> None:
        full, sliding = self._shapes
        self.keys = torch.zeros(full, device=k.device, dtype=k.dtype)
        self.values = torch.zeros(full, device=v.device, dtype=v.dtype)
        self.window_keys = torch.zeros(sliding, device=k.device, dtype=k.dtype)
        self.window_values = torch.zeros(sliding, device=v.device, dtype=v.dtype)

    def _store_window(self, slot: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.window_keys is not None and self.window_values is not None
        held = min(self.length, self.keep)
        keys = torch.cat([self.window_keys[slot, :, :held], k], dim=1)
        values = torch.cat([self.window_values[slot, :, :held], v], dim=1)
        kept = min(keys.shape[1], self.keep)
        # The kept keys are the last W - 1 in position order: what the next forward reads.
        self.window_keys[slot, :, :kept] = keys[:, keys.shape[1] - kept :]
        self.window_values[slot, :, :kept] = values[:, values.shape[1] - kept :]
        return keys, values
