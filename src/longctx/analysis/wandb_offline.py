"""Read the metrics of a W&B run straight from its `.wandb` transaction log (offline runs).

wandb 0.31 writes each run as `run-<id>.wandb`: a 7-byte header (":W&B", magic 0xBEE1,
version 0) followed by a LevelDB-style log — 32 KiB blocks of records, each
`crc32 (4) | length (2, little-endian) | type (1)` + payload (the checksum is zlib's CRC-32
of type + payload), where type FULL=1 is a whole record and FIRST=2 / MIDDLE=3 / LAST=4 are
pieces of one spanning blocks. Every payload is
a `wandb.proto.wandb_internal_pb2.Record`; history rows are `Record.history.item`
(key, value_json); `Record.run` carries the run's id, name and job type and `Record.config`
its config. This reader needs no W&B server and no `wandb sync`. A log that ends
mid-record (a killed or still-running run) or in damaged bytes is read up to its last
complete record, with a `TruncatedLogWarning` that says how many bytes were dropped
(`log_end` returns the same without the warning).

    read_history(".../wandb/offline-run-*/")   # [{"train/loss": ..., "trainer/global_step": ...}, ...]
    read_run(".../wandb/offline-run-*/")       # {"run_id", "name", "project", "job_type", "config"}
    job_type(".../wandb/offline-run-*/")       # "" for training runs, "niah" for `longctx niah`
"""

from __future__ import annotations

import json
import struct
import warnings
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any


@cache
def _record_class() -> Any:
    """wandb's protobuf `Record`, imported on first read, so that importing this module (and
    the analysis and evaluation code above it) needs no wandb: the GPU image has none.

    `wandb_internal_pb2` picks its generated classes with a protobuf-version-dependent star
    import and ships no stubs, so mypy cannot see `Record`; records are typed `Any`."""
    from wandb.proto import wandb_internal_pb2

    return wandb_internal_pb2.Record  # type: ignore[attr-defined]


HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
BLOCK_SIZE = 32 * 1024
RECORD_HEADER_SIZE = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


class TruncatedLogWarning(UserWarning):
    """A `.wandb` file ends mid-record or in damaged bytes; its complete records were read."""


@dataclass
class LogEnd:
    """Where reading a `.wandb` file stopped: `complete` bytes hold whole, checksummed
    records; the `dropped` bytes after them (a killed or still-running writer's partial
    record, or a damaged tail) were not read, for the `reason` given."""

    size: int = 0
    complete: int = 0
    reason: str = ""

    @property
    def dropped(self) -> int:
        return self.size - self.complete


def _payloads(data: bytes, source: Path, end: LogEnd) -> Iterator[bytes]:
    """Whole record payloads up to the last complete, checksummed one; fills `end`.

    A record is taken only once its bytes are all there and its checksum
    (zlib CRC-32 of type byte + payload, as W&B writes it) matches; a record spanning
    blocks only once its LAST piece is. Reading stops at the first piece that fails.
    """
    if not data.startswith(HEADER):
        raise ValueError(f"{source} is not a W&B transaction log (bad header)")
    end.size = len(data)
    offset = end.complete = len(HEADER)
    pending: bytes | None = None
    while offset < len(data):
        left_in_block = BLOCK_SIZE - offset % BLOCK_SIZE
        if left_in_block < RECORD_HEADER_SIZE:  # block trailer padding
            offset = min(offset + left_in_block, len(data))
        else:
            if offset + RECORD_HEADER_SIZE > len(data):
                end.reason = f"ends inside the record header at byte {offset}"
                return
            checksum, length, kind = struct.unpack_from("<IHB", data, offset)
            if checksum == length == kind == 0:  # zero fill at the end of a block
                offset += RECORD_HEADER_SIZE
                continue
            payload = data[offset + RECORD_HEADER_SIZE : offset + RECORD_HEADER_SIZE + length]
            if RECORD_HEADER_SIZE + length > left_in_block:
                end.reason = f"the record at byte {offset} claims {length} bytes, more than its block holds"
                return
            if len(payload) < length:
                end.reason = f"ends inside the record at byte {offset} ({len(payload)} of {length} bytes)"
                return
            if zlib.crc32(bytes([kind]) + payload) != checksum:
                end.reason = f"checksum mismatch in the record at byte {offset}"
                return
            if kind == FULL and pending is None:
                yield payload
            elif kind == FIRST and pending is None:
                pending = payload
            elif kind == MIDDLE and pending is not None:
                pending += payload
            elif kind == LAST and pending is not None:
                yield pending + payload
                pending = None
            else:
                end.reason = f"unexpected record type {kind} at byte {offset}"
                return
            offset += RECORD_HEADER_SIZE + length
        if pending is None:
            end.complete = offset
    if pending is not None:
        end.reason = f"ends inside a record spanning blocks (started before byte {end.complete + 1})"


