"""The GPU twin's plan: what each device call runs, fixed in a committed file before any run.

    sweeps/gpu_twin/plan.yaml     # the twin (docs/replication.md, "The GPU twin")
    sweeps/gpu_twin/smoke.yaml    # the same chain on CPU at tiny size (make replicate-twin-smoke)

Keys (every one required; an unknown or missing key is a TwinPlanError naming the file):

    root             where the sweeps write their runs (runs/replicate_gpu)
    archives         where finished seeds' archives live (docs/replication/gpu), committed
    pretrain_sweep   the sweep of the pretraining runs (one per window and seed)
    eval_sweeps      the sweeps of each seed's SFT arms and Table 1, longest first
    seeds            verdict seeds, in the order they run, one per device call
    max_steps_cuts   train.max_steps of the pretraining runs, largest first: a seed runs at
                     the first cut not recorded in ARCHIVES/cuts.json as too long; a seed that
                     does not finish within its call records its cut there and is run again,
                     from scratch, at the next cut
    budget_s         wall-clock seconds of one call (the device allows 600 per command)
    archive_max_bytes  the size limit of one seed's archive (1 MiB)
    tuning           the first job (`--tuning`): seeds (never verdict seeds), window,
                     stop_at_step, threshold and arms {name: argv after `longctx pretrain`},
                     judged by longctx_replication/twin_tuning.py
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

import yaml

from longctx.errors import LongctxError

CUTS_FILE = "cuts.json"


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
    max_steps_cuts: tuple[int, ...]
    budget_s: float
    archive_max_bytes: int
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
        max_steps_cuts=tuple(int(c) for c in body["max_steps_cuts"]),
        budget_s=float(body["budget_s"]),
        archive_max_bytes=int(body["archive_max_bytes"]),
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
    cuts = plan.max_steps_cuts
    if not cuts or any(c <= 0 for c in cuts) or list(cuts) != sorted(set(cuts), reverse=True):
        raise TwinPlanError(f"{path}: max_steps_cuts must be positive and strictly decreasing, got {list(cuts)}")
    if plan.tuning.without not in plan.tuning.arms:
        raise TwinPlanError(f"{path}: tuning.without {plan.tuning.without!r} is not one of {sorted(plan.tuning.arms)}")
    return plan


def too_long_cuts(archives: Path) -> dict[str, dict]:
    """{cut: what the call that did not finish at it recorded} from ARCHIVES/cuts.json."""
    path = archives / CUTS_FILE
    return json.loads(path.read_text())["too_long"] if path.is_file() else {}


def cut_in_force(plan: TwinPlan) -> int | None:
    """The first cut not recorded as too long; None when every cut has been."""
    too_long = too_long_cuts(plan.archives)
    return next((c for c in plan.max_steps_cuts if str(c) not in too_long), None)


def record_too_long(plan: TwinPlan, cut: int, record: dict) -> Path:
    """Record that a seed did not finish within a call at `cut` (ARCHIVES/cuts.json)."""
    too_long = {**too_long_cuts(plan.archives), str(cut): record}
    path = plan.archives / CUTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"too_long": too_long}, indent=1) + "\n")
    return path
