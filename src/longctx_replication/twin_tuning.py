"""The GPU twin's first job: does the twin need the CPU recipe's two levers?

    python tools/twin/gpu_twin.py --tuning --out "$OUT"      # one device call

The CPU miniature left chance only with the `repeat` copying drill as a third source and
model.init_std 0.06 (docs/replication.md; docs/design.md §13). The twin is 30x wider and
reads prose as well, so it may not need them. The job trains the plan's tuning seeds
(never verdict seeds) at the largest window, each in two arms side by side: `without`
(experiments/replicate/gpu_base.yaml as committed) and `with` (gpu_drill.yaml: the drill
and init 0.06), each to `stop_at_step` (train.stop_at_step: the learning-rate schedule
still spans the full run's max_steps, so step 300 is step 300 of the verdict recipe).

The rule, committed before the job (docs/replication.md, "The GPU twin"): **adopt the
levers when the held-out answer loss (answers/loss) of the `without` arm at stop_at_step
is above the threshold (2.0 nats; chance is ln 10 = 2.30) in any tuning seed.** The `with`
arm is reported beside it, not judged. Adopting means committing the drill and init 0.06
into gpu_base.yaml before any verdict seed runs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from longctx_replication.side_by_side import Job
from longctx_replication.twin_plan import TwinPlan, TwinPlanError

TUNING_FILE = "tuning.json"
LAUNCHER = (sys.executable, "-m", "longctx")
"""How a tuning job starts `longctx` (the driver's tests put a stand-in here)."""


def tuning_jobs(plan: TwinPlan, wandb_mode: str = "disabled") -> list[Job]:
    """One pretraining job per tuning seed and arm, under ROOT/tuning/<arm>_s<seed>."""
    tuning = plan.tuning
    jobs = []
    for seed in tuning.seeds:
        for arm, argv in tuning.arms.items():
            out_dir = plan.root / "tuning" / f"{arm}_s{seed}"
            command = [
                *LAUNCHER,
                "pretrain",
                *argv,
                f"data.window={tuning.window}",
                f"train.seed={seed}",
                f"train.stop_at_step={tuning.stop_at_step}",
                "probe.niah_every_steps=0",
                "train.resume=auto",
                f"train.out_dir={out_dir}",
                f"log.run_name=twin_tuning_{arm}_s{seed}",
                f"log.wandb_mode={wandb_mode}",
            ]
            jobs.append(Job(f"tuning_{arm}_s{seed}", command, out_dir))
    return jobs


def answer_losses(run_dir: Path) -> list[tuple[int, float]]:
    """(step, answers/loss) of every answer probe in the run's metrics.jsonl."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill
        if "answers/loss" in record:
            rows.append((int(record["step"]), float(record["answers/loss"])))
    return rows


def tuning_verdict(plan: TwinPlan, losses: dict[tuple[str, int], list[tuple[int, float]]]) -> dict:
    """The committed rule on {(arm, seed): answer-loss probes}: adopt when the `without`
    arm's loss at stop_at_step is above the threshold in any tuning seed."""
    tuning = plan.tuning
    at_stop: dict[str, dict[str, float | None]] = {}
    for arm in tuning.arms:
        at_stop[arm] = {}
        for seed in tuning.seeds:
            found = [loss for step, loss in losses.get((arm, seed), []) if step == tuning.stop_at_step]
            at_stop[arm][str(seed)] = found[-1] if found else None
    without = at_stop[tuning.without]
    missing = [seed for seed, loss in without.items() if loss is None]
    if missing:
        raise TwinPlanError(
            f"the {tuning.without!r} arm has no answer probe at step {tuning.stop_at_step} for seeds {missing}: "
            "the rule cannot be read (is probe.answer_every_steps a divisor of tuning.stop_at_step?)"
        )
    above = [seed for seed, loss in without.items() if loss is not None and loss > tuning.threshold]
    return {
        "rule": f"adopt the levers when the {tuning.without!r} arm's answers/loss at step {tuning.stop_at_step} "
        f"is above {tuning.threshold} in any tuning seed",
        "at_stop": at_stop,
        "seeds_above": above,
        "adopt": bool(above),
        "curves": {f"{arm}_s{seed}": rows for (arm, seed), rows in sorted(losses.items())},
    }


def tuning_markdown(verdict: dict, stop_at_step: int) -> str:
    arms = list(verdict["at_stop"])
    seeds = list(next(iter(verdict["at_stop"].values())))
    lines = [f"Held-out answer loss at step {stop_at_step} (nats per value token; chance 2.30):", ""]
    lines += ["| arm | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|---" * (len(seeds) + 1) + "|"]
    for arm in arms:
        cells = ["-" if v is None else f"{v:.3f}" for v in verdict["at_stop"][arm].values()]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    decision = "**adopt** the drill and init 0.06" if verdict["adopt"] else "**keep** gpu_base.yaml as it is"
    lines += ["", f"Rule: {verdict['rule']}. Verdict: {decision}."]
    return "\n".join(lines) + "\n"
