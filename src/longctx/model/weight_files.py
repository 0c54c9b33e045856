"""Reading weight files one tensor at a time, checked before anything large is allocated.

    files = WeightFiles.find(directory)        # index + shards, or single files; headers checked
    for name in files.names(): tensor = files.read(name)   # one tensor in memory at a time

HF directories hold `model.safetensors`, shards named by `model.safetensors.index.json`,
or the older `pytorch_model.bin` (+ `pytorch_model.bin.index.json`). A safetensors file is
an 8-byte little-endian header length N, N bytes of JSON ({name: {dtype, shape,
data_offsets}}), then the data. Parsing that header ourselves (no mmap) lets every file be
checked first -- a bad header, a truncated data section, a shard the index names but the
directory lacks -- each an error naming the file, and makes a read cost exactly one
tensor: `read` fills a buffer of the tensor's bytes with `readinto`. `.bin` files are
unpickled with `torch.load(weights_only=True, mmap=True)`, which rebuilds only tensors
and primitive containers and maps rather than reads the data.
"""

from __future__ import annotations

import json
import math
import struct
import zipfile
from pathlib import Path

import torch

from longctx.errors import CheckpointError

SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"
MAX_HEADER_BYTES = 100 * 2**20

DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
"""safetensors dtype names -> torch dtypes (the ones a Llama checkpoint can hold)."""


class SafetensorsFile:
    """The checked header of one .safetensors file; `read(name)` loads one tensor."""

    def __init__(self, path: Path):
        self.path = path
        size = path.stat().st_size
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise CheckpointError(f"{path}: {size} bytes, too short for a safetensors header (truncated?)")
            (header_bytes,) = struct.unpack("<Q", prefix)
            if header_bytes > min(MAX_HEADER_BYTES, size - 8):
                raise CheckpointError(
                    f"{path}: header length {header_bytes} exceeds the file's {size} bytes "
                    "(truncated or not a safetensors file)"
                )
            try:
                header = json.loads(handle.read(header_bytes))
            except (UnicodeDecodeError, json.JSONDecodeError) as error:
                raise CheckpointError(f"{path}: the safetensors header is not valid JSON ({error})") from None
        if not isinstance(header, dict):
            raise CheckpointError(f"{path}: the safetensors header is not a JSON object")
        self.metadata = header.pop("__metadata__", None) or {}
        self.data_start = 8 + header_bytes
        self.entries: dict[str, tuple[torch.dtype, tuple[int, ...], int, int]] = {}
        data_bytes = size - self.data_start
        for name, entry in header.items():
            self.entries[name] = _checked_entry(path, name, entry, data_bytes)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entries[name][1]

    def read(self, name: str) -> torch.Tensor:
        dtype, shape, begin, end = self.entries[name]
        buffer = torch.empty(end - begin, dtype=torch.uint8)
        with self.path.open("rb") as handle:
            handle.seek(self.data_start + begin)
            if handle.readinto(buffer.numpy().data) != end - begin:
                raise CheckpointError(f"{self.path}: {name} ends beyond the file (changed while reading?)")
        return buffer.view(dtype).reshape(shape)


def _checked_entry(path: Path, name: str, entry, data_bytes: int) -> tuple[torch.dtype, tuple[int, ...], int, int]:
    try:
        dtype = DTYPES[entry["dtype"]]
        shape = tuple(int(n) for n in entry["shape"])
        begin, end = (int(n) for n in entry["data_offsets"])
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"{path}: header entry {name!r} is malformed ({error!r}): {entry!r}") from None
    expected = math.prod(shape) * dtype.itemsize
    if end - begin != expected or begin < 0:
        raise CheckpointError(
            f"{path}: {name} spans bytes {begin}..{end}, but {entry['dtype']} {list(shape)} needs {expected}"
        )
    if end > data_bytes:
        raise CheckpointError(
            f"{path}: {name} ends at data byte {end}, the file holds {data_bytes}: the file is truncated"
        )
    return dtype, shape, begin, end


class BinFile:
    """One `pytorch_model*.bin`, memory-mapped through torch.load(weights_only=True)."""

    def __init__(self, path: Path):
        self.path = path
        self.entries: dict[str, torch.Tensor] = load_torch_file(path)
        if not all(isinstance(t, torch.Tensor) for t in self.entries.values()):
            raise CheckpointError(f"{path}: expected a flat dict of tensors (a state dict)")

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.entries[name].shape)

    def read(self, name: str) -> torch.Tensor:
        return self.entries[name]


def load_torch_file(path: Path) -> dict:
    """torch.load(weights_only=True) of `path`, memory-mapped when it is a zip archive (the
    format of torch.save since 1.6; the legacy one cannot be mapped); a failure named: which
    file and what torch found wrong (a truncated zip, a forbidden global, not a torch file)."""
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except Exception as error:  # torch raises RuntimeError, UnpicklingError, EOFError, ...
        message = str(error).strip().splitlines()
        reason = f"{type(error).__name__}: {message[0]}" if message else f"{type(error).__name__} (truncated?)"
        raise CheckpointError(f"{path}: cannot be read as a torch checkpoint: {reason}") from None
    if not isinstance(loaded, dict):
        raise CheckpointError(f"{path}: holds a {type(loaded).__name__}, expected a dict")
    return loaded


class WeightFiles:
    """The weight files of an HF directory, every header checked; tensor name -> file."""

    def __init__(self, files: list[SafetensorsFile | BinFile]):
        self.where: dict[str, SafetensorsFile | BinFile] = {name: file for file in files for name in file.entries}

    @classmethod
    def find(cls, directory: Path) -> WeightFiles:
        for index, opener in ((SAFETENSORS_INDEX, SafetensorsFile), (BIN_INDEX, BinFile)):
            if (directory / index).exists():
                return cls([opener(path) for path in _shards(directory / index)])
        for pattern, opener in (("*.safetensors", SafetensorsFile), ("pytorch_model*.bin", BinFile)):
            if paths := sorted(directory.glob(pattern)):
                return cls([opener(path) for path in paths])
        raise CheckpointError(
            f"{directory}: no weights: looked for {SAFETENSORS_INDEX}, *.safetensors, {BIN_INDEX} "
            "and pytorch_model*.bin"
        )

    def names(self) -> dict[str, SafetensorsFile | BinFile]:
        """Tensor name -> the file holding it (a dict: `in` is a lookup)."""
        return self.where

    def shape(self, name: str) -> tuple[int, ...]:
        return self.where[name].shape(name)

    def read(self, name: str) -> torch.Tensor:
        return self.where[name].read(name)

    def source(self, name: str) -> Path:
        return self.where[name].path


def _shards(index: Path) -> list[Path]:
    """The files an index's weight_map names, each checked to exist."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise CheckpointError(f"{index}: not a weight index with a 'weight_map' ({error!r})") from None
    shards = [index.parent / name for name in dict.fromkeys(weight_map.values())]
    missing = [path.name for path in shards if not path.exists()]
    if missing:
        raise CheckpointError(f"{index}: names shard(s) {missing} that {index.parent} does not contain")
    return shards
