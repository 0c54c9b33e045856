"""experiments/launch/slurm.sbatch without SLURM: fake sbatch/srun/scontrol/torchrun on PATH
record their arguments and environment; pre-emption is tested with a real SIGTERM."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "launch" / "slurm.sbatch"

FAKE_TOOLS = {
    "sbatch": '#!/bin/bash\nprintf "%s\\n" "$@" > "$RECORD/sbatch.args"\n',
    "scontrol": '#!/bin/bash\n[ "$1 $2" = "show hostnames" ] && printf "node-a\\nnode-b\\n"\n',
    # srun's own options first, then the task command (real srun forwards SIGTERM to its tasks;
    # exec makes the task the process that receives it)
    "srun": (
        '#!/bin/bash\nprintf "%s\\n" "$@" > "$RECORD/srun.args"\nenv > "$RECORD/srun.env"\n'
        'while [[ "$1" == --* ]]; do shift; done\nexec "$@"\n'
    ),
    "torchrun": '#!/bin/bash\nprintf "%s\\n" "$@" > "$RECORD/torchrun.args"\nexec "$FAKE_PYTHON" "$FAKE_TRAINER"\n',
}

FAKE_TRAINER = """
import os, signal, sys, time
record = os.environ["RECORD"]
def on_term(*_):
    open(os.path.join(record, "trainer.sigterm"), "w").close()
    sys.exit(7)
signal.signal(signal.SIGTERM, on_term)
open(os.path.join(record, "trainer.ready"), "w").close()
time.sleep(float(os.environ.get("TRAIN_SECONDS", "30")))
"""


@pytest.fixture
def cluster(tmp_path):
    """A fresh checkout directory and a PATH holding the fake SLURM tools."""
    bin_dir, record, work = tmp_path / "bin", tmp_path / "record", tmp_path / "checkout"
    for directory in (bin_dir, record, work / ".venv" / "bin"):
        directory.mkdir(parents=True)
    (work / ".venv" / "bin" / "activate").write_text("export ACTIVATED_VENV=1\n")
    for name, text in FAKE_TOOLS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "trainer.py").write_text(FAKE_TRAINER)
    env = {key: value for key, value in os.environ.items() if not key.startswith("SLURM_")}
    env.update(
        PATH=f"{bin_dir}:{env['PATH']}",
        RECORD=str(record),
        FAKE_PYTHON=sys.executable,
        FAKE_TRAINER=str(tmp_path / "trainer.py"),
    )
    return work, record, env


def _job_env(env: dict, **extra) -> dict:
    return {
        **env,
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "node-[a-b]",
        "SLURM_NNODES": "2",
        "SLURM_CPUS_PER_TASK": "64",
        **extra,
    }


def _wait_for(path: Path, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.05)


def test_outside_a_job_it_creates_the_log_directory_and_submits_itself(cluster):
    work, record, env = cluster
    done = subprocess.run(
        ["bash", str(SCRIPT), "--nodes=4", "--time=1:00:00", "exp.yaml", "train.max_steps=9"],
        cwd=work,
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert (work / "runs" / "slurm").is_dir()
    assert (record / "sbatch.args").read_text().splitlines() == [
        "--output=runs/slurm/%x-%j.out",
        "--nodes=4",
        "--time=1:00:00",
        str(SCRIPT),
        "exp.yaml",
        "train.max_steps=9",
    ]


def test_header_asks_for_the_warning_signal_and_no_log_path_sbatch_cannot_open():
    header = [line for line in SCRIPT.read_text().splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --signal=B:TERM@120" in header
    assert not any(line.startswith("#SBATCH --output") for line in header)


def test_the_job_runs_one_torchrun_per_node_with_its_cpus(cluster):
    work, record, env = cluster
    done = subprocess.run(
        ["bash", str(SCRIPT), "exp.yaml", "train.max_steps=9"],
        cwd=work,
        check=False,
        env=_job_env(env, TRAIN_SECONDS="0"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    srun_args = (record / "srun.args").read_text().splitlines()
    assert srun_args[:2] == ["--kill-on-bad-exit=1", "--cpus-per-task=64"] and srun_args[2] == "torchrun"
    torchrun_args = (record / "torchrun.args").read_text().splitlines()
    assert torchrun_args[torchrun_args.index("--rdzv-endpoint") + 1] == "node-a:29500"
    assert torchrun_args[torchrun_args.index("--nnodes") + 1] == "2"
    assert torchrun_args[-6:] == ["-m", "longctx", "pretrain", "exp.yaml", "train.max_steps=9", "train.resume=auto"]
    assert "ACTIVATED_VENV=1" in (record / "srun.env").read_text().splitlines()


def test_sigterm_to_the_batch_shell_reaches_the_trainer(cluster):
    work, record, env = cluster
    batch = subprocess.Popen(
        ["bash", str(SCRIPT), "exp.yaml"],
        cwd=work,
        env=_job_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(record / "trainer.ready")
        batch.send_signal(signal.SIGTERM)  # what --signal=B:TERM@120 does
        _, stderr = batch.communicate(timeout=20)
    finally:
        if batch.poll() is None:
            batch.kill()
    assert (record / "trainer.sigterm").exists(), stderr
    assert batch.returncode == 7  # the batch script waits for the step and exits with its status
    assert "forwarding it to the training step" in stderr


EVAL_SCRIPT = SCRIPT.with_name("eval.sbatch")


def test_the_evaluation_job_runs_the_longctx_command_it_is_given_on_every_node(cluster):
    work, record, env = cluster
    command = ["eval-suite", "hf/m", "--suite", "ruler", "--lengths", "4096", "eval.benchmarks.samples_per_length=5"]
    done = subprocess.run(
        ["bash", str(EVAL_SCRIPT), *command],
        cwd=work,
        check=False,
        env=_job_env(env, TRAIN_SECONDS="0"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    torchrun_args = (record / "torchrun.args").read_text().splitlines()
    assert torchrun_args[torchrun_args.index("--nnodes") + 1] == "2"
    assert torchrun_args[torchrun_args.index("--nproc-per-node") + 1] == "8"
    assert torchrun_args[torchrun_args.index("--rdzv-endpoint") + 1] == "node-a:29500"
    assert torchrun_args[-len(command) - 2 :] == ["-m", "longctx", *command]  # nothing appended: no train.resume
