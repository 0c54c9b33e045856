"""A cell's sample records on disk: one file per writing rank while the cell runs, one file
once it is finished.

    <cell>/samples.jsonl          a finished cell's records in index order (the prediction
                                  file `longctx eval-score` reads); also a one-process run's
                                  records as they are decoded
    <cell>/samples.rank3.jsonl    the records rank 3 decoded under torchrun, appended batch by
                                  batch

Each rank appends only to its own file, so no two processes ever write one file, on a
shared filesystem too. A resume, under any world size, reads every file of the cell as one
set of records (`read_cell`): rank 3's file from a run of 4 ranks counts in a run of 2.
When the cell has all its samples, the rank that finishes it (`merge_records`) writes
samples.jsonl in index order (a temporary file renamed over it, so a kill leaves the old
or the new file, never half of one) and then removes the rank files; records in both the
merged file and a rank file (a kill between the two steps) are one record.

A torn last line (a kill during the write) is dropped, and cut from the file by its own
writer only when it appends again. One index in two files must be one record (the same
prompt, output and score): two different ones mean the cell was decoded twice under
different settings, and the cell is refused.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from longctx.errors import LongctxError
from longctx.eval.ranks import Ranks

SAMPLES_FILE = "samples.jsonl"
RANK_FILES = "samples.rank*.jsonl"
COMPARED = ("prompt_hash", "score", "text", "stopped_by", "new_tokens")
"""What two records of one index must agree on (the time taken may differ)."""


class CellMismatchError(LongctxError):
    """A cell on disk was written under other settings or for other samples."""


def read_records(path: Path, repair: bool = True) -> list[dict[str, Any]]:
    """The records of one samples file; a torn last line is dropped (and, with `repair`, cut
    from the file: only the file's writer repairs it)."""
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
            if repair:
                path.write_text("".join(lines[:number]))
    return records


def records_file(directory: Path, ranks: Ranks) -> Path:
    """Where this rank appends its records: samples.jsonl for one process, else its rank file."""
    return directory / (SAMPLES_FILE if ranks.world == 1 else f"samples.rank{ranks.rank}.jsonl")


def cell_files(directory: Path) -> list[Path]:
    """Every records file of a cell: the merged one first, then the rank files by rank."""
    ranked = sorted(directory.glob(RANK_FILES), key=lambda p: int(p.name.split(".")[1].removeprefix("rank") or 0))
    return [directory / SAMPLES_FILE, *ranked]


def read_cell(directory: Path) -> dict[int, dict[str, Any]]:
    """Every record of the cell by index, from all its files (read only: torn last lines are
    skipped, each writer cuts its own before the cell is read)."""
    records: dict[int, dict[str, Any]] = {}
    source: dict[int, Path] = {}
    for path in cell_files(directory):
        for record in read_records(path, repair=False):
            index = record["index"]
            stored = records.get(index)
            if stored is not None and any(stored.get(key) != record.get(key) for key in COMPARED):
                raise CellMismatchError(
                    f"{path} and {source[index]} hold different records of sample {index} (the cell was "
                    f"decoded twice under different settings); delete {directory} to evaluate it again"
                )
            records.setdefault(index, record)
            source.setdefault(index, path)
    return records


def merge_records(directory: Path, records: dict[int, dict[str, Any]]) -> None:
    """samples.jsonl with every record in index order, then no rank files (module docstring).
    A cell that has only samples.jsonl is left as it is."""
    ranked = cell_files(directory)[1:]
    if not ranked:
        return
    merged = directory / SAMPLES_FILE
    partial = merged.with_name(f".{SAMPLES_FILE}.merging")
    partial.write_text("".join(json.dumps(records[index]) + "\n" for index in sorted(records)))
    os.replace(partial, merged)
    for path in ranked:
        path.unlink()
