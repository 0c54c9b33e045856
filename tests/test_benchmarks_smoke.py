"""The GPU benchmark scripts run end to end on CPU at tiny sizes (`--smoke`), so a GPU
session only has to run them: each writes its tables as JSON and Markdown (report.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
SCRIPTS = {
    "train_gpu.py": ["train_step", "train_e2e"],
    "position_methods.py": ["positions_debug"],
    "niah.py": ["niah_search"],
}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_smoke_mode_writes_json_and_markdown_tables(script, tmp_path):
    out = tmp_path / "bench"
    command = [sys.executable, f"benchmarks/{script}", "--smoke", "--out", str(out)]
    if script == "position_methods.py":
        command += ["--methods", "string", "dca"]
    result = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for name in SCRIPTS[script]:
        record = json.loads((out / f"{name}.json").read_text())
        assert record["name"] == name and record["rows"], record
        assert all(len(row) == len(record["columns"]) for row in record["rows"])
        markdown = (out / f"{name}.md").read_text()
        assert "| " + " | ".join(record["columns"]) + " |" in markdown
        assert record["settings"]["device"] == "CPU"


def test_llama31_8b_case_has_the_published_parameter_count():
    """Llama-3.1-8B: 8,030,261,248 parameters (its model card / safetensors index)."""
    sys.path.insert(0, str(REPOSITORY / "benchmarks"))
    try:
        from position_methods import model_config
    finally:
        sys.path.remove(str(REPOSITORY / "benchmarks"))
    config = model_config("llama3.1-8b", 131072)
    assert config.num_parameters() == 8_030_261_248
    assert config.head_dim == 128
