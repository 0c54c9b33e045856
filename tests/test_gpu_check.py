"""`make gpu-check` (benchmarks/gpu_check.py): its CPU smoke runs every part end to end, so
that a GPU session loses no minute to a typo or an import error; and its limits hold: a
part past its budget is stopped and reported, the next part still runs, and a failed
correctness check makes the exit status non-zero."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import gpu_image_environment

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "benchmarks"))
import gpu_check  # noqa: E402  (a script directory, not a package)

sys.path.remove(str(REPOSITORY / "benchmarks"))


def test_smoke_runs_every_part_and_writes_their_tables_and_the_summary(tmp_path):
    out = tmp_path / "out"
    command = [sys.executable, "benchmarks/gpu_check.py", "--smoke", "--out", str(out)]
    env = gpu_image_environment(tmp_path)  # no wandb, as on the GPU image
    result = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True, timeout=600, env=env)
    logs = "".join(path.read_text()[-2000:] for path in sorted(out.glob("*.log")))
    assert result.returncode == 0, result.stdout[-3000:] + logs
    summary = json.loads((out / "gpu_check.json").read_text())
    assert [row[0] for row in summary["rows"]] == ["correctness", "training", "kernels", "long-context"]
    assert all(row[1] == "ok" for row in summary["rows"]), summary["rows"]
    checks = json.loads((out / "correctness.json").read_text())
    assert len(checks["rows"]) == 10 and all(row[1] == "passed" for row in checks["rows"]), checks["rows"]
    for table in ("train_step", "positions_debug"):
        record = json.loads((out / f"{table}.json").read_text())
        assert record["settings"]["device"] == "CPU" and record["rows"], record
    assert "| correctness | ok |" in (out / "gpu_check.md").read_text()


def script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text("import sys, time, pathlib\nout = pathlib.Path(sys.argv[sys.argv.index('--out') + 1])\n" + body)
    return str(path)  # absolute: gpu_check joins it to benchmarks/ unchanged


CORRECTNESS_TABLE = (
    "import json\nrows = [['a', 'passed', '', '0'], ['b', {result!r}, '', '0']]\n"
    "(out / 'correctness.json').write_text(json.dumps({{'rows': rows}}))\n"
)


def test_a_part_past_its_limit_is_stopped_and_the_next_part_runs(tmp_path):
    slow = script(tmp_path, "slow", "time.sleep(60)\n")
    quick = script(tmp_path, "quick", "(out / 'quick.json').write_text('{}')\n")
    parts = [gpu_check.Part("slow", 1, ((slow,),), ()), gpu_check.Part("quick", 30, ((quick,),), ("quick",))]
    status = gpu_check.run(parts, tmp_path / "out")
    rows = json.loads((tmp_path / "out" / "gpu_check.json").read_text())["rows"]
    assert rows[0][:2] == ["slow", "stopped at its limit (1 s)"] and float(rows[0][2]) < 15
    assert rows[1][:2] == ["quick", "ok"] and rows[1][4] == "quick"
    assert status == 2  # no correctness check failed, but a part did not finish


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (CORRECTNESS_TABLE.format(result="FAILED") + "sys.exit(1)\n", 1),
        (CORRECTNESS_TABLE.format(result="passed"), 0),
        (CORRECTNESS_TABLE.format(result="passed") + "time.sleep(60)\n", 1),  # unfinished: unproven
    ],
    ids=["failed-check", "passed", "stopped"],
)
def test_exit_status_is_non_zero_when_a_correctness_check_failed(tmp_path, body, expected):
    correctness = script(tmp_path, "correctness", body)
    parts = [gpu_check.Part("correctness", 3, ((correctness,),), ("correctness",))]
    assert gpu_check.run(parts, tmp_path / "out") == expected
    summary = (tmp_path / "out" / "gpu_check.md").read_text()
    assert ("failed: b" in summary) == (expected == 1 and "FAILED" in body)


def test_parts_option_names_only_known_parts(tmp_path):
    command = [sys.executable, "benchmarks/gpu_check.py", "--out", str(tmp_path), "--parts", "speed"]
    result = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "unknown parts ['speed']" in result.stderr


def test_useful_flops_count_only_the_pairs_document_masking_keeps():
    """Hand-worked: rows of 5 tokens, documents of 2 and 3 tokens -> 3 + 6 = 9 pairs for 5
    tokens, against 15 for one document (the MFU formula's causal T, up to T+1)."""
    sys.path.insert(0, str(REPOSITORY / "benchmarks"))
    try:
        from train_gpu import useful_flops_per_token
    finally:
        sys.path.remove(str(REPOSITORY / "benchmarks"))
    import torch

    from longctx.config.model import ModelConfig

    config = ModelConfig.from_preset("debug")
    layers, width = config.n_layers, config.d_model
    matmul = 6 * (config.num_parameters() - config.vocab_size * width - (2 * layers + 1) * width)
    packed = useful_flops_per_token(config, torch.tensor([[0, 0, 1, 1, 1]]))
    whole = useful_flops_per_token(config, torch.zeros(1, 5, dtype=torch.long))
    assert packed == pytest.approx(matmul + 12 * layers * width * 9 / 5)
    assert whole == pytest.approx(matmul + 12 * layers * width * 15 / 5)
