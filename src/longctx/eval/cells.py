"""An evaluation as a grid of cells that are written as they finish and resume after a kill.

    grid = Grid(models={"smollm2": model}, methods={"rope": rope, "string-repo": repo},
                tasks=[NiahTask(...)], lengths=[2048, 8192], seed=0, count=50)
    results = run_grid(grid, tokenizer, "runs/table/cells", Decoding(prefill_chunk_tokens=2048))

A cell is (model, position method, task, context length): `count` samples drawn by the task
(eval/task.py) from (seed, task, length, index) before anything is decoded, each decoded
greedily by `eval.generation.generate` and scored. Its directory
`<root>/<model>/<method>/<task>/L<length>/` holds

- `cell.json`     what fixes its results (the `CellSpec`): model fingerprint, method
                  settings, task settings, length, seed; written when the cell starts;
- `samples.jsonl` one record per finished sample (index, prompt hash, score, output text,
                  stop reason, the task's details), appended batch by batch as decoded;
- `summary.json`  written when the cell has its `count` records: mean score, count, and for
                  pass/fail scores the passes and their Wilson 95% interval.

A rerun skips a cell whose summary covers `count` samples; a killed run resumes a cell from
its records (decoding only the samples without one, the same samples since they depend on
(seed, task, length, index) only: a record whose prompt hash differs is refused, as is a
`cell.json` with other settings: delete the cell's directory to redo it). More samples than
before extend a cell; fewer use its first `count` records. A torn last line (a kill during
the write) is dropped. Tables are assembled from the `CellResult`s (eval/niah/table.py).

Device, precision (bf16 autocast on CUDA, the fp32 weights on CPU), position method and
memory check: eval/model_setup.py, before decoding; a cell whose longest prompt, KV cache and
prefill chunk cannot fit the device is refused with its limit named (eval/memory_estimate.py).
The effective-length search (eval/effective_length.py) runs one cell per length.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from torch.distributed.tensor import DTensor

from longctx.config.position_methods import PositionMethodConfig
from longctx.errors import LongctxError
from longctx.eval.generation import generate
from longctx.eval.model_setup import check_memory, evaluating, position_method
from longctx.eval.prompt_frame import TextTokenizer
from longctx.eval.stats import wilson_interval
from longctx.eval.task import Sample, Task
from longctx.model.llama import Llama
from longctx.model.position_methods import PositionMethod

SAMPLES_FILE, SUMMARY_FILE, SPEC_FILE = "samples.jsonl", "summary.json", "cell.json"


class CellMismatchError(LongctxError):
    """A cell on disk was written under other settings or for other samples."""


class Progress(Protocol):
    """What the grid reports while it runs (eval/cell_progress.py's `CellProgress` shows it)."""

    def cell_started(self, cell: Cell, total: int, done: int) -> None: ...

    def advance(self, samples: int) -> None: ...

    def cell_done(self, result: CellResult, reused: bool) -> None: ...


@dataclass(frozen=True)
class Cell:
    """One point of the grid."""

    model: str
    method: str
    task: str
    length: int

    @property
    def name(self) -> str:
        return f"{self.model} {self.method} {self.task} L={self.length}"

    def directory(self, root: str | Path) -> Path:
        return Path(root) / self.model / self.method / self.task / f"L{self.length}"


@dataclass
class CellResult:
    """A finished cell: its per-sample records (index order) and summary."""

    cell: Cell
    records: list[dict[str, Any]]
    summary: dict[str, Any]


@dataclass
class Decoding:
    """How a cell's samples are batched and decoded."""

    batch_tokens: int = 8192
    """Most prompt tokens per forward (rows = batch_tokens // longest prompt, >= 1)."""
    batch_size: int = 64
    """Most rows per forward."""
    prefill_chunk_tokens: int = 0
    """Prompt tokens per row per prefill forward (0 = the whole prompt)."""
    attention_backend: str | None = None
    """None = the model's configured backend."""
    cuda_decoding: str = "eager"
    """eager | kernel | graph | graph+kernel: how decoding steps run on CUDA (`eval.cuda_decoding`)."""

    def rows(self, longest_prompt: int) -> int:
        return max(1, min(self.batch_size, self.batch_tokens // longest_prompt))


@dataclass
class Grid:
    """models x methods x tasks x lengths; `lengths` None = each model's training length."""

    models: dict[str, Llama]
    methods: dict[str, PositionMethodConfig]
    tasks: list[Task]
    lengths: list[int] | None
    seed: int
    count: int

    def cells(self) -> list[tuple[Cell, Llama, PositionMethodConfig, Task]]:
        """Every cell, model by model, method by method, task by task, shortest length first."""
        return [
            (Cell(model_name, method_name, task.name, length), model, method, task)
            for model_name, model in self.models.items()
            for method_name, method in self.methods.items()
            for task in self.tasks
            for length in sorted(set(self.lengths or [model.config.max_position]))
        ]


def model_fingerprint(model: Llama) -> str:
    """sha1 over the model config and the first 64 values of every parameter: tells two
    checkpoints under one name apart without reading all weights.

    The values are those of the whole tensor, however it is sharded: an FSDP2 parameter (a
    DTensor) is gathered first, so every rank of a sharded model, and one process holding
    the same weights, get one fingerprint. The gather is a collective: every rank calls
    this, in the same order (every rank runs the cell)."""
    digest = hashlib.sha1(repr(model.config).encode())
    for name, parameter in model.state_dict().items():
        if isinstance(parameter, DTensor):
            parameter = parameter.full_tensor()
        digest.update(name.encode())
        digest.update(parameter.detach().flatten()[:64].float().cpu().numpy().tobytes())
    return digest.hexdigest()


def cell_spec(cell: Cell, model: Llama, method: PositionMethodConfig, task: Task, seed: int) -> dict[str, Any]:
    """What fixes a cell's results (its `cell.json`)."""
    return {
        **dataclasses.asdict(cell),
        "model_fingerprint": model_fingerprint(model),
        "method_settings": method.settings(model.config.max_position),
        "task_settings": task.settings(),
        "seed": seed,
    }


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean score and count; passes and their Wilson 95% interval when every score is 0 or 1."""
    scores = [record["score"] for record in records]
    summary: dict[str, Any] = {"count": len(scores), "score": sum(scores) / len(scores) if scores else 0.0}
    if all(score in (0.0, 1.0) for score in scores):
        passed = int(sum(scores))
        summary.update(passed=passed, wilson=list(wilson_interval(passed, len(scores))))
    summary["seconds"] = sum(record.get("seconds", 0.0) for record in records)
    return summary


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a samples.jsonl; a torn last line is dropped from the file too."""
    if not path.exists():
        return []
    lines = path.read_text().splitlines(keepends=True)
    records = []
    for number, line in enumerate(lines):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number != len(lines) - 1:
                raise CellMismatchError(f"{path}:{number + 1}: not a JSON record") from None
            path.write_text("".join(lines[:number]))
    return records


def _check_spec(directory: Path, spec: dict[str, Any]) -> None:
    path = directory / SPEC_FILE
    if path.exists():
        stored = json.loads(path.read_text())
        if stored != json.loads(json.dumps(spec)):
            changed = sorted(
                key for key in {*stored, *spec} if stored.get(key) != json.loads(json.dumps(spec.get(key)))
            )
            raise CellMismatchError(
                f"{path} was written under other settings ({', '.join(changed)} differ); "
                f"delete {directory} to evaluate it again"
            )
    else:
        directory.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(spec, indent=1) + "\n")


def _decode(
    model: Llama,
    batch: list[Sample],
    method: PositionMethod | None,
    decoding: Decoding,
    decode: Callable[[list[int]], str],
    rows: int,
):
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


def run_cell(
    cell: Cell,
    model: Llama,
    method_config: PositionMethodConfig,
    task: Task,
    tokenizer: TextTokenizer,
    *,
    seed: int,
    count: int,
    root: str | Path,
    decoding: Decoding,
    progress: Progress | None = None,
) -> CellResult:
    """Evaluate one cell, or finish or reuse it from `root` (module docstring)."""
    if count < 1:
        raise ValueError(f"a cell needs count >= 1 samples, got {count}")
    directory = cell.directory(root)
    _check_spec(directory, cell_spec(cell, model, method_config, task, seed))
    summary_path, records_path = directory / SUMMARY_FILE, directory / SAMPLES_FILE
    records = {record["index"]: record for record in read_records(records_path)}
    if summary_path.exists() and all(index in records for index in range(count)):
        kept = [records[index] for index in range(count)]
        summary = json.loads(summary_path.read_text())
        if summary.get("count") != count:
            summary = {**summarize(kept), "cell": dataclasses.asdict(cell)}
        result = CellResult(cell, kept, summary)
        if progress is not None:
            progress.cell_done(result, reused=True)
        return result
    samples = task.samples(seed, cell.length, count, tokenizer)
    for sample in samples:
        stored = records.get(sample.index)
        if stored is not None and stored["prompt_hash"] != sample.prompt_hash:
            raise CellMismatchError(
                f"{records_path}: sample {sample.index} was decoded from another prompt; "
                f"delete {directory} to evaluate it again"
            )
    pending = [sample for sample in samples if sample.index not in records]
    if progress is not None:
        progress.cell_started(cell, total=count, done=count - len(pending))
    if pending:
        _run_pending(model, method_config, task, tokenizer, pending, decoding, records, records_path, progress)
    kept = [records[index] for index in range(count)]
    summary = {**summarize(kept), "cell": dataclasses.asdict(cell)}
    summary_path.write_text(json.dumps(summary, indent=1) + "\n")
    result = CellResult(cell, kept, summary)
    if progress is not None:
        progress.cell_done(result, reused=False)
    return result


def _run_pending(model, method_config, task, tokenizer, pending, decoding, records, records_path, progress) -> None:
    """Decode `pending` samples batch by batch, appending each batch's records at once."""
    longest = max(len(s.prompt_ids) for s in pending)
    rows = decoding.rows(longest)
    new_tokens = max(s.max_new_tokens for s in pending)
    prefill_chunk = decoding.prefill_chunk_tokens
    check_memory(
        model, longest, rows=rows, tests=len(pending), new_tokens=new_tokens, prefill_chunk_tokens=prefill_chunk
    )
    method = position_method(method_config, model)
    with evaluating(model), records_path.open("a") as out:
        for first in range(0, len(pending), rows):
            batch = pending[first : first + rows]
            start = time.perf_counter()
            generations = _decode(model, batch, method, decoding, tokenizer.decode, rows)
            seconds = (time.perf_counter() - start) / len(batch)
            for sample, generation in zip(batch, generations, strict=True):
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
                records[sample.index] = record
                out.write(json.dumps(record) + "\n")
            out.flush()
            if progress is not None:
                progress.advance(len(batch))


def run_grid(
    grid: Grid,
    tokenizer: TextTokenizer,
    root: str | Path,
    decoding: Decoding,
    progress: Progress | None = None,
    on_error: Callable[[Cell, Exception], bool] | None = None,
) -> list[CellResult]:
    """Every cell of `grid` (run, resumed or reused), in `Grid.cells` order. `on_error(cell,
    error)`: True = leave that cell out and go on (NIAH: a length below a task's prompt
    overhead); without it, or when it returns False, the error propagates."""
    results = []
    for cell, model, method, task in grid.cells():
        method.resolved(model.config.max_position, f"eval.arms.{cell.method}")
        try:
            results.append(
                run_cell(
                    cell,
                    model,
                    method,
                    task,
                    tokenizer,
                    seed=grid.seed,
                    count=grid.count,
                    root=root,
                    decoding=decoding,
                    progress=progress,
                )
            )
        except Exception as error:
            if on_error is None or not on_error(cell, error):
                raise
    return results
