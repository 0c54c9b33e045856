"""Shared helpers of the training tests: the small pretraining workspace and its overrides,
launching `longctx pretrain` (under torchrun) and reading its losses, the SFT arguments."""

import ctypes
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import lightning as L

STEPS = 6


def overrides(workspace: Path, out_dir: Path, **extra) -> list[str]:
    values = {
        "model.preset": "debug",
        "model.vocab_size": 512,
        "model.max_position": 64,
        "model.attention_backend": "varlen",
        "data.path": workspace / "data",
        "data.tokenizer": workspace / "tokenizer.json",
        "data.window": 64,
        "train.micro_batch_size": 2,
        "train.global_batch_tokens": 512,  # 8 rows: accumulation 4 on one process, 2 on two
        "train.max_steps": STEPS,
        "train.warmup_steps": 2,
        "train.lr": 3e-3,
        "train.min_lr": 3e-4,
        "train.checkpoint_every_steps": 3,
        "train.out_dir": out_dir,
        "log.wandb_mode": "offline",
        "log.every_steps": 1,
        "probe.fi_every_steps": 2,
        **extra,
    }
    return [f"{key}={value}" for key, value in values.items()]


def environment() -> dict:
    env = dict(os.environ, WANDB_SILENT="true", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env.pop("WANDB_API_KEY", None)
    return env


def launch(
    args: list[str], nproc: int = 1, extra_torchrun: list[str] = (), log: Path | None = None
) -> subprocess.Popen:
    """`longctx pretrain args` (under torchrun with nproc > 1), its output piped; with `log`,
    written to that file instead and in a process group of its own, which os.killpg stops
    with its compile and loader workers (a pipe nobody reads would fill and stall it), and
    killed by the kernel if this process dies first (Linux PR_SET_PDEATHSIG): a caller
    stopped at a time limit leaves no pretrain running on its own."""
    if nproc == 1 and not extra_torchrun:
        command = [sys.executable, "-m", "longctx", "pretrain", *args]
    else:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={nproc}",
            # A single node rendezvous on a free port, not the default 29500: tests run
            # side by side (pytest -n) and two launches must not meet each other.
            *(extra_torchrun or ["--standalone"]),
            "-m",
            "longctx",
            "pretrain",
            *args,
        ]
    return subprocess.Popen(
        command,
        env=environment(),
        stdout=subprocess.PIPE if log is None else log.open("w"),
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=log is not None,
        preexec_fn=None if log is None else _die_with_parent,
    )


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the parent exits (prctl PR_SET_PDEATHSIG = 1)."""
    if sys.platform == "linux":
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


def finish(process: subprocess.Popen, timeout: float = 300) -> str:
    output, _ = process.communicate(timeout=timeout)
    assert process.returncode == 0, output[-4000:]
    return output


def losses(out_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["train/loss"] for row in rows if "train/loss" in row}  # not the probes' rows


def sft_args(workspace, pretrained, out, **extra):
    values = {
        "init": pretrained,
        "data.tokenizer": workspace / "tokenizer.json",
        "data.window": 128,
        "train.micro_batch_size": 2,
        "train.global_batch_tokens": 512,
        "train.lr": 1e-3,
        "train.min_lr": 0.0,
        "train.schedule": "linear",
        "train.warmup_ratio": 0.03,
        "train.weight_decay": 0.0,
        "train.out_dir": out,
        "log.wandb_mode": "disabled",
        "probe.fi_every_steps": 1,
        "sft.embedded_samples": 24,
        "sft.max_sample_length": 128,
        "sft.epochs": 0.5,
        **extra,
    }
    return [f"{key}={value}" for key, value in values.items()]


class StopAfterFirstStep(L.Callback):
    """Ends training after the first optimizer step, as a SIGTERM would (train.callbacks)."""

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step >= 1:
            trainer.should_stop = True


class PoisonGradient(L.Callback):
    """Sets the first parameter's gradient to NaN during optimizer step `at_step`
    (1-based; train.callbacks), as a diverging step would, and, with `sigterm`, then sends
    the process SIGTERM (the pre-emption save follows that step)."""

    def __init__(self, at_step: int, sigterm: bool = False):
        self.at_step, self.sigterm = at_step, sigterm

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_step + 1 == self.at_step:
            next(pl_module.parameters()).grad.fill_(float("nan"))
            if self.sigterm:
                os.kill(os.getpid(), signal.SIGTERM)


def poison(at_step: int, sigterm: bool = False) -> str:
    """The train.callbacks override of `PoisonGradient`."""
    spec = {"class_path": "tests.train.helpers.PoisonGradient", "init_args": {"at_step": at_step, "sigterm": sigterm}}
    return json.dumps([spec])
