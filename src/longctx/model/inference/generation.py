"""Greedy generation for real prompts: any lengths in one batch, per-row stop rules.

    from longctx.model.inference.generation import Generation, StopRule, generate
    outputs = generate(model, [ids_a, ids_b], max_new_tokens=64,
                       stop=StopRule(eos_ids=frozenset({2}), stop_strings=("\\n\\n",)), decode=tokenizer.decode)
    outputs[0].text, outputs[0].token_ids, outputs[0].stopped_by      # in input order

Every benchmark of the evaluation engine (NIAH, RULER, InfiniteBench, lm-eval) decodes
through `generate`: prompts of different lengths, greedy argmax, and a stop per row on the
model's end-of-sequence ids or on stop strings, within `max_new_tokens`.

Batching: left padding, as one KV cache serves a batch whose rows all advance by one token
per decoding step. A row of n prompt tokens in a batch of width T is

    ids        pad ... pad | x_0  x_1  ... x_{n-1}      (T - n pads, then the prompt)
    documents    0 ...  0  |  1    1   ...   1
    positions    0 ... T-n-1 | 0    1   ...  n-1

The padding is a document of its own, so the model's document mask (the attention mask of
the batch contract, docs/design.md §3) keeps every prompt token and every generated token
from seeing it, and the position ids give each row its true positions 0..n-1: the RoPE
indices and the relative distances that StRing, ReRoPE, Self-Extend, DCA, NTK and YaRN
rewrite (they measure distances inside a document) are those of the prompt alone.
Generated tokens continue the row's last document at position n, n+1, ... Packed rows
(several prompts end to end in one row) would waste no padding, but a cached decoding step
appends one token to the end of a row, which only the row's last document can own. Prompts
are sorted by length before they are cut into batches of `batch_size`, so a batch pads
little; results come back in input order.

Stops: a row stops when it emits one of `StopRule.eos_ids` (the token is left out of the
output) or when its decoded continuation contains one of `StopRule.stop_strings` (the
tokens up to the one that completed the string are kept, as Hugging Face `generate` keeps
them; `Generation.text` is cut before the string). Decoding stops when every row of the
batch has stopped. Stop strings need `decode`.

Decoding steps run eagerly unless `cuda_decoding` (`eval.cuda_decoding`) opts in to the
Triton decoding kernel (`kernel`), to steps recorded as a CUDA graph and replayed
(`graph`), or to both; on CPU every mode decodes eagerly with torch's kernels. The mode is
decided once per call for the model (model/inference/graph.py `decoding_mode`): a model with
sharded parameters (FSDP, the in-training NIAH probe's) is never recorded.

The prefill runs in chunks of `prefill_chunk_tokens` columns (0 = the whole width at
once; `longctx.model.inference.prefill.prefill`): chunk c attends the cached keys of chunks
0..c-1 and causally itself, so the logits do not depend on the chunk size.

A `longrope` model (Phi-3; model/rope.py) rotates a forward by its long factors iff the
batch's largest position + 1 exceeds L_orig, so cached keys written below L_orig carry the
short rotation. transformers' Phi-3 `generate` (`prepare_inputs_for_generation`) drops its
cache when the sequence first reaches L_orig + 1 tokens and re-runs it whole, long; so does
this decoder (a prefill of the tokens so far at that step): the cached continuation then
equals a full forward at every step, as in transformers. A chunked prefill of a prompt past
L_orig rotates every chunk long (`rope.longrope_forced`), as one forward over it would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch

from longctx.model.inference.graph import DecodeGraph, DecodingMode, decoding_mode
from longctx.model.inference.prefill import prefill
from longctx.model.llama import Llama
from longctx.model.position_methods import PositionMethod
from longctx.model.rope import longrope_forced

STOPPED_BY = ("eos", "stop_string", "length")
PADDING_DOCUMENT, PROMPT_DOCUMENT = 0, 1
LogitsObserver = Callable[[int, torch.Tensor], None]
_observers: list[LogitsObserver] = []


@contextmanager
def observe_logits(observer: LogitsObserver) -> Iterator[None]:
    """Within the block, `observer(step, logits)` sees the next-token logits [rows, vocab] of
    every step `generate` decodes, batch after batch (step 0: the prefill's last column; step
    s: after s generated tokens), before the argmax picks the tokens. For checks that compare
    two ways of decoding by more than their tokens: an untrained model's argmax says little,
    its logits say how far apart the two are (benchmarks/main_job_gpu.py: a CUDA graph and
    the decoding kernel against eager). The tensor may be a recorded graph's output buffer,
    which the next step overwrites: copy what you keep. Without an observer nothing is called."""
    _observers.append(observer)
    try:
        yield
    finally:
        _observers.remove(observer)


def _next_tokens(logits: torch.Tensor, step: int) -> torch.Tensor:
    """The greedy tokens [rows] of a forward's last column, shown to the observers first."""
    last = logits[:, -1]
    for observer in _observers:
        observer(step, last)
    return last.argmax(-1)


