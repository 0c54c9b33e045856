"""The GPU twin's plan: what the twin runs, fixed in a committed file before any run.

    sweeps/gpu_twin/plan.yaml     # the twin (docs/replication.md, "The GPU twin")
    sweeps/gpu_twin/smoke.yaml    # the same chain on CPU at tiny size

The plan says what is studied (the sweeps, the verdict seeds, the tuning rule's arms); how
the runs are fitted into the calls of one rented machine (a call's time budget, the
max_steps cuts, the archive's size limit) is the lab's setting, kept apart in
tools/twin/ (tools/README.md), so the study reads the same on any hardware.

Keys (every one required; an unknown or missing key is a TwinPlanError naming the file):

    root             where the sweeps write their runs (runs/replicate_gpu)
    archives         where finished seeds' archives live (docs/replication/gpu), committed
    pretrain_sweep   the sweep of the pretraining runs (one per window and seed)
    eval_sweeps      the sweeps of each seed's SFT arms and Table 1, longest first
    seeds            verdict seeds, in the order they run
    tuning           the first job (`--tuning`): seeds (never verdict seeds), window,
                     stop_at_step, threshold and arms {name: argv after `longctx pretrain`},
                     judged by longctx_replication/twin_tuning.py
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import yaml

from longctx.errors import LongctxError


class TwinPlanError(LongctxError, ValueError):
    """A plan file that is malformed or contradicts itself."""


@dataclass(frozen=True)
class TuningPlan:
    seeds: tuple[int, ...]
    window: int
    stop_at_step: int
    threshold: float
    without: str
    """The arm the rule reads (the recipe without the levers)."""
    arms: dict[str, tuple[str, ...]]


@dataclass(frozen=True)
class TwinPlan:
    root: Path
    archives: Path
    pretrain_sweep: str
    eval_sweeps: tuple[str, ...]
    seeds: tuple[int, ...]
    tuning: TuningPlan


def _require(body: dict, keys: set[str], where: str) -> None:
    if not isinstance(body, dict):
        raise TwinPlanError(f"{where}: expected a mapping, got {type(body).__name__}")
    unknown, missing = set(body) - keys, keys - set(body)
    if unknown or missing:
        raise TwinPlanError(f"{where}: unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")


def load_plan(path: str | Path) -> TwinPlan:
    path = Path(path)
    body = yaml.safe_load(path.read_text())
    _require(body, {f.name for f in fields(TwinPlan)}, str(path))
    tuning = body["tuning"]
    _require(tuning, {f.name for f in fields(TuningPlan)}, f"{path}: tuning")
    plan = TwinPlan(
        root=Path(body["root"]),
        archives=Path(body["archives"]),
        pretrain_sweep=str(body["pretrain_sweep"]),
        eval_sweeps=tuple(body["eval_sweeps"]),
        seeds=tuple(int(s) for s in body["seeds"]),
        tuning=TuningPlan(
            seeds=tuple(int(s) for s in tuning["seeds"]),
            window=int(tuning["window"]),
            stop_at_step=int(tuning["stop_at_step"]),
            threshold=float(tuning["threshold"]),
            without=str(tuning["without"]),
            arms={str(k): tuple(str(w) for w in v) for k, v in tuning["arms"].items()},
        ),
    )
    if not plan.seeds or len(set(plan.seeds)) != len(plan.seeds):
        raise TwinPlanError(f"{path}: seeds must be distinct and at least one, got {list(plan.seeds)}")
    if set(plan.seeds) & set(plan.tuning.seeds):
        raise TwinPlanError(f"{path}: tuning.seeds {list(plan.tuning.seeds)} overlap the verdict seeds")
    if plan.tuning.without not in plan.tuning.arms:
        raise TwinPlanError(f"{path}: tuning.without {plan.tuning.without!r} is not one of {sorted(plan.tuning.arms)}")
    return plan
