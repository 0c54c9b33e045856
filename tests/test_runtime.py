"""The CPU allocator tuning keeps freed memory for reuse (checked in fresh processes,
since malloc settings are process-wide)."""

import os
import subprocess
import sys

import pytest

FREE_AND_MEASURE = """
import ctypes, ctypes.util, re, sys
from longctx.runtime import tune_cpu_allocator

def resident():
    return int(re.search(r"VmRSS:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024

applied = tune_cpu_allocator()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size = 64 << 20
block = libc.malloc(size)
ctypes.memset(block, 1, size)  # touch every page
before_free = resident()
libc.free(block)
print(applied, before_free - resident())
"""


def freed_memory_kept(environment: dict) -> tuple[bool, int]:
    result = subprocess.run(
        [sys.executable, "-c", FREE_AND_MEASURE],
        env={**os.environ, **environment},
        capture_output=True,
        text=True,
        check=True,
    )
    applied, released = result.stdout.split()
    return applied == "True", int(released)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and needs glibc")
def test_tuned_malloc_keeps_a_freed_64_mib_block_and_the_default_returns_it():
    applied, released = freed_memory_kept({})
    assert applied and released < 4 << 20  # kept in the heap for the next allocation
    applied, released = freed_memory_kept({"LONGCTX_MALLOC_TUNING": "0"})
    assert not applied and released > 60 << 20  # glibc's default: a fresh mmap, unmapped on free
