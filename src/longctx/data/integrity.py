"""Prepared data carries its integrity: every chunk's size and checksum, checked on open.

`longctx prepare` records, in its manifest (`prepare.json`, key `chunks`), each litdata
chunk's file name, size in bytes and SHA-256. Opening a dataset (`PackedSource`, what
training, `longctx fi` and the analyses read through) compares every local chunk's size
with the record: one `stat` per chunk, always. `data.verify=full` (training) and
`longctx prepare --verify DIR` also hash every chunk against its checksum. A missing,
truncated, extended or altered chunk is a `DataIntegrityError` naming the file, what was
expected and what was found.

Datasets prepared before the checksums were recorded still open: their sizes come from
litdata's own `index.json` (`chunk_bytes` per chunk), and `--verify`/`full` say that no
checksum exists to compare.

Reading. An error raised inside litdata's loader while reading a document (a damaged
header or offset table: `struct.error`, litdata's item-count RuntimeError; a truncated
chunk: litdata's "Timed out ... waiting for chunk" `ChunkWaitTimeoutError`) becomes a
`DataIntegrityError` naming the chunk and the document, with the chunk's size and
checksum against the record where they can be read.

Object stores (`s3://`, `gs://`, `r2://`). Checked: what is read (a loader error names the
remote chunk, as above), and everything with `data.verify=full` or `--verify`, which
download each chunk once and check its size and checksum. Not checked on open: the sizes
(litdata's storage layer gives no object size without a download), so a damaged remote
chunk that still parses is found only by a full verify.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from longctx.data import storage
from longctx.errors import DataIntegrityError

INDEX_FILE = "index.json"
MANIFEST_FILE = "prepare.json"
CHUNKS_KEY = "chunks"


def _index(directory: str | Path) -> dict:
    return storage.read_json(storage.join(directory, INDEX_FILE))


def _index_chunks(directory: str | Path) -> list[dict]:
    return _index(directory)["chunks"]


def record_chunks(directory: str | Path) -> list[dict]:
    """{"file", "bytes", "sha256"} of every chunk litdata wrote, in index order (what
    `prepare` stores in the manifest)."""
    records = []
    for chunk in _index_chunks(directory):
        data = storage.read_bytes(storage.join(directory, chunk["filename"]))
        records.append({"file": chunk["filename"], "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    return records


def expected_chunks(directory: str | Path) -> list[dict]:
    """The recorded chunks: the manifest's, or for a dataset prepared before it held them,
    the sizes in litdata's index.json (no "sha256"; no "bytes" either when litdata
    compressed the chunks: its `chunk_bytes` then counts the uncompressed bytes)."""
    try:
        recorded = storage.read_json(storage.join(directory, MANIFEST_FILE)).get(CHUNKS_KEY)
    except FileNotFoundError:
        recorded = None
    if recorded:
        return recorded
    index = _index(directory)
    compressed = bool(index.get("config", {}).get("compression"))
    return [
        {"file": chunk["filename"], **({} if compressed else {"bytes": chunk["chunk_bytes"]})}
        for chunk in index["chunks"]
    ]


def _size_and_sha256(path: str, level: str) -> tuple[int | None, str | None]:
    """(bytes, SHA-256 with level "full" else None) of a chunk; (None, None) when it is
    missing. A remote chunk is downloaded once for both."""
    if storage.is_remote(path):
        try:
            data = storage.read_bytes(path)
        except FileNotFoundError:
            return None, None
        return len(data), hashlib.sha256(data).hexdigest() if level == "full" else None
    if not Path(path).exists():
        return None, None
    size = Path(path).stat().st_size
    return size, storage.file_sha256(path) if level == "full" else None


def verify_chunk(directory: str | Path, record: dict, level: str) -> None:
    """Check one chunk against its record: its size, and with level "full" its checksum."""
    path = storage.join(directory, record["file"])
    size, found = _size_and_sha256(path, level if "sha256" in record else "sizes")
    expected = record.get("bytes")
    if size is None:
        wanted = f" (expected {expected:,} bytes)" if expected is not None else ""
        raise DataIntegrityError(path, f"chunk is missing{wanted}", expected, None)
    if expected is not None and size != expected:
        change = "truncated" if size < expected else "extended"
        raise DataIntegrityError(
            path,
            f"chunk is {size:,} bytes, expected {expected:,} ({change}); "
            "re-run `longctx prepare` into a new directory or restore the file",
            expected,
            size,
        )
    if found is not None and found != record["sha256"]:
        raise DataIntegrityError(
            path,
            f"chunk checksum is sha256 {found}, expected {record['sha256']} (same size, altered content); "
            "re-run `longctx prepare` into a new directory or restore the file",
            record["sha256"],
            found,
        )


def verify_dataset(directory: str | Path, level: str = "sizes") -> list[dict]:
    """Check every chunk of a prepared dataset ("sizes": local sizes only, remote nothing;
    "full": sizes and checksums, remote chunks downloaded); returns the records checked
    (none for a remote dataset at "sizes")."""
    if level == "sizes" and storage.is_remote(directory):
        return []
    records = expected_chunks(directory)
    for record in records:
        verify_chunk(directory, record, level)
    return records


class ChunkLocator:
    """Which chunk holds document `item` (litdata's index: items per chunk, in order)."""

    def __init__(self, directory: str | Path):
        self.directory = str(directory)

    def file_of(self, item: int) -> str:
        chunks = _index_chunks(self.directory)  # read on an error only: nothing is fetched otherwise
        ends = np.cumsum([chunk["chunk_size"] for chunk in chunks])
        return chunks[int(np.searchsorted(ends, item, side="right"))]["filename"]

    def read_error(self, item: int, error: Exception) -> DataIntegrityError:
        """The named error for a litdata failure reading `item`: the chunk, checked against
        its record (size and checksum) to say what was expected and what was found."""
        name = self.file_of(item)
        path = storage.join(self.directory, name)
        record = next((r for r in expected_chunks(self.directory) if r["file"] == name), None)
        if record is not None:
            try:
                verify_chunk(self.directory, record, "full")
            except DataIntegrityError as damage:
                detail = str(damage).removeprefix(f"{path}: ")
                return DataIntegrityError(
                    path, f"document {item} cannot be read: {detail}", damage.expected, damage.found
                )
        return DataIntegrityError(
            path,
            f"document {item} cannot be read from this chunk ({type(error).__name__}: {str(error).splitlines()[0]}); "
            "check the dataset with `longctx prepare --verify DIR`",
        )


def item_count(dataset: Any) -> int:
    """Every item of a litdata dataset, whatever process reads it. `len(dataset)` counts only
    this rank's share once litdata sees a distributed launch (torch.distributed initialised,
    or torchrun's WORLD_SIZE in the environment, before any process group exists), so code
    that reads a whole dataset (the lengths table, a selection pass) must not use it."""
    return sum(end - start for start, end in dataset.region_of_interest)
