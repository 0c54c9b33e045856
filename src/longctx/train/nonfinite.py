"""Non-finite training is stopped, not saved (`train.on_nonfinite`).

A step is non-finite when the loss backward sees (the value `training_step` returns, after
any weighting of it, observed in `on_before_backward`) or the global gradient norm (what
clipping computes) is NaN or infinite. Per optimizer step, on the device and without a
host read, as `torch.amp.GradScaler` does with its found-inf flag:

    found = any micro-batch loss non-finite | not isfinite(grad_norm)   (all-reduce MAX over ranks)
    optimizer.found_inf = found      fused AdamW drops the whole update: parameters,
                                     moments and step count stay as they were
    skipped += found
    first   = first if first.step >= 0 else where(found, (step, quantity, value), first)

The all-reduce makes the decision global: every rank drops the same updates and stops at
the same step. Whatever the mode, a non-finite update never reaches the weights.

The record is read on the host only at boundaries where the host reads anyway: every
`log.every_steps` optimizer steps (`NonFiniteCheck`) and before every checkpoint is written
(`LanguageModelModule.on_save_checkpoint`: the numbered copies, `last.ckpt`, the SIGTERM
save, the end-of-training save and any user checkpoint callback). Then

- `on_nonfinite=stop` raises `NonFiniteError` (step, quantity, value): the run ends with
  status 2 and writes no checkpoint after the divergence; `checkpoints/` keeps the last
  finite `last.ckpt` and numbered copies, what `train.resume=auto` continues from.
- `on_nonfinite=skip` logs `train/skipped_steps` and raises only when more than
  `train.max_skipped_steps` updates were dropped (the count is saved in checkpoints, so a
  resumed run keeps counting).

Before a checkpoint is written its tensors are also checked for NaN/inf (one pass over
the state at save time), so no path that bypasses the step guard can save a non-finite
checkpoint either.
"""

from __future__ import annotations

import lightning as L
import torch

from longctx.errors import NonFiniteError
from longctx.train.callbacks.training import StepCallback

QUANTITIES = ("train/loss", "train/grad_norm")
"""What a record's quantity code names (0: the loss backward saw, 1: the gradient norm)."""
CHECKPOINT_KEY = "nonfinite"


