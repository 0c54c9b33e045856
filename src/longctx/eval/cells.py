"""An evaluation as a grid of cells that are written as they finish and resume after a kill.

    grid = Grid(models={"smollm2": model}, methods={"rope": rope, "string-repo": repo},
                tasks=[NiahTask(...)], lengths=[2048, 8192], seed=0, count=50)
    results = run_grid(grid, tokenizer, "runs/table/cells", Decoding(prefill_chunk_tokens=2048))

A cell is (model, position method, task, context length): `count` samples drawn by the task
(eval/task.py) from (seed, task, length, index) before anything is decoded, each decoded
greedily by `model.inference.generation.generate` and scored. Its directory
`<root>/<model>/<method>/<task>/L<length>/` holds

- `cell.json`     what fixes its results (the `CellSpec`): model fingerprint, method
                  settings, task settings, length, seed; written when the cell starts;
- `samples.jsonl` one record per finished sample (index, prompt hash, score, output text,
                  stop reason, the task's details), appended batch by batch as decoded
                  (under torchrun each rank appends to its own `samples.rank<r>.jsonl`,
                  merged into samples.jsonl when the cell finishes: eval/cell_records.py);
- `batches.json`  how many rows a batch holds: the samples are decoded in fixed blocks of
                  consecutive indices (`batch_rows`), so a sample's batch-mates do not depend on
                  what was pending or on how many ranks ran;
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

Under torchrun the grid's cells and a cell's batches are dealt to the ranks by
eval/ranks.py's rule; the records, summaries and tables are those of one process.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from torch.distributed.tensor import DTensor

from longctx.config import ExperimentConfig, NiahConfig
from longctx.config.position_methods import PositionMethodConfig
from longctx.eval.cell_decoding import decode_batches
from longctx.eval.cell_records import CellMismatchError, merge_records, read_cell, read_records, records_file
from longctx.eval.errors import PromptTooShortError
from longctx.eval.prompt_frame import TextTokenizer
from longctx.eval.ranks import Ranks, check_same_models, check_shared_directory, share, whole_cells
from longctx.eval.stats import wilson_interval
from longctx.eval.task import Sample, Task
from longctx.model.llama import Llama

SUMMARY_FILE, SPEC_FILE, BATCHES_FILE = "summary.json", "cell.json", "batches.json"


class Progress(Protocol):
    """What the grid reports while it runs (eval/cell_progress.py's `CellProgress` shows it;
    `run_grid` also calls its `grid_started(samples, layout)` where it has one)."""

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
    decoded: int = 0
    """How many of its samples this run decoded (0: reused from an earlier run)."""


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
    memory_limit_gib: float = 0.0
    """eval.memory_limit_gib: what one rank's device may use (0: its free memory)."""
    cuda_decoding: str = "eager"
    """eager | kernel | graph | graph+kernel: how decoding steps run on CUDA (`eval.cuda_decoding`)."""

    def rows(self, longest_prompt: int) -> int:
        return max(1, min(self.batch_size, self.batch_tokens // longest_prompt))

    @classmethod
    def of(
        cls, config: ExperimentConfig, niah: NiahConfig | None = None, attention_backend: str | None = None
    ) -> Decoding:
        """The decoding of `config`'s evaluation: the batch and prefill chunk sizes of `niah`
        (default eval.niah, which every benchmark decodes under), eval's memory limit and CUDA
        decoding."""
        niah = niah or config.eval.niah
        return cls(
            batch_tokens=niah.batch_tokens,
            prefill_chunk_tokens=niah.prefill_chunk_tokens,
            attention_backend=attention_backend,
            memory_limit_gib=config.eval.memory_limit_gib,
            cuda_decoding=config.eval.cuda_decoding,
        )


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


def _check_batches(directory: Path, rows: int) -> None:
    """Refuse to resume a cell whose records were decoded in batches of another size: a
    sample's batch-mates and padding, and so its output, would differ from theirs."""
    path = directory / BATCHES_FILE
    if not path.exists():
        path.write_text(json.dumps({"rows": rows}) + "\n")
        return
    stored = json.loads(path.read_text())["rows"]
    if stored != rows:
        raise CellMismatchError(
            f"{path}: the cell's samples were decoded in batches of {stored} rows and this run would batch "
            f"{rows} (eval.niah.batch_tokens or the batch size changed); set them back to resume, or delete "
            f"{directory} to evaluate it again"
        )


def batch_rows(samples: list[Sample], decoding: Decoding, length: int) -> int:
    """Rows per batch of a cell: as many as the cell's length allows (a longer prompt: its
    length). The batches are fixed blocks of that many consecutive indices, so they depend
    on the cell and the decoding settings only, never on which samples are pending or on how
    many ranks run."""
    return decoding.rows(max(length, *(len(sample.prompt_ids) for sample in samples)))


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
    ranks: Ranks | None = None,
    alone: bool = False,
) -> CellResult:
    """Evaluate one cell, or finish or reuse it from `root` (module docstring). `ranks`
    (eval/ranks.py; None: this process alone) call it together and share the cell's pending
    batches, rank 0 merging their records; `alone`: this rank of `ranks` runs the whole cell
    by itself. A caller whose ranks must all run the same forwards (a model sharded by FSDP
    in training) leaves `ranks` None on every rank."""
    if count < 1:
        raise ValueError(f"a cell needs count >= 1 samples, got {count}")
    ranks = Ranks() if ranks is None else ranks
    team = ranks.replica() if alone else ranks
    directory = cell.directory(root)
    own = records_file(directory, ranks) if ranks.writer else None
    records = _opened(directory, cell_spec(cell, model, method_config, task, seed), own, team)
    summary_path = directory / SUMMARY_FILE
    if summary_path.exists() and all(index in records for index in range(count)):
        return _reused(cell, records, count, summary_path, team, progress)
    samples = task.samples(seed, cell.length, count, tokenizer)
    for sample in samples:
        stored = records.get(sample.index)
        if stored is not None and stored["prompt_hash"] != sample.prompt_hash:
            raise CellMismatchError(
                f"{directory / 'samples*.jsonl'}: sample {sample.index} was decoded from another prompt; "
                f"delete {directory} to evaluate it again"
            )
    rows = batch_rows(samples, decoding, cell.length)
    blocks = [samples[first : first + rows] for first in range(0, count, rows)]
    pending = [block for block in blocks if any(sample.index not in records for sample in block)]
    if progress is not None:
        progress.cell_started(cell, total=count, done=sum(index in records for index in range(count)))
    team.barrier()  # every rank has read the records before any rank appends to its file
    error: Exception | None = None
    decoded: dict[int, dict[str, Any]] = {}
    try:
        if team.lead:
            _check_batches(directory, rows)
        mine = share(pending, team)
        if mine:
            decoded = decode_batches(model, method_config, task, tokenizer, mine, decoding, records, own, progress)
    except Exception as failed:  # every rank stops with it, the failing rank named
        error = failed
    team.settle(error)
    fresh = _gathered_records(decoded, records, team, progress)
    kept = [records[index] for index in range(count)]
    summary = {**summarize(kept), "cell": dataclasses.asdict(cell)}
    if team.lead:
        merge_records(directory, records)
        summary_path.write_text(json.dumps(summary, indent=1) + "\n")
    result = CellResult(cell, kept, summary, decoded=sum(index < count for index in fresh))
    if progress is not None:
        progress.cell_done(result, reused=False)
    return result


def _opened(directory: Path, spec: dict[str, Any], own: Path | None, team: Ranks) -> dict[int, dict[str, Any]]:
    """The cell's records, read by every rank of `team` once its `cell.json` is checked (by
    its lead) and each writer has cut its own file's torn last line: no rank writes the
    cell until every rank has read it."""
    error: Exception | None = None
    try:
        if own is not None:
            read_records(own)
        if team.lead:
            _check_spec(directory, spec)
    except CellMismatchError as failed:
        error = failed
    team.settle(error)
    return read_cell(directory)


def _gathered_records(decoded, records, team: Ranks, progress: Progress | None) -> set[int]:
    """Every rank's new records added to `records` (the indices returned); rank 0's bar
    counts the other ranks' samples."""
    fresh: set[int] = set()
    for rank, theirs in enumerate(team.gather(decoded)):
        records.update(theirs)
        fresh.update(theirs)
        if progress is not None and rank != team.rank:
            progress.advance(len(theirs))
    return fresh


def _reused(cell, records, count, summary_path, team, progress) -> CellResult:
    """A finished cell's first `count` records and its summary (recomputed for another count);
    rank 0 merges records a kill left in rank files once every rank has read them."""
    kept = [records[index] for index in range(count)]
    summary = json.loads(summary_path.read_text())
    if summary.get("count") != count:
        summary = {**summarize(kept), "cell": dataclasses.asdict(cell)}
    team.barrier()
    if team.lead:
        merge_records(summary_path.parent, records)
    result = CellResult(cell, kept, summary)
    if progress is not None:
        progress.cell_started(cell, total=count, done=count)  # nothing of it left to decode
        progress.cell_done(result, reused=True)
    return result


def check_ranks(root: str | Path, models: dict[str, Llama], ranks: Ranks) -> None:
    """Before any cell, on every rank: the cells directory is one every rank sees, and every
    rank holds the same weights under each model name (eval/ranks.py)."""
    check_shared_directory(root, ranks)
    check_same_models({name: model_fingerprint(model) for name, model in models.items()}, root, ranks)


def too_short(cell: Cell, error: Exception) -> bool:
    """The tables' `on_error` (`run_grid`): a (task, length) whose prompt cannot fit the length
    (PromptTooShortError, any benchmark) is left out, as the effective-length search skips
    it; any other error stops the grid."""
    return isinstance(error, PromptTooShortError)


def run_grid(
    grid: Grid,
    tokenizer: TextTokenizer,
    root: str | Path,
    decoding: Decoding,
    progress: Progress | None = None,
    on_error: Callable[[Cell, Exception], bool] | None = None,
    ranks: Ranks | None = None,
    left_out: list[tuple[Cell, str]] | None = None,
) -> list[CellResult]:
    """Every cell of `grid` (run, resumed or reused), in `Grid.cells` order, on every rank.
    `on_error(cell, error)`, a decision without side effects: True = leave that cell out and
    go on (NIAH: a length below a task's prompt overhead), the cell and the error's message
    appended to `left_out` in grid order; without it, or when it returns False, the error
    propagates.

    With `ranks` (eval/ranks.py; None: this process alone), every rank calls it and the
    cells are dealt by eval/ranks.py's rule: whole cells first, each rank on its own, then
    the rest spread over every rank by batches; the finished cells (and the left-out ones)
    are gathered so that every rank returns all of them."""
    ranks = Ranks() if ranks is None else ranks
    cells = grid.cells()
    check_ranks(root, grid.models, ranks)
    if progress is not None and hasattr(progress, "grid_started"):
        progress.grid_started(len(cells) * grid.count, ranks.layout(len(cells)) if ranks.world > 1 else "")
    whole = whole_cells(len(cells), ranks)
    outcomes: dict[int, CellResult | str] = {}
    error: Exception | None = None
    for position in share(list(range(whole)), ranks):
        try:
            outcomes[position] = _cell(
                grid, cells[position], tokenizer, root, decoding, progress, on_error, ranks, True
            )
        except Exception as failed:  # the other ranks stop with it at the gather below
            error = failed
            break
    ranks.settle(error)
    outcomes.update(_gathered(outcomes, ranks, progress))
    for position in range(whole, len(cells)):
        outcomes[position] = _cell(grid, cells[position], tokenizer, root, decoding, progress, on_error, ranks, False)
    for position, outcome in sorted(outcomes.items()):
        if isinstance(outcome, str) and left_out is not None:
            left_out.append((cells[position][0], outcome))
    return [outcome for _, outcome in sorted(outcomes.items()) if isinstance(outcome, CellResult)]


def _gathered(mine: dict[int, CellResult | str], ranks: Ranks, progress: Progress | None):
    """The whole cells every other rank ran or left out (rank 0 reports them as finished)."""
    for rank, theirs in enumerate(ranks.gather(mine)):
        if rank // ranks.shard == ranks.worker or rank % ranks.shard:  # this replica's, or a copy
            continue
        for position, outcome in theirs.items():
            if progress is not None and isinstance(outcome, CellResult):
                count = outcome.summary["count"]
                progress.cell_started(outcome.cell, total=count, done=count - outcome.decoded)
                progress.advance(outcome.decoded)
                progress.cell_done(outcome, reused=outcome.decoded == 0)
            yield position, outcome


def _cell(grid, entry, tokenizer, root, decoding, progress, on_error, ranks, alone) -> CellResult | str:
    """One cell of the grid; the error's message when `on_error` leaves it out."""
    cell, model, method, task = entry
    method.resolved(model.config.max_position, f"eval.arms.{cell.method}")
    try:
        return run_cell(
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
            ranks=ranks,
            alone=alone,
        )
    except Exception as error:
        if on_error is None or not on_error(cell, error):
            raise
        return str(error)
