"""The GPU twin's driver (longctx_replication/side_by_side.py) on a real `longctx pretrain` run: stopped
at its call's deadline, resumed by the next call from last.ckpt, skipped by the third."""

import json
import sys
import time

import torch

from longctx_replication.side_by_side import Job, run_side_by_side
from tests.train.helpers import overrides

STEPS = 12


def _steps(out_dir):
    path = out_dir / "metrics.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]
    return [row["step"] for row in rows if "train/loss" in row]


def test_a_pretraining_run_stopped_by_the_budget_resumes_next_call(workspace, tmp_path):
    out = tmp_path / "run"
    args = overrides(workspace, out, **{"train.max_steps": STEPS, "log.wandb_mode": "disabled"})
    job = Job("pretrain", [sys.executable, "-m", "longctx", "pretrain", *args, "train.resume=auto"], out)
    logs = tmp_path / "logs"

    def clock():  # the call's deadline comes once the run has trained two steps
        return 1000.0 - 30.0 if len(_steps(out)) >= 2 else 0.0

    (first,) = run_side_by_side(
        [job], 1000.0, logs, max_parallel=1, stop_before_s=45, env={"OMP_NUM_THREADS": "1"}, clock=clock
    )
    assert (first.state, first.returncode) == ("stopped", 0), (logs / "pretrain.log").read_text()[-3000:]
    stopped_at = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["global_step"]
    assert 2 <= stopped_at < STEPS and not job.done

    (second,) = run_side_by_side([job], time.monotonic() + 600, logs, max_parallel=1, env={"OMP_NUM_THREADS": "1"})
    assert (second.state, second.returncode) == ("done", 0), (logs / "pretrain.log").read_text()[-3000:]
    assert _steps(out) == list(range(1, STEPS + 1))  # every step once: resumed, not restarted
    (third,) = run_side_by_side([job], time.monotonic() + 600, logs, max_parallel=1)
    assert third.state == "skipped"
