"""The CPU miniature replication still reaches the committed verdicts (minutes to an hour)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from longctx.replication import read_verdicts

REPOSITORY = Path(__file__).resolve().parents[1]
SWEEPS = ("replicate_cpu", "replicate_cpu_table1", "replicate_cpu_sft")


@pytest.mark.slow
def test_cpu_replication_verdicts_hold(tmp_path):
    shutil.copytree(REPOSITORY / "experiments", tmp_path / "experiments")
    shutil.copytree(REPOSITORY / "sweeps", tmp_path / "sweeps")
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": str(REPOSITORY / "src")}
    for name in SWEEPS:
        subprocess.run([sys.executable, "-m", "longctx", "sweep", f"sweeps/{name}.yaml", "--keep-going"],
                       cwd=tmp_path, env=env, check=name == "replicate_cpu")
    subprocess.run([sys.executable, "-m", "longctx.analysis.replication_report", "runs/replicate_cpu",
                    "--docs", "docs", "--name", "cpu", "--no-notebooks"], cwd=tmp_path, env=env, check=True)
    committed = read_verdicts(REPOSITORY / "docs" / "replication_summary_cpu.json")
    assert read_verdicts(tmp_path / "docs" / "replication_summary_cpu.json") == committed