@dataclass(frozen=True)
class StopRule:
    """When a row stops before `max_new_tokens`."""

    eos_ids: frozenset[int] = frozenset()
    """Token ids that end a row (the model's EOS ids); the stop token is not in the output."""
    stop_strings: tuple[str, ...] = ()
    """A row ends when its decoded continuation contains one; the text is cut before it."""


@dataclass
class Generation:
    """One prompt's continuation."""

    token_ids: list[int]
    """Generated tokens, an EOS stop token excluded."""
    text: str | None
    """Decoded continuation cut before the first stop string (None when no `decode` was given)."""
    stopped_by: str
    """eos | stop_string | length."""


def _first_stop(text: str, stop_strings: Sequence[str]) -> int:
    """Character index of the earliest stop string in `text`; -1 when none occurs."""
    found = [index for index in (text.find(s) for s in stop_strings) if index >= 0]
    return min(found) if found else -1


def _padded_batch(prompts: Sequence[Sequence[int]], device: torch.device) -> tuple[torch.Tensor, ...]:
    """input_ids, position_ids, document_ids [B, T] of left-padded rows (module docstring)."""
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    documents = torch.full((len(prompts), width), PROMPT_DOCUMENT, dtype=torch.long)
    positions = torch.empty(len(prompts), width, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        pad = width - len(prompt)
        ids[row, pad:] = torch.as_tensor(list(prompt), dtype=torch.long)
        documents[row, :pad] = PADDING_DOCUMENT
        positions[row, :pad] = torch.arange(pad)
        positions[row, pad:] = torch.arange(len(prompt))
    return ids.to(device), positions.to(device), documents.to(device)


@torch.no_grad()
def _generate_batch(
    model: Llama,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    stop: StopRule,
    decode: Callable[[list[int]], str] | None,
    position_method: PositionMethod | None,
    prefill_chunk_tokens: int,
    attention_backend: str | None,
    mode: DecodingMode,
) -> list[Generation]:
    device = model.tok_embeddings.weight.device
    ids, positions, documents = _padded_batch(prompts, device)
    rows, width = ids.shape
    switch = _longrope_switch(model)
    cache = model.new_kv_cache(rows, width + max_new_tokens, decode_kernel=mode.kernel)
    options = dict(kv_cache=cache, attention_backend=attention_backend, position_method=position_method)
    with longrope_forced(model, True) if switch is not None and width > switch else nullcontext():
        logits = prefill(model, ids, positions, documents, prefill_chunk_tokens, options)
    # Steps recorded once and replayed as a CUDA graph on a GPU (eager on CPU) where the
    # mode says so (model/inference/graph.py `decoding_mode`)
    graph = DecodeGraph(model, cache, position_method, attention_backend=attention_backend) if mode.graph else None
    tokens: list[list[int]] = [[] for _ in range(rows)]
    stopped_by: list[str | None] = [None] * rows
    # Pipelined: step t+1 is queued before the host reads step t's tokens, so the device
    # decodes while the host applies the stop rules (the read waits only for step t's
    # argmax); when every row has stopped, the one queued step is wasted. A longrope model
    # decides its re-run from the tokens, so it reads them first.
    pipelined = switch is None
    next_tokens = _next_tokens(logits, 0)
    for step in range(max_new_tokens):
        last = step + 1 == max_new_tokens
        if pipelined and not last:
            logits = graph.step(next_tokens[:, None]) if graph else model(next_tokens[:, None], **options)
        for row, token in enumerate(next_tokens.tolist()):
            if stopped_by[row] is not None:
                continue
            if token in stop.eos_ids:
                stopped_by[row] = "eos"
                continue
            tokens[row].append(token)
            if stop.stop_strings and decode is not None and _first_stop(decode(tokens[row]), stop.stop_strings) >= 0:
                stopped_by[row] = "stop_string"
        if last or all(reason is not None for reason in stopped_by):
            break
        if switch is not None:  # not pipelined: grow the sequence, re-run it at the switch
            ids = torch.cat([ids, next_tokens[:, None]], dim=1)
            positions = torch.cat([positions, positions[:, -1:] + 1], dim=1)
            documents = torch.cat([documents, documents[:, -1:]], dim=1)
            if ids.shape[1] == switch + 1 and width <= switch:  # module docstring
                options["kv_cache"] = model.new_kv_cache(rows, width + max_new_tokens, decode_kernel=mode.kernel)
                with longrope_forced(model, True):
                    logits = prefill(model, ids, positions, documents, prefill_chunk_tokens, options)
            else:
                logits = model(next_tokens[:, None], **options)
        next_tokens = _next_tokens(logits, step + 1)
    generations = []
    for row_tokens, reason in zip(tokens, stopped_by, strict=True):
        text = None
        if decode is not None:
            text = decode(row_tokens)
            cut = _first_stop(text, stop.stop_strings)
            text = text if cut < 0 else text[:cut]
        generations.append(Generation(row_tokens, text, reason or "length"))
    return generations


def _longrope_switch(model: Llama) -> int | None:
    """L_orig of a longrope model (the largest position + 1 up to which it rotates short), else None."""
    scaling = model.config.rope_scaling
    if scaling.type != "longrope":
        return None
    return scaling.original_max_position or model.config.max_position


def generate(
    model: Llama,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    stop: StopRule = StopRule(),
    decode: Callable[[list[int]], str] | None = None,
    position_method: PositionMethod | None = None,
    batch_size: int = 8,
    prefill_chunk_tokens: int = 0,
    attention_backend: str | None = None,
    cuda_decoding: str = "eager",
) -> list[Generation]:
    """Greedy continuations of `prompts` (token id lists of any lengths), in input order.

    Rows go `batch_size` at a time, left-padded (module docstring); `position_method`
    (StRing, a baseline; None = the model's RoPE) sees each row's true positions;
    `prefill_chunk_tokens`: prompt columns per prefill forward (0 = all at once);
    `attention_backend`: None = the model's configured backend; `cuda_decoding`: how the
    decoding steps run on CUDA, eager | kernel | graph | graph+kernel (`eval.cuda_decoding`,
    decided for this model by model/inference/graph.py `decoding_mode`)."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if prefill_chunk_tokens < 0:
        raise ValueError(f"prefill_chunk_tokens must be >= 0, got {prefill_chunk_tokens}")
    if stop.stop_strings and decode is None:
        raise ValueError(f"stop strings {stop.stop_strings} need a `decode` function")
    empty = [index for index, prompt in enumerate(prompts) if len(prompt) == 0]
    if empty:
        raise ValueError(f"prompts {empty[:5]} are empty; every prompt needs at least one token")
    mode = decoding_mode(cuda_decoding, model, position_method)
    order = sorted(range(len(prompts)), key=lambda index: len(prompts[index]))
    results: list[Generation | None] = [None] * len(prompts)
    for first in range(0, len(order), batch_size):
        indices = order[first : first + batch_size]
        batch = _generate_batch(
            model,
            [prompts[i] for i in indices],
            max_new_tokens,
            stop,
            decode,
            position_method,
            prefill_chunk_tokens,
            attention_backend,
            mode,
        )
        for index, generation in zip(indices, batch, strict=True):
            results[index] = generation
    return [generation for generation in results if generation is not None]
