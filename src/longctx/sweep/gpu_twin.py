"""The GPU twin of the replication, side by side and resumable across device calls.

    python -m longctx.sweep.gpu_twin --budget-s 540 --out "$OUT"     # repeat until "complete"
    python -m longctx.sweep.gpu_twin --dry-run                       # the jobs, nothing run

The jobs are exactly the points of sweeps/replicate_gpu*.yaml (what `make replicate-gpu`
runs one at a time), with `train.resume=auto` on the training jobs and W&B off (the GPU
image has no wandb; the report reads the runs' own files). Phase 1 trains the nine
pretraining runs (3 windows x 3 seeds) at once; phase 2 runs, once a seed's largest-window
model is done (the 4K runs are the slowest, so in practice once phase 1 ends), its three
SFT arms and five Table 1 evaluations (at most `--max-parallel` processes at a time);
phase 3, once every job is done, the report (`longctx.analysis.replication_report ...
--name gpu`). Each call runs what is left within
`--budget-s` (side_by_side.py: SIGTERM and a checkpoint before the deadline, done jobs
skipped), so calling it again on the same warm machine continues where the last call
stopped; on a fresh machine it starts over.

Checkpoints never leave the machine. `--out` receives at most MAX_OUT_FILES files, each
under MAX_OUT_BYTES: twin_status.json / .md (every job's state, last step, loss, tokens/s,
MFU, answer loss and effective length, from its metrics.jsonl, and the call's timing) and,
after the report, replication_summary_gpu.json, results.md and its figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from longctx.replication import checkout_commit
from longctx.sweep.runner import plan
from longctx.sweep.side_by_side import DONE_FILE, Job, Outcome, run_side_by_side
from longctx.sweep.spec import load_sweep

ROOT = Path("runs/replicate_gpu")
"""Where sweeps/replicate_gpu*.yaml write their runs."""
PRETRAIN_SWEEP = "sweeps/replicate_gpu.yaml"
EVAL_SWEEPS = (
    "sweeps/replicate_gpu_sft.yaml",
    "sweeps/replicate_gpu_sft_plain.yaml",
    "sweeps/replicate_gpu_table1.yaml",
)
"""Longest first: the SFT arms (training and an NIAH search to 8K), then Table 1's evaluations."""
MAX_OUT_FILES = 8
MAX_OUT_BYTES = 16 * 2**20
REPORT_RESERVE_S = 60.0
"""Seconds of the budget kept for the report and the copy to --out."""
STATUS_METRICS = ("train/loss", "perf/mfu", "answers/loss", "niah/effective_length")


_INTERPOLATION = re.compile(r"\$\{([^}]+)\}")


def _option(argv: list[str], key: str, arguments: dict | None = None) -> str:
    """The value of `key=` in argv, with the sweep's `${parameter}` references filled in
    (the config loader resolves them the same way)."""
    value = next(word.split("=", 1)[1] for word in argv if word.startswith(f"{key}="))
    return _INTERPOLATION.sub(lambda match: str((arguments or {})[match.group(1)]), value)


def _jobs(sweep_path: str, extra: list[str], needs_of: Callable[[dict], tuple[Path, ...]] | None = None) -> list[Job]:
    sweep = load_sweep(sweep_path)
    jobs = []
    for point in plan(sweep):
        argv = [*point.command, *extra]
        key = "eval.out_dir" if any(w.startswith("eval.out_dir=") for w in argv) else "train.out_dir"
        out_dir = Path(_option(argv, key, point.arguments))
        name = "_".join(f"{k.rsplit('.', 1)[-1]}-{v}" for k, v in sorted(point.arguments.items()))
        needs = needs_of(point.arguments) if needs_of else ()
        jobs.append(Job(f"{Path(sweep_path).stem}_{name}", argv, out_dir, needs))
    return jobs


def twin_jobs(wandb_mode: str = "disabled", overrides: tuple[str, ...] = ()) -> tuple[list[Job], list[Job]]:
    """(pretraining jobs, evaluation jobs); `overrides` go to the pretraining jobs only."""
    log = f"log.wandb_mode={wandb_mode}"
    pretrain = _jobs(PRETRAIN_SWEEP, ["train.resume=auto", log, *overrides])
    largest = max(int(_option(job.argv, "data.window")) for job in pretrain)

    def base_model(arguments: dict) -> tuple[Path, ...]:
        return (ROOT / "pretrain" / f"w{largest}_s{arguments['train.seed']}" / DONE_FILE,)

    evaluations = []
    for path in EVAL_SWEEPS:
        extra = [log] if "table1" in path else ["train.resume=auto", log]
        evaluations += _jobs(path, extra, base_model)
    return pretrain, evaluations


def _progress(job: Job) -> dict:
    """The last value of each STATUS_METRICS, the last step and the median tokens/s."""
    path = job.out_dir / "metrics.jsonl"
    found: dict = {}
    speeds = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a kill
            found["step"] = max(found.get("step", 0), record.get("step", 0))
            found.update({k: record[k] for k in STATUS_METRICS if k in record})
            if "perf/tokens_per_s" in record:
                speeds.append(record["perf/tokens_per_s"])
    if speeds:
        found["tokens_per_s_median"] = statistics.median(speeds)
    return found


