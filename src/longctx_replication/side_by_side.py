"""Run a set of commands side by side within a wall-clock budget, resumable across calls.

A rented GPU comes as a series of short calls on a machine that keeps its disk only while
it stays warm (docs/replication.md, "The GPU twin"). So a call starts the
jobs that are not done yet (at most `max_parallel` at a time, each in its own process
group, output appended to `<log_dir>/<name>.log`) and, `stop_before_s` seconds before its
deadline, sends SIGTERM to every job still running. A `longctx pretrain` / `sft` job
saves `last.ckpt` after its current optimizer step and exits (train/callbacks/training.py,
`LastCheckpoint`); started again with `train.resume=auto` it continues from there. A job
still alive at the deadline is killed (SIGKILL to its group).

A job that exits 0 without having been signalled is done: `<out_dir>/side_by_side_done.json`
records it, and later calls skip it. One that was signalled is `stopped` (started again
next call), one that exits non-zero by itself `failed` (started again next call, its log
kept), one whose `needs` files are missing `blocked`, one left waiting for time or a slot
`pending`. A job is not started with less than `min_start_s` seconds left: it would only
pay its start-up (imports, data checks, loading a checkpoint) and be stopped. Each started
job's process id (= its process group's) goes to `<log_dir>/<name>.pid`, so that a later
call on the same machine can stop what a call killed from outside left running (tools/twin/gpu_twin.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from longctx.sweep.processes import signal_group, start_in_group

DONE_FILE = "side_by_side_done.json"
POLL_S = 0.2


@dataclass
class Job:
    name: str
    argv: list[str]
    out_dir: Path
    """Where the job writes; holds the done marker."""
    needs: tuple[Path, ...] = ()
    """Files that must exist before the job can start (the checkpoint it fine-tunes)."""

    @property
    def done_marker(self) -> Path:
        return self.out_dir / DONE_FILE

    @property
    def done(self) -> bool:
        return self.done_marker.is_file()


@dataclass
class Outcome:
    """What one call did with one job."""

    name: str
    state: str
    """done (this call) | skipped (done before) | stopped | failed | blocked | pending."""
    returncode: int | None = None
    seconds: float = 0.0
    log: str = ""
    missing: list[str] = field(default_factory=list)


def run_side_by_side(
    jobs: Sequence[Job],
    deadline: float,
    log_dir: Path,
    *,
    max_parallel: int,
    stop_before_s: float = 45.0,
    min_start_s: float = 90.0,
    env: dict[str, str] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> list[Outcome]:
    """Run `jobs` until each is done or the budget ends (see the module docstring);
    `deadline` is a `clock()` time. Returns one Outcome per job, in the jobs' order."""
    if max_parallel < 1:
        raise ValueError(f"max_parallel must be >= 1, got {max_parallel}")
    log_dir.mkdir(parents=True, exist_ok=True)
    outcomes = {job.name: Outcome(job.name, "skipped" if job.done else "pending") for job in jobs}
    queue = [job for job in jobs if not job.done]
    running: dict[str, tuple[subprocess.Popen, float]] = {}
    signalled: set[str] = set()
    while queue or running:
        now = clock()
        while queue and len(running) < max_parallel and deadline - now >= min_start_s:
            job = queue.pop(0)
            missing = [str(path) for path in job.needs if not path.exists()]
            if missing:
                outcomes[job.name] = Outcome(job.name, "blocked", missing=missing)
                continue
            process = start_in_group(job.argv, {**os.environ, **(env or {})}, log_dir / f"{job.name}.log", append=True)
            (log_dir / f"{job.name}.pid").write_text(f"{process.pid}\n")
            running[job.name] = (process, now)
            outcomes[job.name].log = str(log_dir / f"{job.name}.log")
        if not running and queue and deadline - now < min_start_s:
            break  # too little time to start the rest; they stay pending
        for name, (process, _) in running.items():
            if name not in signalled and now >= deadline - stop_before_s:
                signal_group(process, signal.SIGTERM)
                signalled.add(name)
            elif now >= deadline:
                signal_group(process, signal.SIGKILL)
        for name, (process, started) in list(running.items()):
            returncode = process.poll()
            if returncode is None:
                continue
            del running[name]
            job = next(j for j in jobs if j.name == name)
            state = "stopped" if name in signalled else ("done" if returncode == 0 else "failed")
            outcome = outcomes[name]
            outcome.state, outcome.returncode, outcome.seconds = state, returncode, clock() - started
            if state == "done":
                job.out_dir.mkdir(parents=True, exist_ok=True)
                job.done_marker.write_text(json.dumps({"seconds": outcome.seconds, "argv": job.argv}, indent=2) + "\n")
        if running:
            time.sleep(POLL_S)
    return [outcomes[job.name] for job in jobs]
