"""Crash-safe checkpoint files: a kill at any moment leaves the previous checkpoint readable.

Every checkpoint the Trainer writes (`last.ckpt`, `step-NNNNNNN.ckpt`) goes through
`AtomicCheckpointIO`, Lightning's `CheckpointIO` plugin slot:

    torch.save -> .NAME.tmp-PID (same directory) -> flush + fsync -> os.replace -> fsync(directory)

`os.replace` within one directory is atomic on POSIX file systems, so readers see either
the old complete file or the new complete file, never a mix; the file's fsync before the
rename makes sure the renamed file holds its data after a machine crash (without it a
journaling file system may commit the rename before the data blocks), and the directory's
fsync makes the rename itself durable. A writer killed mid-save leaves only its temporary
file, which the next successful save of the same name removes.

Lightning's default (`TorchCheckpointIO`) serialises the whole checkpoint into memory and
stages it in the system temp directory; when that is another file system (a node-local
/tmp or tmpfs beside a shared run directory) the final move is a copy into the target
path, which a kill can leave half-written. Object-store paths (`s3://...`) keep
Lightning's behaviour: an object PUT is atomic.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO


def atomic_save(obj: Any, path: str | Path) -> None:
    """`torch.save(obj, path)` through a temporary file, fsync and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)  # mode as open() gives
    try:
        with os.fdopen(descriptor, "wb") as handle:
            torch.save(obj, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        raise
    _fsync_directory(path.parent)
    for stale in path.parent.glob(f".{path.name}.tmp-*"):  # left by writers killed mid-save
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


class AtomicCheckpointIO(TorchCheckpointIO):
    """`TorchCheckpointIO` whose local saves are atomic and durable (see the module docstring)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None) -> None:
        if "://" in str(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options for the local path {path}")
        atomic_save(checkpoint, path)