def run_file(run_dir: str | Path) -> Path:
    """The `.wandb` file of a run directory (`.../wandb/offline-run-*/`)."""
    files = sorted(Path(run_dir).glob("run-*.wandb"))
    if not files:
        raise FileNotFoundError(f"no run-*.wandb file in {run_dir}")
    return files[0]


def records(path: str | Path, end: LogEnd | None = None) -> Iterator[Any]:
    """The parsed records of a run (`.wandb` file or run directory), in log order.

    A file that ends mid-record or in damaged bytes is read up to its last complete
    record; a `TruncatedLogWarning` says how many bytes were dropped (also left in `end`).
    """
    path = Path(path)
    if path.is_dir():
        path = run_file(path)
    end = LogEnd() if end is None else end
    for payload in _payloads(path.read_bytes(), path, end):
        record = _record_class()()
        record.ParseFromString(payload)
        yield record
    if end.dropped:
        warnings.warn(
            f"{path}: read {end.complete} of {end.size} bytes, dropped the last {end.dropped} ({end.reason})",
            TruncatedLogWarning,
            stacklevel=2,
        )


def log_end(path: str | Path) -> LogEnd:
    """Scan a run's log and say where its complete records end (no warning)."""
    path = Path(path)
    if path.is_dir():
        path = run_file(path)
    end = LogEnd()
    for _ in _payloads(path.read_bytes(), path, end):
        pass
    return end


def read_history(path: str | Path) -> list[dict]:
    """Every logged history row of a run (`.wandb` file or run directory), as dicts."""
    return [
        {_item_key(item): json.loads(item.value_json) for item in record.history.item}
        for record in records(path)
        if record.WhichOneof("record_type") == "history"
    ]


def _item_key(item) -> str:
    return ".".join(item.nested_key) if item.nested_key else item.key


def read_run(path: str | Path) -> dict:
    """Who the run is: `run_id`, `name`, `project`, `job_type` (empty for training runs,
    "niah" for `longctx niah` evaluations) and `config` (the logged config as plain JSON
    values, later config records applied over earlier ones)."""
    info: dict[str, Any] = {"run_id": "", "name": "", "project": "", "job_type": "", "config": {}}
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            info.update(run_id=run.run_id, name=run.display_name, project=run.project, job_type=run.job_type)
            info["config"].update({_item_key(item): json.loads(item.value_json) for item in run.config.update})
        elif kind == "config":
            info["config"].update({_item_key(item): json.loads(item.value_json) for item in record.config.update})
            for item in record.config.remove:
                info["config"].pop(_item_key(item), None)
    return info


def job_type(path: str | Path) -> str:
    """The run's job type, read from its first `run` record (without scanning the whole log)."""
    for record in records(path):
        if record.WhichOneof("record_type") == "run":
            return record.run.job_type
    return ""


def offline_runs(save_dir: str | Path) -> list[Path]:
    """Offline run directories under a WandbLogger save_dir, oldest first."""
    return sorted(Path(save_dir).glob("wandb/offline-run-*"))
