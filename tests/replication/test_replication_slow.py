"""The miniature replication still reaches its committed verdicts (minutes to an hour).

One test per scale: `cpu` (sweeps/replicate_cpu*.yaml, `make replicate`), `full`
(sweeps/replicate_full*.yaml, `make replicate-full`) and, on a GPU machine, `gpu`
(sweeps/replicate_gpu*.yaml, `make replicate-gpu`; `pytest -m "gpu and slow"`). Each
re-runs its four sweeps and the report in a scratch directory and compares the verdicts
with the committed docs/replication_summary_<scale>.json (skipped until one is committed;
the smoke chain publishes none).
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import read_verdicts

REPOSITORY = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("scale", ["cpu", "full", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_replication_verdicts_hold(tmp_path, scale):
    if scale == "gpu":
        import torch

        if not torch.cuda.is_available():
            pytest.skip("the gpu scale needs CUDA")
    committed = REPOSITORY / "docs" / f"replication_summary_{scale}.json"
    if not committed.exists():
        pytest.skip(f"{committed.name} is not committed: `make replicate` has not been run at this scale yet")
    shutil.copytree(REPOSITORY / "experiments", tmp_path / "experiments")
    shutil.copytree(REPOSITORY / "sweeps", tmp_path / "sweeps")
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": str(REPOSITORY / "src")}
    for suffix in ("", "_table1", "_sft", "_sft_plain"):
        subprocess.run(
            [sys.executable, "-m", "longctx", "sweep", f"sweeps/replicate_{scale}{suffix}.yaml", "--keep-going"],
            cwd=tmp_path,
            env=env,
            check=suffix == "",
        )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "longctx_replication.report",
            f"runs/replicate_{scale}",
            "--docs",
            "docs",
            "--name",
            scale,
        ],
        cwd=tmp_path,
        env=env,
        check=True,
    )
    assert read_verdicts(tmp_path / "docs" / f"replication_summary_{scale}.json") == read_verdicts(committed)
