"""Peak CPU memory of one operation, read from the kernel in a fresh process (Linux only).

    peak = peak_extra_mib(prepare, *args)    # prepare(*args) -> the operation, a no-argument callable

torch has no allocator statistics on CPU, and its CPU tensors are plain malloc/mmap
memory, so the peak is read from /proc. Each measurement runs in a fresh spawned process:
`prepare(*args)` loads kernels and thread pools (a warm-up call on a small input), creates
the inputs and returns the operation; the process then reads its resident set size
(VmRSS), resets the high-water mark (`/proc/self/clear_refs` = 5), runs the operation once
and reports VmHWM - VmRSS. `prepare` must be a module-level function of an importable
module (or of the launched script), and `args` picklable.

Caveats: it counts pages the process touched rather than bytes torch asked for, including
the operation's outputs and anything else the process allocated meanwhile; memory freed
before the baseline but kept by malloc is reused without counting. It is good to about
1 MiB.
"""

from __future__ import annotations

import multiprocessing
import re
from collections.abc import Callable

MIB = 2**20


def status_bytes(field: str) -> int:
    """A /proc/self/status memory field (VmRSS, VmHWM) in bytes."""
    with open("/proc/self/status") as status:
        match = re.search(rf"^{field}:\s+(\d+) kB", status.read(), re.MULTILINE)
        assert match is not None, field
        return int(match.group(1)) * 1024


def reset_peak() -> int:
    """Reset VmHWM to the current VmRSS (`/proc/self/clear_refs` = 5); returns that VmRSS."""
    baseline = status_bytes("VmRSS")
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")
    return baseline


def _peak_extra_bytes_here(prepare: Callable[..., Callable[[], object]], args: tuple) -> int:
    operation = prepare(*args)
    baseline = reset_peak()
    operation()
    return status_bytes("VmHWM") - baseline


def peak_extra_mib(prepare: Callable[..., Callable[[], object]], *args) -> float:
    """Peak resident memory of the operation `prepare(*args)` returns, above what the
    process held once it was prepared, in MiB; measured in a fresh spawned process."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_peak_extra_bytes_here, (prepare, args)) / MIB
