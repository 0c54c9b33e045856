"""`make gpu-check`: the GPU path proved in one command of at most 5.5 minutes on one H100,
so that a second, partial run fits the same device session (the lender's session_s,
tools/lender.toml).

    python tools/gpu/gpu_check.py --out DIR [--parts correctness kernels] [--smoke]

A device driver, not a measurement: it runs the benchmarks/ timing scripts (and the
correctness script beside it) as its parts, each a process of its own.

Parts, in this order, each in its own process group with a hard time limit (its budget;
at the limit the group is killed, the part is reported "stopped at its limit" and the
next part runs); each writes its tables as DIR/<table>.json (device, torch and CUDA
versions recorded) and .md the moment it ends, its console in DIR/<part>.log. A part
whose last script writes its table as its last act (`final_tables`) ends TABLES_GRACE_S
after that table appears: what is left is teardown.

| part | budget | what (script) |
| --- | ---: | --- |
| correctness | 150 s | flash 4K fwd+bwd vs fp32; StRing / StRing repo / ReRoPE / Self-Extend / DCA band passes at 8K vs the pure-torch fp64 path, gradients included; the attention designs as 2-layer models vs float64; bf16-true RoPE; a 1.1B flash step under sync-debug "error"; longctx.hf_attention's functions in a bf16 transformers Llama at 8K vs longctx's flash path; fsdp + compile pretrain killed and resumed, the slowest, last (tools/gpu/gpu_check_correctness.py) |
| training | 80 s | tinyllama-1.1b, T=2,048 x 8 rows, bf16, our blocks compiled (flash, chunked loss) vs HF LlamaForCausalLM sdpa uncompiled, plain and packed document-masked rows: tokens/s, MFU, useful MFU, peak vs train/memory_budget.py's estimate (benchmarks/train_gpu.py) |
| kernels | 55 s | document-masked attention fwd+bwd at 4K/16K/64K, flash vs flex, useful TFLOP/s (benchmarks/attention.py) |
| long-context | 90 s | tinyllama-1.1b shapes prefilling 32K and 128K, RoPE vs StRing (one warm-up, two timed), decoding with a 32K cache; a random Llama-3.1-8B-shaped model prefilling 128K with StRing, one timed run, ms and peak GiB (benchmarks/position_methods.py) |

The budgets add up to 375 s (kernels: 51 s alone on a fresh H100; correctness: 87-93 s on H100s while the hf check failed at once, over 105 s on a fresh H200 with it passing: 20 s for it, 67 s for the kill + resume; the design checks add ~12 s); start-up, compilation and model set-up are inside them. After
every part DIR/gpu_check.json and DIR/gpu_check.md (the summary: part, status, seconds,
budget, tables, correctness checks passed) are rewritten, so a kill of this command keeps
what finished. Exit status: 1 if a correctness check failed or the correctness part did
not finish, else 2 if another part failed or was stopped, else 0. `--parts` runs only the
parts named (a rerun after a fix), in the order above.

`--smoke` runs the same scripts on CPU at tiny sizes (their --smoke modes: the correctness
checks and the kernels on the pure-torch `varlen` backend in place of flash, no compile),
each part limited to SMOKE_LIMIT_S: tests/tools/test_gpu_check.py runs it in `make test` so that
no GPU minute is lost to a typo or an import error.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPOSITORY / "benchmarks"))  # report.py
import report  # noqa: E402

KILL_GRACE_S = 5
TABLES_GRACE_S = 2
"""After a part's last table is written, the seconds its process gets to exit by itself."""
POLL_S = 0.2
MTIME_SLACK_S = 0.05
"""File times come from a coarser clock than time.time(): a table written right at a
command's start may carry a time this much before it."""
SUMMARY_COLUMNS = ["part", "status", "seconds", "budget s", "tables", "checks"]


@dataclasses.dataclass(frozen=True)
class Part:
    name: str
    budget_s: float
    commands: tuple[tuple[str, ...], ...]
    """Each a script (its path from the repository root) and its arguments (`--out DIR` is
    added); one after the other within the part's budget."""
    tables: tuple[str, ...]
    final_tables: tuple[str, ...] = ()
    """Tables the last command writes as its last act: once all are written after it
    started, the part is done; the process gets TABLES_GRACE_S to exit, then its group is
    stopped (what is left is teardown: the CUDA context, compile workers). Not for a
    script that rewrites a table as it goes."""