class NonFiniteGuard:
    """The device-side found-inf flag, skip count and first-non-finite record of one run."""

    def __init__(self, mode: str, max_skipped_steps: int):
        self.mode = mode
        self.max_skipped_steps = max_skipped_steps
        self.restored_skips = 0
        self.record: torch.Tensor | None = None
        """float64 [first step (-1: none yet), quantity code, value, dropped updates]."""
        self._loss_bad: torch.Tensor | None = None  # this step's micro-batches so far
        self._loss_value: torch.Tensor | None = None

    def observe_loss(self, loss: torch.Tensor) -> None:
        """A micro-batch's loss, as backward receives it (device ops only)."""
        loss = loss.detach().double()
        bad = ~torch.isfinite(loss)
        if self._loss_bad is None or self._loss_value is None:
            self._loss_bad, self._loss_value = bad, loss
            return
        self._loss_value = torch.where(self._loss_bad, self._loss_value, loss)
        self._loss_bad = self._loss_bad | bad

    def before_update(self, optimizer: torch.optim.Optimizer, grad_norm: torch.Tensor, step: int) -> None:
        """Decide, on the device, whether optimizer step `step` (1-based) applies: sets the
        fused optimizer's `found_inf` and updates the record. Call after the gradient norm
        is known and before `optimizer.step` applies the update."""
        if not optimizer.defaults.get("fused"):
            raise TypeError(
                f"the non-finite guard drops updates through a fused optimizer's found_inf; "
                f"{type(optimizer).__name__} was built without fused=True"
            )
        norm = grad_norm.detach().double()
        if self.record is None:
            # fills, not a host copy (as every value below that comes from the host)
            self.record = torch.stack(
                [
                    norm.new_full((), -1.0),
                    norm.new_zeros(()),
                    norm.new_zeros(()),
                    norm.new_full((), float(self.restored_skips)),
                ]
            )
        loss_bad = self._loss_bad if self._loss_bad is not None else torch.zeros_like(norm, dtype=torch.bool)
        loss_value = self._loss_value if self._loss_value is not None else torch.zeros_like(norm)
        self._loss_bad = self._loss_value = None
        found = (loss_bad | ~torch.isfinite(norm)).double()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(found, op=torch.distributed.ReduceOp.MAX)
        first, quantity, value, skipped = self.record.unbind()
        new = found.bool() & (first < 0)
        self.record = torch.stack(
            [
                torch.where(new, norm.new_full((), float(step)), first),  # a fill, not a host copy
                torch.where(new, torch.where(loss_bad, 0.0, 1.0).double(), quantity),
                torch.where(new, torch.where(loss_bad, loss_value, norm), value),
                skipped + found,
            ]
        )
        optimizer.found_inf = found.float()  # type: ignore[attr-defined]  # read by fused AdamW's step

    @property
    def skipped(self) -> torch.Tensor | None:
        """Dropped updates so far, a device scalar (None before the first step)."""
        return None if self.record is None else self.record[3]

    def check(self) -> int:
        """Read the record (one host read) and raise as `mode` says; returns the updates
        dropped so far."""
        if self.record is None:
            return self.restored_skips
        first, quantity, value, skipped = self.record.tolist()
        if first < 0:
            return int(skipped)
        name = QUANTITIES[int(quantity)]
        where = f"{name} = {value} at optimizer step {int(first)}"
        if self.mode == "stop":
            raise NonFiniteError(
                f"training diverged: {where} (train.on_nonfinite=stop); its update was dropped and no checkpoint "
                "was written from then on: checkpoints/ holds the last finite ones (train.resume=auto continues "
                "from last.ckpt). Lower train.lr or raise train.warmup_steps, or set train.on_nonfinite=skip",
                int(first),
                name,
                value,
            )
        if skipped > self.max_skipped_steps:
            raise NonFiniteError(
                f"training diverged: {int(skipped)} optimizer updates dropped as non-finite, more than "
                f"train.max_skipped_steps={self.max_skipped_steps}; the first was {where}",
                int(first),
                name,
                value,
            )
        return int(skipped)

    def before_save(self, checkpoint: dict) -> None:
        """Refuse to write a checkpoint after a divergence (see `check`) or holding a
        non-finite tensor; store the skip count for a resumed run."""
        checkpoint[CHECKPOINT_KEY] = {"skipped": self.check()}
        for name, tensor in checkpoint.get("state_dict", {}).items():
            if torch.is_tensor(tensor) and tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                raise NonFiniteError(
                    f"refusing to save a checkpoint: parameter {name} holds NaN or infinite values "
                    "(checkpoints/ keeps the last finite ones)",
                    int(checkpoint.get("global_step", -1)),
                    name,
                    float("nan"),
                )

    def restore(self, checkpoint: dict) -> None:
        self.restored_skips = int(checkpoint.get(CHECKPOINT_KEY, {}).get("skipped", 0))
        self.record = None


class NonFiniteCheck(StepCallback):
    """Reads the guard at logging boundaries (every `every_steps` optimizer steps), and
    logs `train/skipped_steps` (a device value: no read of its own) under `skip`."""

    def __init__(self, every_steps: int):
        self.every_steps = every_steps

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args) -> None:
        if not self.step_completed(trainer):
            return  # mid-accumulation
        guard: NonFiniteGuard = pl_module.nonfinite  # type: ignore[assignment]
        if guard.mode == "skip" and guard.skipped is not None:
            pl_module.log("train/skipped_steps", guard.skipped, on_step=True)
        if trainer.global_step % self.every_steps == 0:
            guard.check()
