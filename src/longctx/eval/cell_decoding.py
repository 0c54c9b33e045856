"""A cell's batches decoded and scored, each batch's records appended to this rank's file
as soon as the batch is done (eval/cells.py runs the cell; eval/cell_records.py names the
files).

A batch is a fixed block of the cell's sample indices, decoded whole even when a kill left
some of its samples with records already: a sample's batch-mates and padding, and so its
output, are those of an uninterrupted run on any number of ranks. Only the samples without
a record are written.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from longctx.config.position_methods import PositionMethodConfig
from longctx.eval.model_setup import check_memory, evaluating, position_method
from longctx.eval.prompt_frame import TextTokenizer
from longctx.eval.task import Sample, Task
from longctx.model.inference.generation import Generation, generate
from longctx.model.llama import Llama
from longctx.model.position_methods import PositionMethod


class Batching(Protocol):
    """What decoding reads of eval/cells.py's `Decoding`."""

    prefill_chunk_tokens: int
    attention_backend: str | None
    cuda_decoding: str
    memory_limit_gib: float


class Advancing(Protocol):
    def advance(self, samples: int) -> None: ...


def _decode(
    model: Llama,
    batch: list[Sample],
    method: PositionMethod | None,
    decoding: Batching,
    decode: Callable[[list[int]], str],
    rows: int,
) -> list[Generation]:
    """Generations of samples that share max_new_tokens and stop rule, in order."""
    groups: dict[tuple, list[int]] = {}
    for position, sample in enumerate(batch):
        groups.setdefault((sample.max_new_tokens, sample.stop), []).append(position)
    outputs: list[Any] = [None] * len(batch)
    for (max_new_tokens, stop), positions in groups.items():
        generations = generate(
            model,
            [batch[p].prompt_ids for p in positions],
            max_new_tokens=max_new_tokens,
            stop=stop,
            decode=decode,
            position_method=method,
            batch_size=rows,
            prefill_chunk_tokens=decoding.prefill_chunk_tokens,
            attention_backend=decoding.attention_backend,
            cuda_decoding=decoding.cuda_decoding,
        )
        for position, generation in zip(positions, generations, strict=True):
            outputs[position] = generation
    return outputs


def decode_batches(
    model: Llama,
    method_config: PositionMethodConfig,
    task: Task,
    tokenizer: TextTokenizer,
    batches: list[list[Sample]],
    decoding: Batching,
    stored: dict[int, dict[str, Any]],
    path: Path | None,
    progress: Advancing | None,
) -> dict[int, dict[str, Any]]:
    """Decode `batches` (module docstring), appending to `path` the records of samples not in
    `stored`; returns those records by index. The memory check covers the longest prompt.
    `path` None: a rank that holds a shard of a model decodes with its replica's writer
    (every forward a collective) and keeps nothing."""
    samples = [sample for batch in batches for sample in batch]
    rows = max(len(batch) for batch in batches)
    check_memory(
        model,
        max(len(s.prompt_ids) for s in samples),
        rows=rows,
        tests=len(samples),
        new_tokens=max(s.max_new_tokens for s in samples),
        prefill_chunk_tokens=decoding.prefill_chunk_tokens,
        limit_gib=decoding.memory_limit_gib,
    )
    method = position_method(method_config, model)
    decoded: dict[int, dict[str, Any]] = {}
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    with evaluating(model), path.open("a") if path is not None else contextlib.nullcontext() as out:
        for batch in batches:
            start = time.perf_counter()
            generations = _decode(model, batch, method, decoding, tokenizer.decode, rows)
            seconds = (time.perf_counter() - start) / len(batch)
            fresh = 0
            for sample, generation in zip(batch, generations, strict=True):
                if sample.index in stored:
                    continue
                record = {
                    "index": sample.index,
                    "prompt_hash": sample.prompt_hash,
                    "prompt_tokens": len(sample.prompt_ids),
                    "score": float(task.score(sample, generation)),
                    "text": generation.text,
                    "stopped_by": generation.stopped_by,
                    "new_tokens": len(generation.token_ids),
                    "seconds": seconds,
                    **task.details(sample, generation),
                }
                fresh += 1
                if out is not None:
                    decoded[sample.index] = record
                    out.write(json.dumps(record) + "\n")
            if out is not None:
                out.flush()
            if progress is not None:
                progress.advance(fresh)
    return decoded