def gpu_parts() -> list[Part]:
    return [
        Part("correctness", 150, (("tools/gpu/gpu_check_correctness.py",),), ("correctness",)),
        Part(
            "training",
            80,
            (
                (
                    "benchmarks/train_gpu.py",
                    *("--backends", "flash", "--compile", "--no-litgpt", "--skip-e2e"),
                    *("--lengths", "2048", "--batch", "8", "--repeats", "10", "--loss-chunk-tokens", "2048"),
                ),
            ),
            ("train_step",),
            final_tables=("train_step",),
        ),
        Part(
            "kernels",
            55,
            (
                (
                    "benchmarks/attention.py",
                    "--device",
                    "cuda",
                    "--backends",
                    "flash",
                    "flex",
                    "--lengths",
                    "4096",
                    "16384",
                    "65536",
                ),
            ),
            ("attention",),
            final_tables=("attention",),
        ),
        Part(
            "long-context",
            90,
            (
                (
                    "benchmarks/position_methods.py",
                    *("--device", "cuda", "--preset", "tinyllama-1.1b", "--methods", "string"),
                    *("--lengths", "32768", "131072", "--repeats", "2", "--decode-lengths", "32768"),
                ),
                (
                    "benchmarks/position_methods.py",
                    *("--device", "cuda", "--preset", "llama3.1-8b", "--methods", "string", "--no-rope-baseline"),
                    *("--lengths", "131072", "--repeats", "0", "--decode-lengths"),
                ),
            ),
            ("positions_tinyllama-1.1b", "positions_llama3.1-8b"),
            final_tables=("positions_llama3.1-8b",),
        ),
    ]


SMOKE_LIMIT_S = 300
"""Each part's limit in the smoke: a shared 2-core CPU starting Python, torch, Lightning and
two pretrain processes is slower than the GPU machine; the limits themselves are tested
with stand-in parts (tests/tools/test_gpu_check.py)."""


def smoke_parts() -> list[Part]:
    """The same scripts on CPU at tiny sizes (their --smoke modes), each under SMOKE_LIMIT_S."""
    return [
        Part("correctness", SMOKE_LIMIT_S, (("tools/gpu/gpu_check_correctness.py", "--smoke"),), ("correctness",)),
        Part(
            "training",
            SMOKE_LIMIT_S,
            (("benchmarks/train_gpu.py", "--smoke", "--no-litgpt", "--skip-e2e", "--loss-chunk-tokens", "64"),),
            ("train_step",),
            final_tables=("train_step",),
        ),
        Part(
            "kernels",
            SMOKE_LIMIT_S,
            (("benchmarks/attention.py", "--smoke", "--backends", "sdpa", "varlen"),),
            ("attention",),
            final_tables=("attention",),
        ),
        Part(
            "long-context",
            SMOKE_LIMIT_S,
            (
                (
                    "benchmarks/position_methods.py",
                    "--smoke",
                    "--methods",
                    "string",
                    "--repeats",
                    "2",
                    "--decode-lengths",
                    "512",
                ),
                (
                    "benchmarks/position_methods.py",
                    *("--smoke", "--methods", "string", "--no-rope-baseline", "--repeats", "0", "--decode-lengths"),
                ),
            ),
            ("positions_debug",),
            final_tables=("positions_debug",),
        ),
    ]


def environment() -> dict[str, str]:
    """The parts import `longctx` (src/); each script puts benchmarks/ on its own path."""
    paths = [str(REPOSITORY / "src"), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p), PYTHONUNBUFFERED="1")


