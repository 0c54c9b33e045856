"""Greedy decoding: batched with the KV cache, and a full-recompute reference.

`greedy_generate` prefills the batch of equal-length prompts into the KV cache, then runs
one forward of a single token per step; each step costs O(prompt length) instead of the
O(prompt length^2) of re-running the prompt. The prefill runs in chunks of
`prefill_chunk_tokens` tokens per row: chunk c attends to the cached keys of chunks
0..c-1 and causally to itself, which is exactly the unchunked attention row by row, while
a forward's activations (and the attention scores of the dense CPU kernels, Tq x Tk) grow
with the chunk instead of the prompt: what lets a long prompt fit (niah/memory.py).
`greedy_generate_recompute` re-runs the full sequence every step: slow, obviously right,
and what tests compare against.
"""

from __future__ import annotations

import torch

from longctx.model.llama import Llama
from longctx.model.position_methods import PositionMethod


@torch.no_grad()
def greedy_generate(
    model: Llama,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    position_ids: torch.Tensor | None = None,
    document_ids: torch.Tensor | None = None,
    attention_backend: str | None = None,
    position_method: PositionMethod | None = None,
    prefill_chunk_tokens: int = 0,
) -> torch.Tensor:
    """input_ids [B, T] -> generated ids [B, max_new_tokens] (argmax at every step);
    `prefill_chunk_tokens`: prompt tokens per row per prefill forward (0 = all T at once)."""
    if prefill_chunk_tokens < 0:
        raise ValueError(f"prefill_chunk_tokens must be >= 0, got {prefill_chunk_tokens}")
    batch, prompt_len = input_ids.shape
    cache = model.new_kv_cache(batch, prompt_len + max_new_tokens)
    options = dict(kv_cache=cache, attention_backend=attention_backend, position_method=position_method)
    logits = prefill(model, input_ids, position_ids, document_ids, prefill_chunk_tokens, options)
    tokens = []
    next_token = logits[:, -1].argmax(-1)
    for step in range(max_new_tokens):
        tokens.append(next_token)
        if step + 1 == max_new_tokens:
            break
        logits = model(next_token[:, None], **options)
        next_token = logits[:, -1].argmax(-1)
    return torch.stack(tokens, dim=1)


@torch.no_grad()
def greedy_generate_recompute(
    model: Llama, input_ids: torch.Tensor, max_new_tokens: int, position_method: PositionMethod | None = None
) -> torch.Tensor:
    """Reference: the whole sequence is re-run for every new token (no cache)."""
    sequence = input_ids
    for _ in range(max_new_tokens):
        next_token = model(sequence, position_method=position_method)[:, -1].argmax(-1)
        sequence = torch.cat([sequence, next_token[:, None]], dim=1)
    return sequence[:, input_ids.shape[1] :]


def prefill(
    model: Llama,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor | None,
    document_ids: torch.Tensor | None,
    chunk_tokens: int,
    options: dict,
) -> torch.Tensor:
    """Run the prompt [B, T] into `options['kv_cache']` in chunks of `chunk_tokens` per row
    (0 = all at once); returns the last chunk's last-position logits [B, 1, vocab]."""
    prompt_len = input_ids.shape[1]
    chunk = chunk_tokens or prompt_len
    for start in range(0, prompt_len, chunk):
        part = slice(start, start + chunk)
        logits = model(
            input_ids[:, part],
            None if position_ids is None else position_ids[:, part],
            None if document_ids is None else document_ids[:, part],
            last_logits_only=True,
            **options,
        )
    return logits
