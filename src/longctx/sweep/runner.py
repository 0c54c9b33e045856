"""Running a sweep: its points (the grid in W&B's order, or seeded random draws), the argv of
each point as the W&B agent expands it, and the runs, one or `jobs` at a time, with the signals
forwarded (longctx/sweep/__init__.py describes the behaviour).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from longctx.sweep.processes import signal_group, start_in_group
from longctx.sweep.spec import ARGUMENT_MACROS, ENVVAR, WHOLE_MACRO, Point, Sweep, SweepError


def plan(sweep: Sweep, count: int | None = None, seed: int = 0) -> list[Point]:
    """The sweep's points: the grid (its first `count`), or `count` seeded random draws."""
    if count is not None and count < 1:
        raise ValueError(f"--count must be >= 1, got {count}")
    if sweep.run_cap is not None:
        count = sweep.run_cap if count is None else min(count, sweep.run_cap)
    if sweep.method == "grid":
        product = itertools.product(*(_distinct(parameter.grid()) for parameter in sweep.parameters))
        combos = list(itertools.islice(product, count))
        arguments = [{p.name: value for p, value in zip(sweep.parameters, combo, strict=True)} for combo in combos]
    else:
        if count is None:
            raise SweepError(sweep.path, "method", "a random search never ends by itself: give --count N")
        rng = random.Random(seed)
        arguments = [{p.name: p.draw(rng) for p in sweep.parameters} for _ in range(count)]
    return [Point(i, args, expand_command(sweep, args)) for i, args in enumerate(arguments)]


def _distinct(values: list[Any]) -> list[Any]:
    """A grid parameter's values as W&B's engine visits them: it identifies values by a hash
    of their YAML (an integer-valued float hashes as the integer), visits each hash once at
    its first place, and passes the last value with that hash (`values: [7, 7.0]` is one
    point, 7.0)."""
    by_hash: dict[str, Any] = {}
    for value in values:
        normal = int(value) if isinstance(value, float) and value.is_integer() else value
        by_hash[json.dumps(normal, sort_keys=True, default=str)] = value  # keeps the first place
    return list(by_hash.values())


def expand_command(sweep: Sweep, arguments: dict[str, Any]) -> list[str]:
    """The argv a W&B agent would build for these arguments (see the module docstring)."""
    words: list[str] = []
    for word in sweep.command:
        whole = WHOLE_MACRO.fullmatch(word)
        macro = whole.group(1) if whole else None
        if macro in ARGUMENT_MACROS:
            words += [w for key, value in arguments.items() for w in ARGUMENT_MACROS[macro](key, value)]
        elif macro == "args_json":
            words.append(json.dumps(arguments, default=str))
        elif macro == "interpreter":
            words.append(sys.executable)
        elif macro == "program":
            words.append(str(sweep.program))
        elif macro != "env":
            words.append(ENVVAR.sub(lambda m: os.environ.get(m.group(1), m.group(1)), word))
    return words


def run(sweep: Sweep, points: list[Point], summary: str | Path, keep_going: bool = False, jobs: int = 1) -> int:
    """Run the points, `jobs` at a time, appending each result to `summary` (JSON lines) as
    it ends.

    With `jobs` > 1 each point's output goes to `<summary dir>/point-<index>.log` (side by
    side, the consoles would interleave) and, unless the caller set OMP_NUM_THREADS, each
    child gets an equal share of this process's CPUs as its thread count, so that the
    children do not fight over the cores.

    A failing point stops the launching of new ones unless `keep_going`; the points already
    running are waited for and recorded. Returns 0 when every run succeeded, 1 when one
    failed, 128 + signal number when a SIGINT/SIGTERM stopped the sweep (it is forwarded to
    every running child's process group).
    """
    if jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {jobs}")
    summary = Path(summary)
    summary.parent.mkdir(parents=True, exist_ok=True)
    base_env = {
        **os.environ,
        "WANDB_RUN_GROUP": sweep.name,
        **({"WANDB_PROJECT": sweep.project} if sweep.project else {}),
        **({"WANDB_ENTITY": sweep.entity} if sweep.entity else {}),
    }
    if jobs > 1 and "OMP_NUM_THREADS" not in os.environ:
        base_env["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // jobs))
    waiting = list(enumerate(points, 1))
    running: dict[subprocess.Popen, tuple[Point, float, Path | None]] = {}
    received: list[int] = []
    failed = 0

    def forward(signum: int, _frame: Any) -> None:
        received.append(signum)
        for child in running:
            signal_group(child, signum)

    previous = {signum: signal.signal(signum, forward) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        while waiting or running:
            while waiting and len(running) < jobs and not received and (keep_going or failed == 0):
                n, point = waiting.pop(0)
                log = summary.parent / f"point-{point.index}.log" if jobs > 1 else None
                where = f" > {log}" if log else ""
                print(f"== {sweep.name} point {point.index} ({n}/{len(points)}): {shlex.join(point.command)}{where}")
                child = start_in_group(point.command, {**base_env, "LONGCTX_SWEEP_POINT": str(point.index)}, log)
                running[child] = (point, time.monotonic(), log)
                if received:  # signalled between the start and the line above
                    signal_group(child, received[-1])
            if not running:
                break
            for child in [c for c in running if c.poll() is not None] or [_wait_any(running)]:
                point, start, log = running.pop(child)
                seconds = time.monotonic() - start
                record = {
                    "index": point.index,
                    "arguments": point.arguments,
                    "command": point.command,
                    "returncode": child.returncode,
                    "seconds": round(seconds, 3),
                    "signal": signal.Signals(received[-1]).name if received else None,
                    **({"log": str(log)} if log else {}),
                }
                with summary.open("a") as handle:
                    handle.write(json.dumps(record, default=str) + "\n")
                print(f"== {sweep.name} point {point.index}: exit {child.returncode} after {seconds:.1f} s", flush=True)
                failed += child.returncode != 0
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if received:
        print(f"== {sweep.name}: stopped by {signal.Signals(received[-1]).name}; summary in {summary}", flush=True)
        return 128 + received[-1]
    if failed and not keep_going:
        print(
            f"== {sweep.name}: stopped after a failing point ({len(waiting)} not run; --keep-going runs them); "
            f"summary in {summary}",
            flush=True,
        )
        return 1
    print(f"== {sweep.name}: {len(points) - failed}/{len(points)} runs succeeded; summary in {summary}", flush=True)
    return 0 if failed == 0 else 1


def _wait_any(running: dict[subprocess.Popen, Any]) -> subprocess.Popen:
    """Block until one of the running children has exited (polling: a forwarded signal
    interrupts no wait, and `os.wait` would reap the child behind Popen's back)."""
    while True:
        for child in running:
            if child.poll() is not None:
                return child
        time.sleep(0.1)
