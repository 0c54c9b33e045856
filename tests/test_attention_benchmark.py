"""benchmarks/attention.py's kernel table runs end to end at tiny sizes on CPU (`--smoke`)
and writes the JSON and Markdown that `make bench-gpu-kernels` collects."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import device_timing  # noqa: E402


def test_useful_flops_hand_worked():
    """One document of 3 tokens: 6 causal pairs; 2 heads of dim 4: forward 4 * 6 * 4 * 2 =
    192 FLOPs, forward+backward 3.5x = 672; two documents of 1 and 2 tokens: 1 + 3 pairs."""
    assert device_timing.causal_attention_flops([3], 2, 4, backward=False) == 192
    assert device_timing.causal_attention_flops([3], 2, 4, backward=True) == 672
    assert device_timing.causal_attention_flops([1, 2], 2, 4, backward=False) == 4 * 4 * 4 * 2


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "attention.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )


def test_smoke_writes_json_and_markdown(tmp_path):
    result = run("--smoke", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "attention.json").read_text())
    assert report["repeats"] == 10
    rows = report["rows"]
    assert {(row["T"], row["backend"]) for row in rows} == {(t, b) for t in (128, 320) for b in ("sdpa", "varlen")}
    for row in rows:
        assert "failed" not in row, row
        assert row["fwd_ms"] > 0 and row["fwd_bwd_ms"] > 0
    markdown = (tmp_path / "attention.md").read_text().splitlines()
    assert markdown[2].startswith("| T | docs/row | backend |")
    assert len([line for line in markdown if line.startswith("| 128 ") or line.startswith("| 320 ")]) == 4


@pytest.mark.parametrize("repeats", ["3", "9"])
def test_repeats_below_the_minimum_are_refused(repeats, tmp_path):
    result = run("--smoke", "--repeats", repeats, "--out", str(tmp_path))
    assert result.returncode != 0
    assert "at least 10" in result.stderr