def status(jobs: list[Job], outcomes: dict[str, Outcome], meta: dict, pretrain: list[Job]) -> dict:
    """The call's state, `meta` and one row per job; the summed median tokens/s of the
    pretraining runs (what the budget in experiments/replicate/gpu_base.yaml assumes)."""
    rows = []
    for job in jobs:
        outcome = outcomes.get(job.name) or Outcome(job.name, "skipped" if job.done else "pending")
        rows.append({"job": job.name, "state": outcome.state, "seconds": round(outcome.seconds, 1), **_progress(job)})
    names = {job.name for job in pretrain}
    speeds = [row.get("tokens_per_s_median", 0.0) for row in rows if row["job"] in names]
    return {**meta, "pretrain_tokens_per_s_sum_of_medians": sum(speeds), "jobs": rows}


def status_markdown(body: dict) -> str:
    lines = [f"# GPU twin status ({body['state']})", ""]
    lines += [f"- {key}: {body[key]}" for key in body if key not in ("jobs", "state")]
    columns = ["job", "state", "seconds", "step", *STATUS_METRICS, "tokens_per_s_median"]
    lines += ["", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in body["jobs"]:
        cells = [row.get(c, "") for c in columns]
        lines.append("| " + " | ".join(f"{c:.4g}" if isinstance(c, float) else str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _report(seconds: float) -> tuple[str, list[Path]]:
    """Run the report into ROOT/docs; its state and the files it wrote."""
    docs = ROOT / "docs"
    argv = [
        sys.executable,
        "-m",
        "longctx.analysis.replication_report",
        str(ROOT),
        "--docs",
        str(docs),
        "--name",
        "gpu",
    ]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=max(seconds, 1.0))
    except subprocess.TimeoutExpired:
        return "report timed out", []
    if done.returncode:
        return f"report failed: {done.stderr.strip()[-800:]}", []
    figures = sorted((docs / "replication" / "gpu").glob("*.png"))
    return "complete", [docs / "replication_summary_gpu.json", docs / "replication" / "gpu" / "results.md", *figures]


def copy_out(files: list[Path], out: Path) -> list[str]:
    """Copy up to MAX_OUT_FILES files (each under MAX_OUT_BYTES) flat into `out`; the
    names of those left out, with why."""
    out.mkdir(parents=True, exist_ok=True)
    left_out = []
    for path in files:
        if not path.is_file():
            left_out.append(f"{path} (missing)")
        elif path.stat().st_size > MAX_OUT_BYTES:
            left_out.append(f"{path} (over {MAX_OUT_BYTES} bytes)")
        elif len(list(out.iterdir())) >= MAX_OUT_FILES:
            left_out.append(f"{path} (over {MAX_OUT_FILES} files)")
        else:
            shutil.copy2(path, out / path.name)
    return left_out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="key=value for the pretraining runs (e.g. train.max_steps=800)")
    parser.add_argument("--budget-s", type=float, default=540.0, help="wall-clock seconds this call may use")
    parser.add_argument("--out", type=Path, default=ROOT / "out", help="where the status, summary and figures go")
    parser.add_argument("--max-parallel", type=int, default=9, help="processes at a time")
    parser.add_argument("--wandb-mode", default="disabled", help="log.wandb_mode of every job")
    parser.add_argument("--dry-run", action="store_true", help="print the jobs and their state, run nothing")
    args = parser.parse_args(argv)
    start = time.monotonic()
    pretrain, evaluations = twin_jobs(args.wandb_mode, tuple(args.overrides))
    jobs = pretrain + evaluations
    if args.dry_run:
        for job in jobs:
            print(f"{'done' if job.done else 'to run':8} {job.name:45} {job.out_dir}")
        return 0
    env = {
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.max_parallel)))
    }
    deadline = start + args.budget_s - REPORT_RESERVE_S
    outcomes: dict[str, Outcome] = {}
    for phase in (pretrain, evaluations):  # an evaluation whose base model is not done is `blocked`
        found = run_side_by_side(phase, deadline, ROOT / "logs", max_parallel=args.max_parallel, env=env)
        outcomes.update({o.name: o for o in found})
    finished = all(job.done for job in jobs)
    state, files = _report(start + args.budget_s - time.monotonic() - 5) if finished else ("running", [])
    meta = {"state": state, "commit": checkout_commit(Path.cwd()), "call_seconds": round(time.monotonic() - start, 1)}
    body = status(jobs, outcomes, meta, pretrain)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "twin_status.json").write_text(json.dumps(body, indent=2) + "\n")
    (out / "twin_status.md").write_text(status_markdown(body))
    left_out = copy_out(files, out)
    if left_out:
        body["left_out"] = left_out
        (out / "twin_status.json").write_text(json.dumps(body, indent=2) + "\n")
    print(status_markdown(body))
    return 0 if state in ("running", "complete") else 1


if __name__ == "__main__":
    raise SystemExit(main())
