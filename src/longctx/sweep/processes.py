"""The child processes of both sweep drivers (runner.py: `longctx sweep`; side_by_side.py:
the GPU twin's budgeted calls): how one is started and how it is signalled.

Each child runs in its own process group, as under `wandb agent`: a terminal Ctrl-C
reaches the driver only, which forwards it once, and a signal sent to the group also
reaches what the child started (a DataLoader worker, a torchrun rank). stdin is closed so
that a read cannot block an unattended child.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def start_in_group(
    argv: list[str], env: dict[str, str], log: Path | None = None, *, append: bool = False
) -> subprocess.Popen:
    """Start `argv` with exactly `env` in a new process group. Its output goes to the
    console, or to `log`: truncated, or with `append` kept and a dated header line added
    (a job resumed across calls keeps one log)."""
    sys.stdout.flush()
    if log is None:
        return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, process_group=0)
    with log.open("a" if append else "w") as out:
        if append:
            out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(argv)}\n")
            out.flush()
        return subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, process_group=0
        )  # the child holds its own descriptor once `out` closes


def signal_group(process: subprocess.Popen, signum: int | signal.Signals) -> None:
    """Send `signum` to the child's process group; a child that already exited is no error."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signum)
