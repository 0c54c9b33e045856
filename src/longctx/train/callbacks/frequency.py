"""f(i) during training: count every batch's attended pairs, log them live to the loggers.

STRING §2.2 (Eq. 2): f(i) counts the (query, key) pairs at relative position i that
training has used. This callback feeds every training batch on every rank, exactly as the
attention kernel sees it (`position_ids`, `document_ids`, `labels` of the batch contract),
to a `PositionFrequency` accumulator (probes/position_frequency.py), and every
`probe.fi_every_steps` optimizer steps

- all-reduces the per-rank counts (a collective: every rank calls it; local counts stay
  local, so logging twice never double counts),
- logs scalars `fi/f@L/4`, `fi/f@L/2`, `fi/f@3L/4`, `fi/f@L-1`, `fi/share_ge_half`,
  `fi/tokens_seen` (with sliding layers also `fi/sliding_f@W/2`, `fi/sliding_f@W-1` and
  `fi/curve_sliding`, what those layers train: probes/sliding_frequency.py; with linear
  layers, which have no positions, the full layers' f(i) also under the layer type's name,
  `fi/full_f@...` and `fi/curve_full`) and `fi/curve`, f(i) as a table of at most 10,000 rows drawn as a line
  plot (on W&B a `wandb.Table`: `wandb.Histogram` caps at 512 bins and loses positions),
  through every configured logger (train/loggers.py), at the logger step of Lightning's
  own metrics for that optimizer step,

and once more when training ends, so a run shorter than `probe.fi_every_steps` (or not a
multiple of it) still ends with its f(i) curve.

At every checkpoint the global counts go into the checkpoint (rank 0 keeps them on
resume, the other ranks restart from zero, so the all-reduced total continues exactly) and
the full arrays are written to `<out_dir>/fi/fi-step-NNNNNNN.npz` and logged as an
artifact, once per step (the numbered and the `last.ckpt` checkpoint of a step share it). Counting costs < 0.1% of a `tiny` training step at T=4096
(benchmarks/position_frequency.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import numpy as np

from longctx.probes.position_frequency import PositionFrequency, downsample
from longctx.train.callbacks.training import METRICS_FILE, StepCallback, append_metrics
from longctx.train.loggers import log_file, log_scalars, log_table, logger_step

MAX_TABLE_ROWS = 10_000


class HostBatchDataModule(L.LightningDataModule):
    """Keeps each batch as its loader made it (host memory) before Lightning copies it to
    the device, so the f(i) count reads the rows without copying the device batch back (a
    device-to-host read would make every micro-batch wait for the GPU)."""

    host_batch: Any = None

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        self.host_batch = batch
        return batch


class PositionFrequencyCallback(StepCallback):
    """`context_parallel` N > 1: the N adjacent ranks of a group train the same rows, so
    only the first of each group counts them (whole, before they are sharded)."""

    def __init__(
        self,
        window: int,
        out_dir: Path,
        every_steps: int,
        count_only_labeled: bool = True,
        sliding_window: int = 0,
        context_parallel: int = 1,
        linear_layers: bool = False,
    ):
        self.window = window
        self.linear_layers = linear_layers
        """The model has linear layers (Gated DeltaNet, no positions): the full layers' f(i) is
        also logged under their type's name, `fi/full_f@...` and `fi/curve_full`."""
        self.context_parallel = context_parallel
        self.out_dir = out_dir
        self.every_steps = every_steps
        self.counts = PositionFrequency(window, window, count_only_labeled, sliding_window)
        self._logged_step = -1
        self._saved_step = -1

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._logged_step = trainer.global_step

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        # The same rows before the device copy (Lightning sets `trainer.datamodule` at fit time).
        host_batch = getattr(getattr(trainer, "datamodule", None), "host_batch", None)
        if self.context_parallel > 1 and trainer.global_rank % self.context_parallel:
            return  # another rank of this row's group counts it
        self.counts.update(batch if host_batch is None else host_batch)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args) -> None:
        if self.step_completed(trainer) and trainer.global_step % self.every_steps == 0:
            self.log_counts(trainer, self.counts.all_reduce())

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_step != self._logged_step:  # every rank agrees: the all-reduce is collective
            self.log_counts(trainer, self.counts.all_reduce())

    def log_counts(self, trainer: L.Trainer, total: PositionFrequency) -> None:
        self._logged_step = trainer.global_step
        if not trainer.is_global_zero:
            return
        metrics = total.summary(self.window)
        if self.linear_layers:
            metrics |= {k.replace("fi/f@", "fi/full_f@"): v for k, v in metrics.items() if k.startswith("fi/f@")}
        append_metrics(self.out_dir / METRICS_FILE, trainer.global_step, metrics)
        step = logger_step(trainer)
        log_scalars(trainer, metrics, step)
        curves = [("fi/curve", total.relative, "f(i): trained pairs per relative position")]
        if total.sliding_window:
            curves.append(("fi/curve_sliding", total.sliding, "f(i) of the sliding layers (window W)"))
        if self.linear_layers:
            curves.append(("fi/curve_full", total.relative, "f(i) of the full layers (the linear layers have none)"))
        for name, counts, title in curves:
            distance, count = downsample(counts, MAX_TABLE_ROWS)
            log_table(
                trainer,
                name,
                ["relative_position", "f"],
                [[int(d), int(c)] for d, c in zip(distance, count, strict=True)],
                step,
                line=("relative_position", "f", title),
            )

    def state_dict(self) -> dict:
        # Called on every rank while a checkpoint is taken; rank 0's copy is saved.
        return self.counts.all_reduce().state_dict()

    def load_state_dict(self, state: dict) -> None:
        import torch.distributed as dist

        if not dist.is_initialized() or dist.get_rank() == 0:
            self.counts.load_state_dict(state)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        total = self.counts.empty_like()
        total.load_state_dict(checkpoint["callbacks"][self.state_key])
        if not trainer.is_global_zero or trainer.global_step == self._saved_step:
            return
        self._saved_step = trainer.global_step
        path = save_npz(total, self.out_dir / "fi" / f"fi-step-{trainer.global_step:07d}.npz")
        log_file(trainer, path, "fi", "position-frequency")


def save_npz(counts: PositionFrequency, path: Path) -> Path:
    """The full arrays: relative[d], absolute[p] and the scalar totals."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # Any: numpy's `savez(file, *args, allow_pickle: bool, **kwds)` stub would read an
    # array-valued dict as possibly holding `allow_pickle`.
    state: dict[str, Any] = {
        key: value.numpy() if hasattr(value, "numpy") else np.asarray(value)
        for key, value in counts.state_dict().items()
    }
    np.savez(path, **state)
    return path
