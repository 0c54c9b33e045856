"""The GPU twin of the replication, one verdict seed per device call.

    python tools/twin/gpu_twin.py --tuning --out "$OUT"      # first job: the recipe rule
    python tools/twin/gpu_twin.py --out "$OUT"               # once per seed until all archived
    python tools/twin/gpu_twin.py --report                   # on CPU, from the committed archives
    python tools/twin/gpu_twin.py --dry-run                  # the next call's jobs, nothing run

The lender's calls are short (one command's limit and what comes back: tools/lender.toml)
and a fresh machine keeps nothing of the last. So the unit of resumption is **one seed
finished on one machine**: a call takes the first seed of the plan
(sweeps/gpu_twin/plan.yaml, longctx_replication/twin_plan.py) with no archive under ARCHIVES
(docs/replication/gpu/), deletes whatever an earlier call left of that seed's runs, and runs
them from scratch within the lease's `budget_s` (tools/twin/lease.yaml, lease.py): its
three pretraining runs side by side (the points of the pretraining sweep for that seed,
`train.max_steps` at the cut in force), then, once its largest-window model is done, its
SFT arms and Table 1 evaluations (longctx_replication/side_by_side.py: SIGTERM
STOP_BEFORE_S before the deadline). A seed whose jobs all finish becomes one archive of its
records (longctx_replication/seed_archive.py: metrics, f(i), NIAH and answer-loss files, no
checkpoints, within the lease's archive_max_bytes) in ARCHIVES and in `--out`; commit it,
and the next call, on any machine, skips that seed. A seed that did not finish in time
records its cut as too long in ARCHIVES/cuts.json (also in `--out`: commit it); the next
call runs it again at the next, smaller cut of the lease. Seeds finished before are never
touched. A job that fails by itself leaves the cut alone (`failed`: fix, rerun).

`--out` receives at most the lender's files_back files: twin_status.json / .md (every job's state,
last step, loss, tokens/s, MFU, answer loss, effective length, the log tail of a failed
job), and seed-<s>.tar.xz or cuts.json. `--report` (CPU) extracts every committed archive
into a temporary root and runs `longctx_replication.report ROOT --docs docs
--name gpu` on it, with LONGCTX_COMMIT naming the commits the seeds ran on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from longctx.sweep.runner import plan as sweep_points
from longctx.sweep.spec import load_sweep
from longctx_replication.findings import checkout_commit
from longctx_replication.seed_archive import archive_path, extract_seed_archives, finished_seeds
from longctx_replication.side_by_side import DONE_FILE, Job, Outcome, run_side_by_side
from longctx_replication.twin_plan import TwinPlan, TwinPlanError, load_plan
from longctx_replication.twin_tuning import TUNING_FILE, answer_losses, tuning_jobs, tuning_markdown, tuning_verdict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/: lender.py
import lender
from lease import LEASE, Lease, LeaseError, cut_in_force, fit_seed_archive, load_lease, record_too_long

PLAN = Path("sweeps/gpu_twin/plan.yaml")
TERMS = lender.load()
MAX_OUT_FILES = TERMS.files_back
MAX_OUT_BYTES = TERMS.file_mib * 2**20
ARCHIVE_RESERVE_S = 30.0
"""Seconds of the budget kept for the archive and the copy to --out."""
STOP_BEFORE_S = 45.0
"""SIGTERM this long before the deadline (a training run saves last.ckpt and exits)."""
MIN_START_S = 90.0
"""No job starts with less time left (it would only pay its start-up)."""
STATUS_METRICS = ("train/loss", "perf/mfu", "answers/loss", "niah/effective_length")
LOG_TAIL_CHARS = 2000

_INTERPOLATION = re.compile(r"\$\{([^}]+)\}")


def _option(argv: list[str], key: str, arguments: dict | None = None) -> str:
    """The value of `key=` in argv, with the sweep's `${parameter}` references filled in
    (the config loader resolves them the same way)."""
    value = next(word.split("=", 1)[1] for word in argv if word.startswith(f"{key}="))
    return _INTERPOLATION.sub(lambda match: str((arguments or {})[match.group(1)]), value)


def _jobs(sweep_path: str, seed: int, extra: list[str], needs: tuple[Path, ...] = ()) -> list[Job]:
    """The points of a sweep with `train.seed` = `seed`, as jobs with `extra` appended."""
    jobs = []
    for point in sweep_points(load_sweep(sweep_path)):
        if int(point.arguments["train.seed"]) != seed:
            continue
        argv = [*point.command, *extra]
        key = "eval.out_dir" if any(w.startswith("eval.out_dir=") for w in argv) else "train.out_dir"
        out_dir = Path(_option(argv, key, point.arguments))
        name = "_".join(f"{k.rsplit('.', 1)[-1]}-{v}" for k, v in sorted(point.arguments.items()))
        jobs.append(Job(f"{Path(sweep_path).stem}_{name}", argv, out_dir, needs))
    return jobs


def seed_jobs(plan: TwinPlan, seed: int, cut: int, wandb_mode: str = "disabled") -> tuple[list[Job], list[Job]]:
    """(pretraining jobs, SFT and Table 1 jobs) of one seed; the pretraining runs train
    `cut` steps; the others wait for the largest window's model."""
    log = f"log.wandb_mode={wandb_mode}"
    pretrain = _jobs(plan.pretrain_sweep, seed, ["train.resume=auto", log, f"train.max_steps={cut}"])
    if not pretrain:
        raise TwinPlanError(f"{plan.pretrain_sweep} has no point with train.seed={seed}")
    largest = max(int(_option(job.argv, "data.window")) for job in pretrain)
    base = (plan.root / "pretrain" / f"w{largest}_s{seed}" / DONE_FILE,)
    evaluations = []
    for path in plan.eval_sweeps:
        extra = [log] if "table1" in path else ["train.resume=auto", log]
        evaluations += _jobs(path, seed, extra, base)
    for job in pretrain + evaluations:
        if plan.root not in job.out_dir.parents:
            raise TwinPlanError(f"{job.name} writes to {job.out_dir}, outside the plan's root {plan.root}")
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
    """The call's state, `meta` and one row per job (a failed job's log tail with it); the
    summed median tokens/s of the pretraining runs (what gpu_base.yaml's budget assumes)."""
    rows = []
    for job in jobs:
        outcome = outcomes.get(job.name) or Outcome(job.name, "skipped" if job.done else "pending")
        row = {"job": job.name, "state": outcome.state, "seconds": round(outcome.seconds, 1), **_progress(job)}
        if outcome.state == "failed" and outcome.log and Path(outcome.log).is_file():
            row["log_tail"] = Path(outcome.log).read_text(errors="replace")[-LOG_TAIL_CHARS:]
        rows.append(row)
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
    for row in body["jobs"]:
        if "log_tail" in row:
            lines += ["", f"## {row['job']} (failed): end of its log", "", "```", row["log_tail"], "```"]
    return "\n".join(lines) + "\n"


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


