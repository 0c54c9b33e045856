"""Files of a prepared dataset on local disk or in an object store (`s3://`, `gs://`, `r2://`).

litdata streams a dataset's chunks from any of these; the side files beside them
(`lengths.npy`, `prepare.json`, `index.json`) go through the same layer, litdata's own
storage providers (`litdata.streaming.fs_provider`: boto3 for S3 and R2, google-cloud-storage
for GCS), so one set of credentials and one endpoint setting serve both. An S3-compatible
store (MinIO, Ceph, ...) is reached with boto3's standard environment: `AWS_ENDPOINT_URL`,
`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_DEFAULT_REGION`. The endpoint must speak
https: litdata moves chunks with obstore where it is installed, and builds its client
without `allow_http`.

Paths are strings: `pathlib.Path("s3://b/x")` collapses the `//` into `s3:/b/x`.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

REMOTE_SCHEMES = ("s3://", "gs://", "r2://")


def is_remote(path: str | Path) -> bool:
    return str(path).startswith(REMOTE_SCHEMES)


def join(directory: str | Path, name: str) -> str:
    """`directory/name` for a local directory or an object-store prefix."""
    if is_remote(directory):
        return f"{str(directory).rstrip('/')}/{name}"
    return str(Path(directory) / name)


def _provider(path: str):
    from litdata.streaming.fs_provider import _get_fs_provider

    return _get_fs_provider(path)


def exists(path: str | Path) -> bool:
    if not is_remote(path):
        return Path(path).exists()
    return _provider(str(path)).exists(str(path))


def read_bytes(path: str | Path) -> bytes:
    """The whole file; FileNotFoundError naming the path when there is none."""
    if not is_remote(path):
        return Path(path).read_bytes()
    if not exists(path):
        raise FileNotFoundError(f"{path} does not exist")
    with tempfile.TemporaryDirectory(prefix="longctx-") as scratch:
        local = Path(scratch) / "file"
        _provider(str(path)).download_file(str(path), str(local))
        return local.read_bytes()


def write_bytes(path: str | Path, data: bytes) -> None:
    """Write the whole file (an object PUT is atomic; a local file is replaced by rename)."""
    if not is_remote(path):
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.tmp")
        temporary.write_bytes(data)
        temporary.replace(path)
        return
    with tempfile.TemporaryDirectory(prefix="longctx-") as scratch:
        local = Path(scratch) / "file"
        local.write_bytes(data)
        _provider(str(path)).upload_file(str(local), str(path))


def read_json(path: str | Path) -> Any:
    return json.loads(read_bytes(path))


def read_json_or_none(path: str | Path) -> Any:
    """`read_json`, or None where there is no file (a manifest or ledger not written yet)."""
    return read_json(path) if exists(path) else None


def write_json(path: str | Path, value: Any) -> None:
    """`value` as indented JSON with a final newline (the side files people read)."""
    write_bytes(path, (json.dumps(value, indent=2) + "\n").encode())


def read_array(path: str | Path) -> np.ndarray:
    """A `.npy` file (`lengths.npy`, `answers.npy`)."""
    return np.load(io.BytesIO(read_bytes(path)))


def write_array(path: str | Path, array: np.ndarray) -> None:
    buffer = io.BytesIO()
    np.save(buffer, array)
    write_bytes(path, buffer.getvalue())


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a local file, read in blocks of 1 MiB."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def copy(source: str | Path, target: str | Path) -> None:
    """Copy one file (both local, or both in an object store)."""
    if is_remote(source) != is_remote(target):
        raise ValueError(f"copy from {source} to {target}: both must be local or both remote")
    if not is_remote(source):
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        return
    _provider(str(target)).copy(str(source), str(target))
