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
import errno
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from longctx.errors import CheckpointSaveError

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
NO_PERMISSION = (errno.EACCES, errno.EPERM, errno.EROFS)


def atomic_save(obj: Any, path: str | Path) -> None:
    """`torch.save(obj, path)` through a temporary file, fsync and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)  # mode as open() gives
        with os.fdopen(descriptor, "wb") as handle:
            torch.save(obj, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException as error:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        if isinstance(error, (OSError, RuntimeError)):
            _raise_if_disk_error(error, path, tensor_bytes(obj))
        raise
    _fsync_directory(path.parent)
    for stale in path.parent.glob(f".{path.name}.tmp-*"):  # left by writers killed mid-save
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()


def tensor_bytes(obj: Any) -> int:
    """Bytes of every tensor in a nested dict/list/tuple: what a checkpoint of it needs, bar
    a few KiB of pickled metadata."""
    if torch.is_tensor(obj):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(value) for value in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(value) for value in obj)
    return 0


def free_bytes(directory: Path) -> int:
    """Free bytes on the file system of `directory` (or of its closest existing parent)."""
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent
    return shutil.disk_usage(directory).free


def _os_error_in(error: BaseException | None) -> OSError | None:
    """The OSError in `error`'s chain: torch's zip writer reports a failed write as a
    RuntimeError ("unexpected pos") whose context is the writer's OSError."""
    while error is not None and not isinstance(error, OSError):
        error = error.__cause__ or error.__context__
    return error


def _raise_if_disk_error(error: OSError | RuntimeError, path: Path, needed: int) -> None:
    """CheckpointSaveError for a save that failed for space or permission; else nothing."""
    free = free_bytes(path.parent)
    cause = _os_error_in(error) or error
    code = cause.errno if isinstance(cause, OSError) else None
    if code in NO_SPACE or (code is None and free < needed):
        reason = "no space left on the device"
    elif code in NO_PERMISSION:
        reason = f"no permission to write there ({os.strerror(code)})"
    else:
        return
    raise CheckpointSaveError(
        str(path),
        f"checkpoint not saved: {reason}; it needs {needed:,} bytes and {free:,} are free "
        f"({type(cause).__name__}: {cause}). The previous {path.name}, if any, is untouched",
        needed,
        free,
    ) from error


def check_checkpoint_space(directory: Path, checkpoint_bytes: int) -> None:
    """Refuse, before step 1, a run whose first checkpoint boundary cannot fit: it writes a
    numbered copy and a new `last.ckpt` beside the old one, 2 x `checkpoint_bytes`."""
    needed, free = 2 * checkpoint_bytes, free_bytes(directory)
    if free < needed:
        raise CheckpointSaveError(
            str(directory),
            f"a checkpoint of this run takes ~{checkpoint_bytes:,} bytes (parameters and AdamW state) and the "
            f"first checkpoint boundary writes two (a numbered copy and last.ckpt): {needed:,} bytes needed, "
            f"{free:,} free; free space or set train.out_dir on a larger disk",
            needed,
            free,
        )


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