def _write_status(body: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "twin_status.json").write_text(json.dumps(body, indent=2) + "\n")
    (out / "twin_status.md").write_text(status_markdown(body))
    print(status_markdown(body))


def _run_phases(phases: list[list[Job]], deadline: float, plan: TwinPlan, max_parallel: int) -> dict[str, Outcome]:
    env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max_parallel)))}
    outcomes: dict[str, Outcome] = {}
    for phase in phases:  # a job whose needs are missing is `blocked`
        found = run_side_by_side(
            phase,
            deadline,
            plan.root / "logs",
            max_parallel=max_parallel,
            stop_before_s=STOP_BEFORE_S,
            min_start_s=MIN_START_S,
            env=env,
        )
        outcomes.update({o.name: o for o in found})
    return outcomes


def running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (an exited child nobody reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def stop_leftovers(job: Job, log_dir: Path, wait_s: float = 10.0) -> None:
    """SIGKILL the process group a killed call left running for `job` (its pid file in
    `log_dir`), if that process is still the job's: its command line is the job's. A
    fresh machine has none."""
    pid_file = log_dir / f"{job.name}.pid"
    if not pid_file.is_file():
        return
    pid = int(pid_file.read_text())
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return  # gone
    if command != job.argv:
        return  # gone, or the id now belongs to another process
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    stop = time.monotonic() + wait_s
    while running(pid) and time.monotonic() < stop:
        time.sleep(0.05)


def run_seed(plan: TwinPlan, lease: Lease, out: Path, budget_s: float, max_parallel: int, wandb_mode: str) -> int:
    """One call: the first seed without an archive, from scratch (module docstring)."""
    start = time.monotonic()
    archived = finished_seeds(plan.archives)
    left = [s for s in plan.seeds if s not in archived]
    meta: dict = {"commit": checkout_commit(Path.cwd()), "archived_seeds": archived}
    if not left:
        _write_status({"state": "complete: every seed archived; run --report on CPU", **meta, "jobs": []}, out)
        return 0
    seed, cut = left[0], cut_in_force(lease, plan.archives)
    if cut is None:
        raise LeaseError(f"every cut of {list(lease.max_steps_cuts)} is recorded too long in {plan.archives}")
    pretrain, evaluations = seed_jobs(plan, seed, cut, wandb_mode)
    jobs = pretrain + evaluations
    for job in jobs:  # a seed runs whole on one machine: what an earlier call left is dropped
        stop_leftovers(job, plan.root / "logs")
        shutil.rmtree(job.out_dir, ignore_errors=True)
    deadline = start + budget_s - ARCHIVE_RESERVE_S
    outcomes = _run_phases([pretrain, evaluations], deadline, plan, max_parallel)
    meta.update(seed=seed, max_steps=cut)
    files: list[Path] = []
    failed = [o.name for o in outcomes.values() if o.state == "failed"]
    if all(job.done for job in jobs):
        manifest_meta = {"seed": seed, "max_steps": cut, "commit": meta["commit"], "jobs": [j.name for j in jobs]}
        path = archive_path(plan.archives, seed)
        run_dirs = [j.out_dir for j in jobs]
        manifest = fit_seed_archive(plan.root, run_dirs, path, manifest_meta, lease.archive_max_bytes)
        state, code = f"seed {seed} archived ({manifest['bytes']:,} bytes)", 0
        meta["archive_left_out"] = manifest["left_out"]
        files.append(path)
    elif failed:
        state, code = f"seed {seed} failed: {', '.join(failed)}", 1
    else:
        seconds = round(time.monotonic() - start, 1)
        record = {"seed": seed, "seconds": seconds, "steps": {j.name: _progress(j).get("step", 0) for j in pretrain}}
        files.append(record_too_long(plan.archives, cut, record))
        state, code = f"seed {seed} did not finish at max_steps {cut}: commit cuts.json and call again", 3
    meta["call_seconds"] = round(time.monotonic() - start, 1)
    body = status(jobs, outcomes, {"state": state, **meta}, pretrain)
    left_out = copy_out(files, out)
    if left_out:
        body["left_out"] = left_out
    _write_status(body, out)
    return code


def run_tuning(plan: TwinPlan, lease: Lease, out: Path, budget_s: float, max_parallel: int, wandb_mode: str) -> int:
    """The first job (twin_tuning.py): the tuning arms side by side, then the rule."""
    start = time.monotonic()
    record = plan.archives / TUNING_FILE
    jobs = tuning_jobs(plan, wandb_mode)
    meta = {"commit": checkout_commit(Path.cwd()), "mode": "tuning"}
    if record.is_file():
        _write_status({"state": f"tuning already judged: {record}", **meta, "jobs": []}, out)
        return 0
    outcomes = _run_phases([jobs], start + budget_s - ARCHIVE_RESERVE_S, plan, max_parallel)
    if not all(job.done for job in jobs):
        body = status(jobs, outcomes, {"state": "tuning unfinished", **meta}, jobs)
        _write_status(body, out)
        return 1
    losses = {
        (arm, seed): answer_losses(plan.root / "tuning" / f"{arm}_s{seed}")
        for seed in plan.tuning.seeds
        for arm in plan.tuning.arms
    }
    verdict = tuning_verdict(plan, losses)
    verdict["tokens_per_s_median"] = {job.name: _progress(job).get("tokens_per_s_median") for job in jobs}
    verdict["commit"] = meta["commit"]
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(verdict, indent=1) + "\n")
    (plan.archives / "tuning.md").write_text(tuning_markdown(verdict, plan.tuning.stop_at_step))
    copy_out([record, plan.archives / "tuning.md"], out)
    body = status(jobs, outcomes, {"state": f"tuning judged: adopt={verdict['adopt']}", **meta}, jobs)
    _write_status(body, out)
    return 0


