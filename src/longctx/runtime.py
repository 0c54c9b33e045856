"""Process-level settings: the CPU allocator, and third-party chatter kept off the console.

    from longctx.runtime import quiet_third_party, tune_cpu_allocator
    tune_cpu_allocator()          # once, early in the process (the CLI does it)
    quiet_third_party()           # likewise

glibc's malloc returns every freed block above its mmap threshold (128 KiB to 32 MiB,
adapted at run time) to the kernel, and trims the heap top above 128 KiB. An activation
of a CPU training step (a [4, 1024, 256] fp32 tensor is 4 MiB) is then fresh memory every
time it is allocated, and the kernel zero-fills each of its 4 KiB pages on first touch:
elementwise ops on such tensors run several times slower than on reused memory, and a
whole training step measurably slower (numbers in docs/benchmarks.md). Raising both thresholds keeps freed blocks in the heap for reuse; torch's own
CPU tuning guide gets the same effect by preloading jemalloc or tcmalloc. The cost: the
process keeps up to TRIM_THRESHOLD of freed memory instead of returning it.

Set LONGCTX_MALLOC_TUNING=0 to leave malloc as it is; it is a no-op off glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import warnings

MMAP_THRESHOLD = 256 << 20
"""Blocks below this come from the heap (reused) rather than a fresh mmap."""
TRIM_THRESHOLD = 512 << 20
"""Free memory at the heap top kept for reuse instead of being returned to the kernel."""
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, <malloc.h>


def tune_cpu_allocator() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; True if applied."""
    if os.environ.get("LONGCTX_MALLOC_TUNING", "1") == "0":
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


class _DropMessages(logging.Filter):
    def __init__(self, *fragments: str):
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(fragment in record.getMessage() for fragment in self.fragments)


_LITLOGGER_TIP = _DropMessages("litlogger")
"""One instance, so that calling `quiet_third_party` again (each in-process `main`) adds nothing."""


def quiet_third_party() -> None:
    """Silence, narrowly, what other packages print that says nothing about the run:
    Lightning's advertisement for its LitLogger (logged at every Trainer start), and the
    deprecation of `LeafSpec` that torch >= 2.10 raises inside Lightning's own pytree code
    (nothing a user of Lightning can change). Each filter matches its one message."""
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_LITLOGGER_TIP)
    warnings.filterwarnings(
        "ignore",
        message=r".*isinstance\(treespec, LeafSpec\)` is deprecated",
        category=FutureWarning,
        module=r"lightning\.pytorch\.utilities\._pytree",
    )
