"""Read the metrics of a W&B run straight from its `.wandb` transaction log (offline runs).

wandb 0.31 writes each run as `run-<id>.wandb`: a 7-byte header (":W&B", magic 0xBEE1,
version 0) followed by a LevelDB-style log — 32 KiB blocks of records, each
`crc32c (4) | length (2, little-endian) | type (1)` + payload, where type FULL=1 is a whole
record and FIRST=2 / MIDDLE=3 / LAST=4 are pieces of one spanning blocks. Every payload is
a `wandb.proto.wandb_internal_pb2.Record`; history rows are `Record.history.item`
(key, value_json); `Record.run` carries the run's id, name and job type and `Record.config`
its config. This reader needs no W&B server and no `wandb sync`.

    read_history(".../wandb/offline-run-*/")   # [{"train/loss": ..., "trainer/global_step": ...}, ...]
    read_run(".../wandb/offline-run-*/")       # {"run_id", "name", "project", "job_type", "config"}
    job_type(".../wandb/offline-run-*/")       # "" for training runs, "niah" for `longctx niah`
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

from wandb.proto import wandb_internal_pb2

HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
BLOCK_SIZE = 32 * 1024
RECORD_HEADER_SIZE = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _payloads(data: bytes, source: Path) -> Iterator[bytes]:
    if not data.startswith(HEADER):
        raise ValueError(f"{source} is not a W&B transaction log (bad header)")
    offset, pending = len(HEADER), b""
    while offset + RECORD_HEADER_SIZE <= len(data):
        left_in_block = BLOCK_SIZE - offset % BLOCK_SIZE
        if left_in_block < RECORD_HEADER_SIZE:  # block trailer padding
            offset += left_in_block
            continue
        length, kind = struct.unpack_from("<HB", data, offset + 4)
        payload = data[offset + RECORD_HEADER_SIZE : offset + RECORD_HEADER_SIZE + length]
        offset += RECORD_HEADER_SIZE + length
        if kind == 0 and length == 0:  # zero fill at the end of a block
            continue
        if kind == FULL:
            yield payload
        elif kind == FIRST:
            pending = payload
        elif kind == MIDDLE:
            pending += payload
        elif kind == LAST:
            yield pending + payload
            pending = b""
        else:
            raise ValueError(f"{source}: unknown record type {kind} at byte {offset}")


def run_file(run_dir: str | Path) -> Path:
    """The `.wandb` file of a run directory (`.../wandb/offline-run-*/`)."""
    files = sorted(Path(run_dir).glob("run-*.wandb"))
    if not files:
        raise FileNotFoundError(f"no run-*.wandb file in {run_dir}")
    return files[0]


def records(path: str | Path) -> Iterator[wandb_internal_pb2.Record]:
    """The parsed records of a run (`.wandb` file or run directory), in log order."""
    path = Path(path)
    if path.is_dir():
        path = run_file(path)
    for payload in _payloads(path.read_bytes(), path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        yield record


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
    info = {"run_id": "", "name": "", "project": "", "job_type": "", "config": {}}
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
