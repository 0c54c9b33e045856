"""benchmarks/main_job_gpu.py (GPU step `main-job`) without a GPU: its CPU smoke end to end, the
rule that compares two decodings' logits, the time budget (a phase that cannot get its time
is skipped with a verdict, one past its limit stopped with every process it started)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import main_job_gpu  # noqa: E402
from niah_logits import compare_logits  # noqa: E402

PHASES = [phase.name for phase in main_job_gpu.PHASES]


def smoke(out: Path, *phases: str) -> subprocess.CompletedProcess:
    environment = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    command = [sys.executable, str(ROOT / "benchmarks" / "main_job_gpu.py"), "--smoke", "--out", str(out)]
    command += ["--work", str(out / "work"), *(["--phases", *phases] if phases else [])]
    return subprocess.run(command, env=environment, capture_output=True, text=True, timeout=2400)


def verdicts(out: Path) -> dict[str, dict]:
    return {path.stem: json.loads(path.read_text()) for path in out.glob("*.json") if path.stem in PHASES}


def check_printed_seconds(result: subprocess.CompletedProcess, phases: list[str]) -> None:
    """The smoke prints each phase's verdict and seconds (the GPU budget is planned from them)."""
    for name in phases:
        assert f"main-job: phase {name}: " in result.stdout and " s\n" in result.stdout, result.stdout


def test_the_smoke_pretrains_with_every_probe_and_decodes_the_niah_cells_in_both_modes(tmp_path):
    """The pretrain (torchrun, fsdp over gloo, f(i), NIAH and the answer probe, W&B offline)
    and the NIAH cells decoded in both modes, as the GPU step runs them."""
    result = smoke(tmp_path, "pretrain", "niah-decoding", "gpu-tests")
    assert result.returncode == 0, result.stdout + result.stderr
    check_printed_seconds(result, PHASES[:3])
    found = verdicts(tmp_path)
    assert {name: found[name]["verdict"] for name in found} == {
        "pretrain": "passed",
        "niah-decoding": "passed",
        "gpu-tests": "skipped: no CUDA",
    }
    pretrain = found["pretrain"]["checks"]
    assert pretrain["missing in metrics.jsonl"] == pretrain["missing in the W&B history"] == []
    assert pretrain["last step"] == pretrain["max_steps"]
    decoding = found["niah-decoding"]["checks"]
    assert decoding["outputs equal"] and decoding["tests"] > 0 and decoding["compared steps"] > decoding["tests"]
    assert "eager with eager" in decoding["compared"]
    summary = (tmp_path / "main_job.md").read_text()
    assert all(f"| {name} |" in summary for name in PHASES[:3])


@pytest.mark.slow
def test_the_whole_smoke_kills_and_resumes_and_writes_every_verdict(tmp_path):
    result = smoke(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    check_printed_seconds(result, PHASES)
    found = verdicts(tmp_path)
    assert sorted(found) == sorted(PHASES)
    assert [found[name]["verdict"] for name in PHASES] == ["passed", "passed", "skipped: no CUDA", "passed"]
    resume = found["kill-resume"]["checks"]
    assert resume["first resumed step"] == resume["checkpoint step"] + 1 <= resume["killed at step"]
    assert resume["last step"] == main_job_gpu.sizes(True)["resume"]["steps"]
    assert resume["steps compared"] and resume["largest loss difference"] <= main_job_gpu.RESUME_BOUND


def steps(*rows_per_step: list[list[float]]) -> list[torch.Tensor]:
    return [torch.tensor(rows, dtype=torch.float32) for rows in rows_per_step]


def test_logits_are_compared_up_to_a_rows_first_different_token_each_step_within_the_bound():
    eager = [steps([[3.0, 1.0, 0.0], [0.0, 2.0, 1.0]], [[1.0, 1.01, 0.0], [0.0, 0.0, 5.0]], [[9.0, 0.0, 0.0]] * 2)]
    same = compare_logits(eager, eager, 3e-2)
    assert same["within bound"] and same["compared steps"] == 6 and same["different tokens"] == 0
    # a near tie (margin 0.01) flipped within the bound; the row's later steps are not compared
    flipped = [[step.clone() for step in eager[0]]]
    flipped[0][1][0] = torch.tensor([1.006, 1.004, 0.0])
    flipped[0][2][0] = torch.tensor([0.0, 0.0, 9.0])  # would be far beyond the bound
    near = compare_logits(eager, flipped, 3e-2)
    assert near["within bound"] and near["different tokens"] == 1 and near["compared steps"] == 5
    assert near["widest margin at a different token"] == pytest.approx(0.01, abs=1e-6)
    # a different token where the logits moved beyond the bound fails
    wide = [[step.clone() for step in eager[0]]]
    wide[0][0][1] = torch.tensor([2.1, 2.0, 1.0])
    result = compare_logits(eager, wide, 3e-2)
    assert not result["within bound"] and result["worst"]["row"] == 1 and result["worst"]["step"] == 0
    drift = [[step * 1.1 for step in eager[0]]]
    result = compare_logits(eager, drift, 3e-2)
    assert not result["within bound"] and result["worst"]["error"] == pytest.approx(0.1)
    # other batches (another number of rows) are not compared at all
    other = compare_logits(eager, [steps([[3.0, 1.0, 0.0]])], 3e-2)
    assert not other["within bound"] and other["compared steps"] == 0


def test_phases_without_their_least_time_are_skipped_with_a_verdict(tmp_path):
    code = main_job_gpu.run(tmp_path, tmp_path / "work", True, budget_s=10, names=PHASES)
    assert code == 1  # the pretrain did not pass
    found = verdicts(tmp_path)
    assert all(found[name]["verdict"].startswith("skipped: out of time") for name in PHASES)
    summary = json.loads((tmp_path / "main_job.json").read_text())
    assert [record["phase"] for record in summary["phases"]] == PHASES


def test_a_phase_past_its_limit_is_stopped_with_a_verdict(tmp_path):
    record = main_job_gpu.run_child("pretrain", tmp_path, tmp_path / "work", True, limit_s=1)
    assert record["verdict"] == "stopped at its limit (1 s)"
    assert json.loads((tmp_path / "pretrain.json").read_text())["verdict"] == record["verdict"]


def test_kill_tree_reaches_a_process_in_a_session_of_its_own(tmp_path):
    """torchrun starts its worker with start_new_session: killing torchrun's group misses it."""
    pid_file = tmp_path / "worker.pid"
    starter = (
        "import subprocess, time, pathlib; "
        "worker = subprocess.Popen(['sleep', '60'], start_new_session=True); "
        f"pathlib.Path({str(pid_file)!r}).write_text(str(worker.pid)); time.sleep(60)"
    )
    process = subprocess.Popen([sys.executable, "-c", starter], start_new_session=True)
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    worker = int(pid_file.read_text())
    assert worker in main_job_gpu.descendants(process.pid)
    assert os.getpgid(worker) != os.getpgid(process.pid)
    main_job_gpu.kill_tree(process)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{worker}").exists() and "Z" not in Path(f"/proc/{worker}/stat").read_text().split(")")[1][:3]:
        assert time.monotonic() < deadline, "the worker survived"
        time.sleep(0.05)