def report(plan: TwinPlan, docs: Path, name: str = "gpu") -> int:
    """The replication report from the committed archives, on CPU."""
    with tempfile.TemporaryDirectory(prefix="twin_report_") as scratch:
        manifests = extract_seed_archives(plan.archives, Path(scratch))
        commits = "; ".join(f"seed {m['seed']} at {m['commit']} ({m['max_steps']} steps)" for m in manifests)
        argv = [sys.executable, "-m", "longctx_replication.report", scratch, "--docs", str(docs)]
        done = subprocess.run([*argv, "--name", name], env={**os.environ, "LONGCTX_COMMIT": commits})
    return done.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", type=Path, default=PLAN, help="the committed plan (twin_plan.py)")
    parser.add_argument("--lease", type=Path, default=LEASE, help="the plan's lease (lease.py)")
    parser.add_argument("--budget-s", type=float, help="wall-clock seconds of this call (default: the lease's)")
    parser.add_argument("--out", type=Path, default=Path("runs/replicate_gpu_out"), help="what comes back")
    parser.add_argument("--max-parallel", type=int, default=8, help="processes at a time")
    parser.add_argument("--wandb-mode", default="disabled", help="log.wandb_mode of every job")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--tuning", action="store_true", help="the first job: the recipe rule on tuning seeds")
    mode.add_argument("--report", action="store_true", help="on CPU: the report from the committed archives")
    mode.add_argument("--dry-run", action="store_true", help="print the next call's jobs, run nothing")
    parser.add_argument("--docs", type=Path, default=Path("docs"), help="with --report: where it writes")
    args = parser.parse_args(argv)
    plan, lease = load_plan(args.plan), load_lease(args.lease)
    budget_s = args.budget_s if args.budget_s is not None else lease.budget_s
    if args.report:
        return report(plan, args.docs)
    if args.dry_run:
        left = [s for s in plan.seeds if s not in finished_seeds(plan.archives)]
        cut = cut_in_force(lease, plan.archives)
        print(f"archived: {finished_seeds(plan.archives)}; next seed: {left[:1]}; max_steps cut in force: {cut}")
        if left and cut is not None:
            pretrain, evaluations = seed_jobs(plan, left[0], cut, args.wandb_mode)
            for job in pretrain + evaluations:
                print(f"{job.name:50} {job.out_dir}")
        return 0
    run = run_tuning if args.tuning else run_seed
    return run(plan, lease, args.out, budget_s, args.max_parallel, args.wandb_mode)


if __name__ == "__main__":
    raise SystemExit(main())