def run_command(
    command: list[str], log: Path, timeout_s: float, finished: Callable[[], bool] | None = None
) -> int | None:
    """Exit status of `command` (console appended to `log`), or None when it ran past
    `timeout_s` and its process group was killed (SIGTERM, then SIGKILL); 0 when
    `finished()` held for TABLES_GRACE_S while it still ran (its group is then stopped)."""
    with log.open("a") as handle:
        handle.write(f"$ {' '.join(command)}\n")
        handle.flush()
        process = subprocess.Popen(
            command, cwd=REPOSITORY, env=environment(), stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout_s
        finished_at = None
        while process.poll() is None:
            now = time.monotonic()
            if now >= deadline:
                stop(process)
                return None
            if finished_at is None and finished is not None and finished():
                finished_at = now
            if finished_at is not None and now - finished_at >= TABLES_GRACE_S:
                stop(process)
                handle.write("gpu-check: the part's tables are written; its process was stopped\n")
                return 0
            time.sleep(POLL_S)
        return process.returncode


def stop(process: subprocess.Popen) -> None:
    """Kill `process`'s group: SIGTERM, then SIGKILL after KILL_GRACE_S."""
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def tables_written(out: Path, tables: tuple[str, ...], since: float) -> bool:
    """Every table's .md (report.write's last file) written at or after `since` (epoch s)."""
    paths = [out / f"{table}.md" for table in tables]
    return all(path.exists() and path.stat().st_mtime >= since for path in paths)


def run_part(part: Part, out: Path) -> dict:
    """Run `part`'s commands within its budget; its summary record."""
    log = out / f"{part.name}.log"
    log.write_text("")
    start = time.monotonic()
    status = "ok"
    for index, (script, *arguments) in enumerate(part.commands):
        command = [sys.executable, str(REPOSITORY / script), *arguments, "--out", str(out)]
        finished = None
        if part.final_tables and index == len(part.commands) - 1:
            finished = functools.partial(tables_written, out, part.final_tables, time.time() - MTIME_SLACK_S)
        returncode = run_command(command, log, part.budget_s - (time.monotonic() - start), finished)
        if returncode is None:
            status = f"stopped at its limit ({part.budget_s:.0f} s)"
            break
        if returncode != 0:
            status = f"failed (exit {returncode})"
            break
    record: dict = {"part": part.name, "status": status, "seconds": time.monotonic() - start, "budget_s": part.budget_s}
    record["tables"] = [table for table in part.tables if (out / f"{table}.json").exists()]
    if part.name == "correctness" and "correctness" in record["tables"]:
        rows = json.loads((out / "correctness.json").read_text())["rows"]
        record["checks_passed"] = sum(row[1] == "passed" for row in rows)
        record["checks_failed"] = [row[0] for row in rows if row[1] != "passed"]
    return record


def correctness_failed(records: list[dict]) -> bool:
    return any(r["part"] == "correctness" and (r["status"] != "ok" or r.get("checks_failed")) for r in records)


def write_summary(out: Path, records: list[dict], smoke: bool) -> str:
    rows = []
    for record in records:
        checks = ""
        if "checks_passed" in record:
            failed = record["checks_failed"]
            checks = f"{record['checks_passed']} passed" + (f", failed: {', '.join(failed)}" if failed else "")
        tables = ", ".join(record["tables"]) or "none"
        rows.append(
            [record["part"], record["status"], f"{record['seconds']:.0f}", f"{record['budget_s']:.0f}", tables, checks]
        )
    total = sum(record["seconds"] for record in records)
    notes = [f"total {total:.0f} s of parts; correctness failed: {'yes' if correctness_failed(records) else 'no'}"]
    return report.write(str(out), "gpu_check", SUMMARY_COLUMNS, rows, {"smoke": smoke}, notes)


def run(parts: list[Part], out: Path, smoke: bool = False) -> int:
    """Run `parts` in order, the summary rewritten after each; the exit status."""
    out.mkdir(parents=True, exist_ok=True)
    records = []
    for part in parts:
        print(f"gpu-check: part {part.name} (limit {part.budget_s:.0f} s)", flush=True)
        records.append(run_part(part, out))
        print(f"gpu-check: part {part.name}: {records[-1]['status']} in {records[-1]['seconds']:.0f} s", flush=True)
        write_summary(out, records, smoke)
    if correctness_failed(records):
        return 1
    return 2 if any(record["status"] != "ok" for record in records) else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory of the tables, logs and summary")
    parser.add_argument("--parts", nargs="+", help="run only these parts (default: all, in order)")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny sizes: checks that every part runs")
    args = parser.parse_args()
    parts = smoke_parts() if args.smoke else gpu_parts()
    names = [part.name for part in parts]
    unknown = sorted(set(args.parts or []) - set(names))
    if unknown:
        parser.error(f"unknown parts {unknown}; the parts are {names}")
    selected = [part for part in parts if args.parts is None or part.name in args.parts]
    raise SystemExit(run(selected, args.out, args.smoke))


if __name__ == "__main__":
    main()
