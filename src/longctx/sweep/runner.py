"""Running a sweep: its points (the grid in W&B's order, or seeded random draws), the argv of
each point as the W&B agent expands it, and the runs one after another with the signals
forwarded (longctx/sweep/__init__.py describes the behaviour).
"""

from __future__ import annotations

import contextlib
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


def run(sweep: Sweep, points: list[Point], summary: str | Path, keep_going: bool = False) -> int:
    """Run the points in turn, appending each result to `summary` (JSON lines).

    Returns 0 when every run succeeded, 1 when one failed, 128 + signal number when a
    SIGINT/SIGTERM stopped the sweep.
    """
    summary = Path(summary)
    summary.parent.mkdir(parents=True, exist_ok=True)
    failed = 0
    for n, point in enumerate(points, 1):
        print(f"== {sweep.name} point {point.index} ({n}/{len(points)}): {shlex.join(point.command)}", flush=True)
        env = {
            **os.environ,
            "WANDB_RUN_GROUP": sweep.name,
            "LONGCTX_SWEEP_POINT": str(point.index),
            **({"WANDB_PROJECT": sweep.project} if sweep.project else {}),
            **({"WANDB_ENTITY": sweep.entity} if sweep.entity else {}),
        }
        start = time.monotonic()
        returncode, signum = _run_forwarding_signals(point.command, env)
        seconds = time.monotonic() - start
        record = {
            "index": point.index,
            "arguments": point.arguments,
            "command": point.command,
            "returncode": returncode,
            "seconds": round(seconds, 3),
            "signal": None if signum is None else signal.Signals(signum).name,
        }
        with summary.open("a") as handle:
            handle.write(json.dumps(record, default=str) + "\n")
        print(f"== {sweep.name} point {point.index}: exit {returncode} after {seconds:.1f} s", flush=True)
        if signum is not None:
            print(f"== {sweep.name}: stopped by {signal.Signals(signum).name}; summary in {summary}", flush=True)
            return 128 + signum
        if returncode != 0:
            failed += 1
            if not keep_going:
                left = len(points) - n
                print(
                    f"== {sweep.name}: stopped at the failing point {point.index} ({left} not run; --keep-going runs "
                    f"them); summary in {summary}",
                    flush=True,
                )
                return 1
    print(f"== {sweep.name}: {len(points) - failed}/{len(points)} runs succeeded; summary in {summary}", flush=True)
    return 0 if failed == 0 else 1


def _run_forwarding_signals(command: list[str], env: dict[str, str]) -> tuple[int, int | None]:
    """Run `command` in its own process group, forwarding SIGINT/SIGTERM to that group.

    Returns the child's return code and the last signal forwarded (None if none).
    """
    received: list[int] = []
    child: subprocess.Popen | None = None

    def forward(signum: int, _frame: Any) -> None:
        received.append(signum)
        if child is not None:
            with contextlib.suppress(ProcessLookupError):  # already exited and reaped
                os.killpg(child.pid, signum)

    previous = {signum: signal.signal(signum, forward) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        # Its own process group (as under `wandb agent`): a terminal Ctrl-C reaches the runner
        # only, and the runner forwards it once. stdin is closed so a read cannot block the child.
        child = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, process_group=0)
        if received:  # signalled before the child existed
            os.killpg(child.pid, received[-1])
        returncode = child.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return returncode, received[-1] if received else None
