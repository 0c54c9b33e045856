"""Training callbacks: checkpoints, save-on-SIGTERM, throughput/MFU (train/flops.py's
formula and peaks), a local metrics file."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from longctx.config import ExperimentConfig
from longctx.train.flops import peak_flops, training_flops_per_token


class StepCallback(L.Callback):
    """A callback that acts once per optimizer step: `step_completed` tells the batch that
    completed one (`trainer.global_step` moved) from the accumulation micro-batches before
    it, with no device work; a resumed run counts from its saved step. It moves the callback's
    own count, so each `on_train_batch_end` calls it once, on every rank, before any return."""

    _steps_seen = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._steps_seen = trainer.global_step

    def step_completed(self, trainer: L.Trainer) -> bool:
        completed, self._steps_seen = trainer.global_step != self._steps_seen, trainer.global_step
        return completed


def step_checkpoints(directory: Path, every_steps: int) -> ModelCheckpoint:
    """A numbered `step-NNNNNNN.ckpt` every `every_steps` optimizer steps (kept)."""
    return ModelCheckpoint(
        dirpath=str(directory),
        filename="step-{step:07d}",
        every_n_train_steps=every_steps,
        save_top_k=-1,
        save_last=False,
        auto_insert_metric_name=False,
        enable_version_counter=False,
    )


class LastCheckpoint(StepCallback):
    """Owns `last.ckpt`, what `train.resume=auto` continues from: written every
    `every_steps` optimizer steps, when training ends, and on SIGTERM (cluster pre-emption)
    after the current optimizer step, before the run stops.

    Written atomically by `checkpoint_io.AtomicCheckpointIO` (temporary name, fsync,
    rename), so a kill during the write leaves the previous `last.ckpt` intact. The SIGTERM handler is installed when training
    starts and replaces Lightning's, which would stop after the current *micro-batch*: a
    checkpoint taken mid-accumulation would shift every later accumulation boundary on
    resume and break exact reproduction. Ranks agree on the flag with an all-reduce at
    every optimizer-step boundary (the only batches where it is read), so all of them save
    the same step together; between boundaries the callback touches no tensor.
    """

    def __init__(self, path: Path, every_steps: int):
        self.path = path
        self.every_steps = every_steps
        self.received_sigterm = False
        self._saved_step = -1

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame) -> None:
        self.received_sigterm = True

    def save(self, trainer: L.Trainer) -> None:
        trainer.save_checkpoint(str(self.path), weights_only=False)  # full state; collective, ends with a barrier
        self._saved_step = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if not self.step_completed(trainer):
            return  # mid-accumulation: nothing to decide, no device work (no host sync per micro-batch)
        stop = self.received_sigterm
        if trainer.world_size > 1:
            flag = torch.full((1,), int(stop), device=trainer.strategy.root_device)  # a fill, not a host copy
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            stop = bool(flag.item())  # the one read per optimizer step, where ranks must agree
        if stop:
            self.save(trainer)
            trainer.should_stop = True
        elif trainer.global_step % self.every_steps == 0:
            self.save(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._saved_step != trainer.global_step:
            self.save(trainer)


class TrainingSpeed(L.Callback):
    """Logs tokens seen, tokens/s, MFU and peak memory at every optimizer step. The ranks of
    a context-parallel group share their rows: a step holds world / train.context_parallel
    x accumulation micro-batches, and MFU divides by every device's peak."""

    def __init__(self, config: ExperimentConfig, world_size: int, accumulation: int):
        data_parallel = world_size // config.train.context_parallel
        self.tokens_per_step = config.data.window * config.train.micro_batch_size * data_parallel * accumulation
        self.flops_per_token = training_flops_per_token(config)
        self.world_size = world_size
        self.peak: float | None = None
        self.last_time: float | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.peak = peak_flops(pl_module.device)
        self.last_time = time.perf_counter()

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        now = time.perf_counter()
        assert self.last_time is not None  # set by on_train_start, which Lightning calls first
        elapsed, self.last_time = now - self.last_time, now
        tokens_per_second = self.tokens_per_step / elapsed
        metrics = {
            "train/tokens_seen": float((trainer.global_step + 1) * self.tokens_per_step),
            "perf/tokens_per_s": tokens_per_second,
        }
        if self.peak:
            metrics["perf/mfu"] = tokens_per_second * self.flops_per_token / (self.peak * self.world_size)
        if pl_module.device.type == "cuda":
            metrics["perf/peak_memory_gib"] = torch.cuda.max_memory_allocated(pl_module.device) / 2**30
        else:
            import resource

            metrics["perf/peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        pl_module.log_dict(metrics, on_step=True)


class MetricsFile(StepCallback):
    """Appends each logged optimizer step's train/* and perf/* metrics to a JSON-lines file
    (rank 0), so runs can be compared and analysed without W&B; the f(i) and NIAH probes
    append theirs (`append_metrics`)."""

    def __init__(self, path: Path):
        self.path = path

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args) -> None:
        if not self.step_completed(trainer) or not trainer.is_global_zero:
            return
        append_metrics(
            self.path,
            trainer.global_step,
            {k: v for k, v in trainer.callback_metrics.items() if k.startswith(("train/", "perf/"))},
        )


METRICS_FILE = "metrics.jsonl"


def append_metrics(path: Path, step: int, metrics: dict) -> None:
    """One JSON line {"step": step, metric: value, ...} appended to a run's metrics file;
    the probe callbacks add their own line for the steps they measure (rank 0 only)."""
    with path.open("a") as handle:
        handle.write(json.dumps({"step": step, **{key: float(value) for key, value in metrics.items()}}) + "\n")
