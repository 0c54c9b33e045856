"""A training progress bar that counts optimizer steps out of `train.max_steps`.

Lightning's bars count the micro-batches of an epoch. Training here is one endless epoch
bounded by `max_steps` (so they show `Epoch 0/-2`), and with gradient accumulation every
optimizer step takes several micro-batches (so they show `24/12` and an ETA that is off by
the accumulation factor). This bar shows `step N/max_steps`, where N is
`trainer.global_step` (after a resume it starts at the restored step), and keeps the kind
Lightning would pick: Rich when it is installed, else tqdm.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ProgressBar, RichProgressBar, TQDMProgressBar
from lightning.pytorch.utilities.imports import _RICH_AVAILABLE

DESCRIPTION = "step"


class _OptimizerSteps(ProgressBar):
    """Mixin over a Lightning progress bar (listed before it in the bases, so `super()`
    reaches the concrete bar): the training bar's total is max_steps, its position the
    optimizer steps done."""

    @property
    def total_train_batches(self) -> int | float:
        return self.trainer.max_steps if self.trainer.max_steps > 0 else float("inf")

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # the parent shows `batch_idx + 1`: hand it the optimizer steps done instead
        super().on_train_batch_end(trainer, pl_module, outputs, batch, trainer.global_step - 1)

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)  # the logger's run id, not a metric
        return metrics


class RichStepProgressBar(_OptimizerSteps, RichProgressBar):
    def _get_train_description(self, current_epoch: int) -> str:
        return DESCRIPTION


class TQDMStepProgressBar(_OptimizerSteps, TQDMProgressBar):
    def on_train_epoch_start(self, trainer: L.Trainer, *args: Any) -> None:
        super().on_train_epoch_start(trainer, *args)
        self.train_progress_bar.initial = trainer.global_step
        self.train_progress_bar.set_description(DESCRIPTION)


def step_progress_bar() -> ProgressBar:
    """The bar Lightning would pick (Rich if installed, else tqdm), counting optimizer steps."""
    return RichStepProgressBar() if _RICH_AVAILABLE else TQDMStepProgressBar()
