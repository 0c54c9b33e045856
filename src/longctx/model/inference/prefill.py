"""The prefill of a KV-cache decoder, and the full-recompute greedy reference.

`prefill` runs a batch of prompts into the KV cache in chunks of `chunk_tokens` tokens per
row: chunk c attends to the cached keys of chunks 0..c-1 and causally to itself, which is
exactly the unchunked attention row by row, while a forward's activations (and the
attention scores of the dense CPU kernels, Tq x Tk) grow with the chunk instead of the
prompt: what lets a long prompt fit (eval/memory_estimate.py). The decoder every evaluation uses,
one cached token per step after the prefill, is `longctx.model.inference.generation.generate`.
`greedy_generate_recompute` re-runs the full sequence every step: slow, obviously right,
and what tests compare against.
"""

from __future__ import annotations

import torch

from longctx.model.llama import Llama
from longctx.model.position_methods import PositionMethod


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
