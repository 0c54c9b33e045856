"""The suite's exceptions.

Everything a user can cause with bad input (a config key, a data file, a checkpoint, a
sweep file) raises a `LongctxError` whose message names the key, file, line or shape at
fault. The `longctx` command prints such an error as one line and exits with status 2;
any other exception is a bug in the suite and keeps its traceback.

The domain errors also subclass `ValueError`, so callers that caught `ValueError` before
this hierarchy existed keep working.
"""

from __future__ import annotations


class LongctxError(Exception):
    """Base class of every error caused by the user's input rather than by a bug."""


class ConfigError(LongctxError, ValueError):
    """An invalid configuration value.

    `key` is the dotted config key at fault and `related` the other keys of an impossible
    combination, so the loader can say where each of them was set (file:line or override).
    """

    def __init__(self, key: str, message: str, related: tuple[str, ...] = ()):
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message
        self.related = related


class DataError(LongctxError, ValueError):
    """A data source, prepared dataset or sample cannot be used as it is."""


class CheckpointError(LongctxError, ValueError):
    """A checkpoint or exported model cannot be read, merged or represented."""


class DataIntegrityError(DataError):
    """A prepared dataset's file differs from what `longctx prepare` recorded: `path`,
    `expected` and `found` name the file and the size or checksum on each side."""

    def __init__(self, path: str, message: str, expected: object = None, found: object = None):
        super().__init__(f"{path}: {message}")
        self.path, self.expected, self.found = path, expected, found


class CheckpointSaveError(CheckpointError):
    """A checkpoint could not be written (no space, no permission): `path`, and the bytes
    `needed` against the bytes `free` on its file system."""

    def __init__(self, path: str, message: str, needed: int, free: int):
        super().__init__(f"{path}: {message}")
        self.path, self.needed, self.free = path, needed, free


class NonFiniteError(LongctxError):
    """Training produced a NaN or infinite loss or gradient norm (train/nonfinite.py):
    `step` is the first optimizer step it happened at, `quantity` what was non-finite
    (train/loss or train/grad_norm) and `value` its value."""

    def __init__(self, message: str, step: int, quantity: str, value: float):
        super().__init__(message)
        self.step, self.quantity, self.value = step, quantity, value


class HFAttentionError(LongctxError, ValueError):
    """A Hugging Face model, cache, mask or input that longctx's attention functions
    (longctx.hf_attention) cannot serve exactly; the message is one line naming the
    attention implementation and the reason."""
