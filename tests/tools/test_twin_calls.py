"""The GPU twin's device calls (tools/twin/gpu_twin.py) on CPU, with tests/sweep_fake_runs.py in
place of `longctx pretrain | sft | niah`: a seed runs and is archived (<= the size limit,
no checkpoints), a rerun skips it, a killed call's seed starts again from scratch without
touching a finished seed, a seed that does not fit moves the plan to its next cut, a
failing job leaves the cut alone, the tuning mode applies its rule, and the report reads
the archives. The sweeps are real sweep files (longctx.sweep.spec) written here."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import yaml

from longctx_replication import twin_tuning
from longctx_replication.seed_archive import archive_path, read_manifest
from longctx_replication.twin_plan import load_plan
from tests.tools.helpers import TOOLS, twin

gpu_twin, lease = twin("gpu_twin"), twin("lease")
FAKE = Path(__file__).parents[1] / "sweep_fake_runs.py"
WINDOWS = [64, 128]


def _sweep(path: Path, name: str, parameters: dict, command: list[str]) -> str:
    body = {
        "name": name,
        "method": "grid",
        "parameters": {k: {"values": v} for k, v in parameters.items()},
        "command": ["${interpreter}", str(FAKE), *command, "${args_no_hyphens}"],
    }
    path.write_text(yaml.safe_dump(body))
    return str(path)


@pytest.fixture
def plan_file(tmp_path, monkeypatch):
    """A plan of two verdict seeds over fake sweeps rooted in tmp_path; short stop times."""
    root = tmp_path / "runs"
    seeds = [10, 11]
    pretrain = _sweep(
        tmp_path / "pre.yaml",
        "pre",
        {"data.window": WINDOWS, "train.seed": seeds},
        ["pretrain", f"train.out_dir={root}/pretrain/w${{data.window}}_s${{train.seed}}", "train.max_steps=99"],
    )
    sft = _sweep(
        tmp_path / "sft.yaml",
        "sft",
        {"sft.variant": ["normal", "skipalign"], "sft.rope_extension": ["ntk"], "train.seed": seeds},
        ["sft", f"init={root}/pretrain/w128_s${{train.seed}}/checkpoints/last.ckpt",
         f"train.out_dir={root}/sft/${{sft.variant}}-${{sft.rope_extension}}/s${{train.seed}}"],
    )  # fmt: skip
    table1 = _sweep(
        tmp_path / "table1.yaml",
        "table1",
        {"eval.position_method.name": ["rope", "string"], "train.seed": seeds},
        ["niah", "fake.window=128", f"eval.out_dir={root}/table1/s${{train.seed}}/name=${{eval.position_method.name}}"],
    )
    plan = {
        "root": str(root),
        "archives": str(tmp_path / "archives"),
        "pretrain_sweep": pretrain,
        "eval_sweeps": [sft, table1],
        "seeds": seeds,
        "tuning": {
            "seeds": [100, 101],
            "window": 128,
            "stop_at_step": 5,
            "threshold": 2.0,
            "without": "without",
            "arms": {"without": ["train.max_steps=10"], "with": ["train.max_steps=10"]},
        },
    }
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    budget = {"budget_s": 120, "max_steps_cuts": [10, 6], "archive_max_bytes": 2**20}
    (tmp_path / "lease.yaml").write_text(yaml.safe_dump(budget))
    monkeypatch.setattr(gpu_twin, "MIN_START_S", 0.0)
    monkeypatch.setattr(gpu_twin, "STOP_BEFORE_S", 1.0)
    monkeypatch.setattr(gpu_twin, "ARCHIVE_RESERVE_S", 0.5)
    monkeypatch.setattr(twin_tuning, "LAUNCHER", (sys.executable, str(FAKE)))
    monkeypatch.setenv("LONGCTX_COMMIT", "abc123")
    monkeypatch.setenv("FAKE_STEP_S", "0")
    return path


def _lease_file(plan_file):
    return plan_file.parent / "lease.yaml"


def _cut(plan_file):
    return lease.cut_in_force(lease.load_lease(_lease_file(plan_file)), load_plan(plan_file).archives)


def _call(plan_file, out, *extra):
    return gpu_twin.main(["--plan", str(plan_file), "--lease", str(_lease_file(plan_file)), "--out", str(out), *extra])


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_seed_is_archived_without_checkpoints_and_a_rerun_skips_it(plan_file, tmp_path):
    plan = load_plan(plan_file)
    assert _call(plan_file, tmp_path / "out1") == 0
    archive = archive_path(plan.archives, 10)
    assert archive.stat().st_size <= lease.load_lease(_lease_file(plan_file)).archive_max_bytes
    assert sorted(p.name for p in (tmp_path / "out1").iterdir()) == [
        "seed-10.tar.xz",
        "twin_status.json",
        "twin_status.md",
    ]
    assert _digest(tmp_path / "out1" / "seed-10.tar.xz") == _digest(archive)
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert "pretrain/w128_s10/metrics.jsonl" in names and "pretrain/w64_s10/answer_masking.json" in names
    assert "pretrain/w128_s10/niah/step-0000010/niah.json" in names
    assert "pretrain/w128_s10/fi/fi-step-0000005.npz" in names
    assert "sft/skipalign-ntk/s10/niah_after_sft/niah.json" in names and "table1/s10/name=string/niah.json" in names
    assert not [n for n in names if "checkpoints" in n or "wandb" in n or n.endswith(".png") or "_s11" in n]
    manifest = read_manifest(archive)
    assert (manifest["seed"], manifest["max_steps"], manifest["commit"], manifest["left_out"]) == (10, 10, "abc123", [])
    body = json.loads((tmp_path / "out1" / "twin_status.json").read_text())
    assert body["state"].startswith("seed 10 archived") and {r["state"] for r in body["jobs"]} == {"done"}

    assert _call(plan_file, tmp_path / "out2") == 0  # the next call takes the next seed
    assert read_manifest(archive_path(plan.archives, 11))["seed"] == 11
    before = {p: p.stat().st_mtime_ns for p in plan.root.rglob("metrics.jsonl")}
    assert _call(plan_file, tmp_path / "out3") == 0
    assert json.loads((tmp_path / "out3" / "twin_status.json").read_text())["state"].startswith("complete")
    assert {p: p.stat().st_mtime_ns for p in plan.root.rglob("metrics.jsonl")} == before  # nothing ran again


def test_a_killed_call_s_seed_starts_again_from_scratch_and_a_finished_seed_is_untouched(plan_file, tmp_path):
    plan = load_plan(plan_file)
    assert _call(plan_file, tmp_path / "out1") == 0
    archived = _digest(archive_path(plan.archives, 10))
    finished_run = plan.root / "pretrain" / "w128_s10" / "metrics.jsonl"
    finished_text = finished_run.read_text()
    env = {**os.environ, "FAKE_STEP_S": "1.0", "PYTHONPATH": os.pathsep.join(sys.path)}
    argv = [
        sys.executable,
        str(TOOLS / "twin" / "gpu_twin.py"),
        "--plan",
        str(plan_file),
        "--lease",
        str(_lease_file(plan_file)),
        "--out",
        str(tmp_path / "o"),
    ]
    argv += ["--budget-s", "300"]  # in its own process the 90 s MIN_START_S holds
    driver = subprocess.Popen(argv, env=env, process_group=0, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    partial = plan.root / "pretrain" / "w128_s11" / "metrics.jsonl"
    deadline = time.monotonic() + 60
    while (not partial.is_file() or partial.read_text().count("\n") < 2) and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(driver.pid, signal.SIGKILL)  # the device call dies: driver and runs at once
    driver.wait()
    killed_steps = partial.read_text().count("\n")
    assert 2 <= killed_steps < 10 and not archive_path(plan.archives, 11).exists()
    orphans = [int(p.read_text()) for p in (plan.root / "logs").glob("pre_*seed-11.pid")]
    assert orphans and all(gpu_twin.running(pid) for pid in orphans)  # the runs outlived their driver

    assert _call(plan_file, tmp_path / "out2") == 0
    assert not any(gpu_twin.running(pid) for pid in orphans)  # stopped before their seed restarted
    steps = [json.loads(line)["step"] for line in partial.read_text().splitlines()]
    assert steps == list(range(1, 11))  # from step 1 again, not appended to the killed run's lines
    assert _digest(archive_path(plan.archives, 10)) == archived and finished_run.read_text() == finished_text


def test_a_seed_that_does_not_fit_records_its_cut_and_runs_again_at_the_next(plan_file, tmp_path, monkeypatch):
    plan = load_plan(plan_file)
    monkeypatch.setenv("FAKE_STEP_S", "0.5")  # 10 steps take 5 s, the call has 3
    assert _call(plan_file, tmp_path / "out1", "--budget-s", "3") == 3
    assert sorted(p.name for p in (tmp_path / "out1").iterdir()) == ["cuts.json", "twin_status.json", "twin_status.md"]
    too_long = json.loads((tmp_path / "out1" / "cuts.json").read_text())["too_long"]
    assert list(too_long) == ["10"] and too_long["10"]["seed"] == 10
    assert all(0 < s < 10 for s in too_long["10"]["steps"].values())
    assert _cut(plan_file) == 6 and not archive_path(plan.archives, 10).exists()

    monkeypatch.setenv("FAKE_STEP_S", "0")
    assert _call(plan_file, tmp_path / "out2") == 0
    assert read_manifest(archive_path(plan.archives, 10))["max_steps"] == 6
    rows = (plan.root / "pretrain" / "w64_s10" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in rows] == [1, 2, 3, 4, 5, 6]


def test_a_failing_job_leaves_the_cut_alone_and_brings_its_log_back(plan_file, tmp_path, monkeypatch):
    plan = load_plan(plan_file)
    monkeypatch.setenv("FAKE_FAIL", "w128_s10")
    assert _call(plan_file, tmp_path / "out") == 1
    body = json.loads((tmp_path / "out" / "twin_status.json").read_text())
    states = {row["job"]: row["state"] for row in body["jobs"]}
    assert states["pre_window-128_seed-10"] == "failed" and states["pre_window-64_seed-10"] == "done"
    assert {s for j, s in states.items() if not j.startswith("pre_")} == {"blocked"}
    assert "fake failure" in next(r["log_tail"] for r in body["jobs"] if r["state"] == "failed")
    assert _cut(plan_file) == 10 and not (plan.archives / "cuts.json").exists()


def test_the_tuning_call_applies_the_committed_rule(plan_file, tmp_path):
    assert _call(plan_file, tmp_path / "out", "--tuning") == 0
    verdict = json.loads((tmp_path / "out" / "tuning.json").read_text())
    # the fake's answer loss at step 5 of a 10-step schedule: 2.3 - 5/10 = 1.8, under 2.0 in both seeds
    assert verdict["at_stop"]["without"] == {"100": pytest.approx(1.8), "101": pytest.approx(1.8)}
    assert verdict["adopt"] is False and verdict["seeds_above"] == []
    assert "keep" in (tmp_path / "out" / "tuning.md").read_text()
    assert _call(plan_file, tmp_path / "out2", "--tuning") == 0  # judged once: a rerun runs nothing
    assert "already judged" in (tmp_path / "out2" / "twin_status.md").read_text()


def test_the_report_runs_on_the_archives_alone(plan_file, tmp_path):
    plan = load_plan(plan_file)
    assert _call(plan_file, tmp_path / "out1") == 0 and _call(plan_file, tmp_path / "out2") == 0
    for path in sorted(plan.root.iterdir(), reverse=True):  # the runs are gone; the archives remain
        subprocess.run(["rm", "-r", str(path)], check=True)
    docs = tmp_path / "docs"
    assert (
        gpu_twin.main(
            ["--plan", str(plan_file), "--lease", str(_lease_file(plan_file)), "--report", "--docs", str(docs)]
        )
        == 0
    )
    summary = json.loads((docs / "replication_summary_gpu.json").read_text())
    assert summary["meta"]["seeds"] == [10, 11] and summary["meta"]["windows"] == WINDOWS
    assert summary["meta"]["commit"] == "seed 10 at abc123 (10 steps); seed 11 at abc123 (10 steps)"
    # the fakes' Table 1 at L=128: rope 40 + seed % 3 of 50, string 45 + seed % 3
    assert summary["meta"]["table1"]["string"] == {"10": [46, 50], "11": [47, 50]}
    assert (docs / "replication" / "gpu" / "results.md").is_file()
