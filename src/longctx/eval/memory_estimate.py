"""Memory of a NIAH evaluation, estimated before anything large is allocated.

A length that cannot fit must be refused with its limit named, not discovered by the
kernel's OOM killer: `longctx niah CKPT --lengths 100000000` (a typo) grew to 22 GB and was
killed without a message. `check_evaluation_memory` runs before the prompts of the longest
evaluated length are built and compares

    total = weights + casts + prompts + KV cache + prefill chunk

with what the device offers (CPU: MemAvailable of /proc/meminfo; CUDA: free memory of
`torch.cuda.mem_get_info`) plus the weights, which are already resident when it runs.
For B rows decoded together (`rows_per_batch`, at most batch_tokens // L), a prompt of L
tokens, n new tokens and a prefill chunk of C tokens per row (C = L when unchunked):

- weights:  parameters x bytes of their dtype (fp32 masters, also under bf16 autocast);
- casts:    under autocast (compute bytes < weight bytes), one more copy of the weights in
            the compute dtype: autocast's cached casts during the prefill and eager
            decoding, or, where `eval.cuda_decoding` records a graph, the graph's
            (model/inference/graph.py `WeightCasts`, made after autocast's cache is cleared);
- prompts:  tests x L x 8 (the int64 prompts of one length are built at once);
- KV cache: 2 x layers x B x (L + n) x kv_heads x head_dim x bytes of the compute dtype;
- chunk:    B x C x (6 d_model + 3 d_ff + (heads + 2 kv_heads) head_dim) x bytes (one
            block's hidden states, q/k/v, SwiGLU's three d_ff tensors) + the attention
            scores of the dense kernels, B x heads x C x L x 4 (fp32 softmax; CPU kernels,
            and sdpa on CUDA; none under flash) + the boolean mask B x C x L + the last
            logits B x vocab x 4.

It is an estimate for refusing the impossible, not a measurement: a length it lets through
can still be slow, and the dense score term is what chunking (`eval.niah.prefill_chunk_tokens`)
bounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from longctx.config.model import ModelConfig
from longctx.errors import LongctxError

GIB = 1024**3
MEMINFO = Path("/proc/meminfo")


class EvaluationMemoryError(LongctxError, MemoryError):
    """The requested evaluation needs more memory than the device offers."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes of each term of the module docstring."""

    weights: int
    weight_casts: int
    prompts: int
    kv_cache: int
    chunk_activations: int
    attention_scores: int
    logits: int

    @property
    def total(self) -> int:
        """The sum of every term."""
        return sum(vars(self).values())

    def describe(self) -> str:
        terms = ", ".join(f"{name.replace('_', ' ')} {value / GIB:.2f}" for name, value in vars(self).items())
        return f"{self.total / GIB:.2f} GiB ({terms} GiB)"


def estimate_evaluation_memory(
    config: ModelConfig,
    length: int,
    *,
    rows: int,
    tests: int,
    new_tokens: int,
    prefill_chunk_tokens: int = 0,
    weight_bytes: int = 4,
    compute_bytes: int = 4,
    dense_attention: bool = True,
) -> MemoryEstimate:
    """The terms of the module docstring for prompts of `length` tokens, `rows` per forward."""
    chunk = min(prefill_chunk_tokens or length, length)
    tokens = rows * chunk
    width = 6 * config.d_model + 3 * config.d_ff + (config.n_heads + 2 * config.n_kv_heads) * config.head_size
    width += {"elementwise": config.n_heads * config.head_size, "head": config.n_heads}.get(config.attention_gate, 0)
    kv = 2 * config.n_layers * rows * (length + new_tokens) * config.n_kv_heads * config.head_size * compute_bytes
    scores = rows * config.n_heads * chunk * length * 4 + rows * chunk * length if dense_attention else 0
    return MemoryEstimate(
        weights=config.num_parameters() * weight_bytes,
        weight_casts=config.num_parameters() * compute_bytes if compute_bytes < weight_bytes else 0,
        prompts=tests * length * 8,
        kv_cache=kv,
        chunk_activations=tokens * width * compute_bytes,
        attention_scores=scores,
        logits=rows * config.vocab_size * 4,
    )


def available_memory(device: torch.device) -> tuple[int, str]:
    """(free bytes, where the number comes from) on `device`."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free, f"free memory of {torch.cuda.get_device_name(device)} (torch.cuda.mem_get_info)"
    if MEMINFO.is_file():
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, f"MemAvailable of {MEMINFO}"
    import psutil

    return psutil.virtual_memory().available, "available RAM (psutil)"


def check_evaluation_memory(
    estimate: MemoryEstimate, available: int, source: str, *, length: int, weights_resident: bool = True
) -> None:
    """Raise EvaluationMemoryError naming the length, the estimate's terms and the limit
    when `estimate` exceeds `available` (+ the weights when they are already loaded)."""
    limit = available + (estimate.weights if weights_resident else 0)
    if estimate.total > limit:
        raise EvaluationMemoryError(
            f"length {length:,} needs an estimated {estimate.describe()}, more than the {limit / GIB:.2f} GiB "
            f"available ({source}{' + the loaded weights' if weights_resident else ''}); evaluate shorter lengths "
            "(eval.niah.lengths / max_length), fewer rows per forward (eval.niah.batch_tokens), smaller prefill "
            "chunks (eval.niah.prefill_chunk_tokens) or fewer tests"
        )
