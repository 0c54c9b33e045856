"""The LightningModule for language-model training on the batch contract.

Owns the model, the loss, the optimizer and the LR schedule (STRING Appendix A.2): AdamW
(beta 0.9/0.95, weight decay on matrices only), linear warm-up to `train.lr` over
`train.warmup_steps`, cosine decay to `train.min_lr` at `train.max_steps`. Gradient clipping
and accumulation are the Trainer's (see train/trainer.py).

Loss: next-token cross-entropy averaged over *all labelled tokens of the optimizer step*
(labels == -100 carry none), whatever the micro-batch grouping or world size. A mean of
micro-batch means would weight tokens by how the step's rows happen to be grouped (rows
hold different numbers of labelled tokens), so 1 and 2 processes would disagree. Instead
each micro-batch returns sum(CE) / (rows x window), a constant denominator; Lightning
divides by the accumulation steps and the strategy averages over ranks, giving
grad sum(CE) / capacity for the step's token capacity; `on_before_optimizer_step` then
all-reduces the labelled-token count and rescales the gradients by capacity / labelled,
so the update is exactly grad [sum(CE) / labelled tokens] of the global batch. With
`loss_weights` (train.loss_weighting, train/loss_weights.py) each token's CE is times
w(position id) and the summed weight takes the token count's place: sum(w CE) / sum(w).

No host synchronisation in a step: the step's totals stay on the device (the capacity is
written with a fill, not copied from the host), the rescale is one `torch._foreach_mul_`
by a device scalar (one launch for all ~200 gradients instead of one `mul_` each) and the
loss is logged as a device tensor; the only reads are Lightning's own, when it logs.
A NaN/inf loss or gradient norm drops the step's update on the device and is reported at
the next logging or checkpoint boundary (`train.on_nonfinite`, train/nonfinite.py).

Under FSDP2 (`ModelParallelStrategy`), `configure_model` shards each transformer block
and then the root with `fully_shard`, optionally after activation checkpointing and
`torch.compile` per block (order: AC -> compile -> FSDP, as torchtitan does). Under
context parallelism (`train.context_parallel` N > 1, train/context_parallel.py) FSDP2
shards over the data x context mesh and each step first deals the rows out along the
sequence: each rank's loss is the sum over its own tokens, and the capacity and labelled
counts above are all-reduced over every rank, so the update is the one-process update.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import lightning as L
import torch
import torch.nn.functional as F

from longctx.batch import IGNORE_INDEX
from longctx.config import ExperimentConfig, as_dict, from_dict
from longctx.config.model import config_dict
from longctx.model.attention import resolve_backend
from longctx.model.llama import Llama
from longctx.model.sequence_shard import SequenceShard
from longctx.train.nonfinite import NonFiniteGuard

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


def learning_rate(step: int, *, warmup: int, total: int, peak: float, floor: float, shape: str) -> float:
    """Linear warm-up over `warmup` steps, then `shape` (cosine | linear) decay to `floor`."""
    if warmup > 0 and step < warmup:
        return peak * (step + 1) / warmup
    if step >= total:
        return floor
    progress = (step - warmup) / max(1, total - warmup)
    if shape == "linear":
        return peak + (floor - peak) * progress
    return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * progress))


def rescale_gradients(parameters: list[torch.nn.Parameter], capacity: torch.Tensor, labelled: torch.Tensor) -> None:
    """grad *= capacity / labelled for every parameter with a gradient, in one
    `_foreach_mul_` by a device scalar (no host read); unchanged when nothing is labelled.

    The scale is rounded to the gradients' compute type (float32 for float32/bf16 gradients)
    before the product, as a Python-float `mul_` does, so the result equals the old
    per-parameter loop bitwise.
    """
    grads = [parameter.grad for parameter in parameters if parameter.grad is not None]
    if not grads:
        return
    scale = torch.where(labelled > 0, capacity / labelled.clamp(min=1), torch.ones_like(capacity))
    for dtype in {grad.dtype for grad in grads}:
        same = [grad for grad in grads if grad.dtype == dtype]
        torch._foreach_mul_(same, scale.to(torch.promote_types(dtype, torch.float32)))


def shard_model(model: Llama, mesh: DeviceMesh, precision: str) -> None:
    """FSDP2 over `mesh`: each transformer block, then the root, `fully_shard`ed in place
    (parameter names unchanged, so checkpoints load into a plain Llama). Under bf16
    (`precision` bf16-*, or auto on CUDA) the forward gathers bf16 parameters and gradients
    are reduced in fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy()
    if precision.startswith("bf16") or (precision == "auto" and torch.cuda.is_available()):
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    # A block's inputs are left as they come: the activations are already in param_dtype
    # (the embedding's output), and casting them would also cast the fp32 RoPE cos/sin that
    # FSDP2 finds inside the positions dataclass (single-device runs rotate in fp32).
    block_policy = dataclasses.replace(policy, cast_forward_inputs=False)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=block_policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


class LanguageModelModule(L.LightningModule):
    """`LanguageModelModule.load_from_checkpoint(path)` rebuilds the module from the saved
    hyper-parameters: `config` (the experiment as a dict) and `model` (the ModelConfig, what
    `longctx.model.checkpoint.load_model` reads)."""

    loss_weights: torch.Tensor | None

    def __init__(
        self,
        config: ExperimentConfig | dict,
        initial_state: dict[str, torch.Tensor] | None = None,
        loss_weights: torch.Tensor | None = None,
    ):
        super().__init__()
        if isinstance(config, dict):
            config = from_dict(config)
        self.config = config
        self.initial_state = initial_state  # weights from `init=CKPT`, loaded in configure_model
        # Plain dicts only: checkpoints must load with torch.load(weights_only=True). Not logged
        # here: the trainer's ConfigLogger callback logs the config once, as flat sections.
        self.save_hyperparameters({"config": as_dict(config), "model": config_dict(config.model)}, logger=False)
        self.model: Llama | None = None
        # Summed cross-entropy, labelled tokens and token capacity since the last step.
        self._step_totals: torch.Tensor | None = None
        self.nonfinite = NonFiniteGuard(config.train.on_nonfinite, config.train.max_skipped_steps)
        # w(p) by position id (frozen before step 0; not persistent: recomputed from the config).
        self.register_buffer("loss_weights", loss_weights, persistent=False)

    def configure_model(self) -> None:
        if self.model is not None:
            return
        torch.manual_seed(self.config.train.seed)
        self.model = model = Llama(self.config.model)
        if self.initial_state is not None:
            model.load_state_dict(self.initial_state)
            self.initial_state = None
        # Both keep parameter names unchanged, so checkpoints load into a plain Llama.
        model.activation_checkpointing = self.config.train.activation_checkpointing
        if self.config.train.compile:
            for block in model.blocks:
                block.compile()
        device_mesh = getattr(self, "device_mesh", None)
        if device_mesh is not None:
            from longctx.train.context_parallel import fsdp_mesh

            shard_model(model, fsdp_mesh(device_mesh), self.config.train.precision)

    def _llama(self) -> Llama:
        """The model `configure_model` built (Lightning calls it before any step)."""
        if self.model is None:
            raise RuntimeError("LanguageModelModule.configure_model() has not run: no model yet")
        return self.model

    def forward(
        self, batch: dict[str, torch.Tensor], shard: SequenceShard | None = None, **loss: object
    ) -> torch.Tensor:
        """The logits of `batch` (with the model's `loss` arguments: its chunked loss)."""
        ids = (batch["input_ids"], batch["position_ids"], batch["document_ids"])
        # A row's length bounds every document in it: the flash backend then reads no
        # maximum document length from the device (one host sync per step fewer).
        return self._llama()(*ids, max_seqlen=batch["input_ids"].shape[1], **loss, **self._shard_arguments(shard))

    def _shard_arguments(self, shard: SequenceShard | None) -> dict:
        """The model's keyword arguments for a sequence shard: the shard and its backend
        (flex on CUDA, the dense sdpa reference elsewhere, for `auto`)."""
        if shard is None:
            return {}
        backend = self.config.model.attention_backend
        if backend == "auto":
            backend = "flex" if resolve_backend("auto", shard.document_ids.device) != "varlen" else "sdpa"
        return {"sequence_shard": shard, "attention_backend": backend}

    def shard_batch(self, batch: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], SequenceShard | None]:
        """This rank's part of the rows under context parallelism (else the batch as it is),
        logging the micro-batch's measured balance: max / mean attended pairs per rank."""
        mesh = getattr(self, "device_mesh", None)
        if (
            mesh is None
            or "context_parallel" not in (mesh.mesh_dim_names or ())
            or mesh["context_parallel"].size() == 1
        ):
            return batch, None
        from longctx.train.context_parallel import imbalance, shard_batch

        local, shard, work = shard_batch(batch, mesh["context_parallel"], self.config.train.load_balance)
        self.log("train/cp_imbalance", imbalance(work), on_step=True)
        return local, shard

    def summed_loss(
        self, batch: dict[str, torch.Tensor], shard: SequenceShard | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(sum of next-token cross-entropy over labelled tokens, number of labelled tokens),
        both 0-dim tensors on the batch's device; with `loss_weights`, (sum of w CE, sum of w).
        With a `shard`: over this rank's tokens of the rows."""
        labels = batch["labels"].flatten()
        if self.loss_weights is not None:
            losses = F.cross_entropy(
                self(batch, shard).float().flatten(0, 1), labels, ignore_index=IGNORE_INDEX, reduction="none"
            )
            positions = batch["position_ids"].flatten().clamp(max=self.loss_weights.numel() - 1)
            weights = self.loss_weights[positions] * (labels != IGNORE_INDEX)
            return (losses * weights).sum(), weights.sum()
        chunk_tokens = self.config.train.loss_chunk_tokens
        if chunk_tokens:
            kernel = self.config.train.loss_kernel
            loss = self(batch, shard, labels=batch["labels"], loss_chunk_tokens=chunk_tokens, loss_kernel=kernel)
        else:
            logits = self(batch, shard)
            loss = F.cross_entropy(logits.float().flatten(0, 1), labels, ignore_index=IGNORE_INDEX, reduction="sum")
        return loss, (labels != IGNORE_INDEX).sum()

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        batch, shard = self.shard_batch(batch)
        loss_sum, labelled = self.summed_loss(batch, shard)
        capacity = batch["labels"].numel()
        # Kept on the batch's device and built without a host copy (`new_full` is a fill
        # kernel; `new_tensor` would copy from pageable memory and wait for the stream).
        totals = torch.stack([loss_sum.detach().double(), labelled.double(), loss_sum.new_full((), capacity).double()])
        self._step_totals = totals if self._step_totals is None else self._step_totals + totals
        return loss_sum / capacity

    def on_before_optimizer_step(self, optimizer) -> None:
        totals = self._step_totals
        if totals is None:
            raise RuntimeError("on_before_optimizer_step before any training_step: no step totals")
        if self.trainer.world_size > 1:
            torch.distributed.all_reduce(totals)
        loss_sum, labelled, capacity = totals.unbind()
        rescale_gradients(list(self._llama().parameters()), capacity, labelled)
        self.log("train/loss", loss_sum / labelled.clamp(min=1), on_step=True, prog_bar=True)
        self.log("train/lr", optimizer.param_groups[0]["lr"], on_step=True)
        self._step_totals = None

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None) -> None:
        """Step, then free the gradients at once (`set_to_none`). Lightning's automatic
        optimisation calls `zero_grad` inside the next closure, after `training_step`: the
        previous step's gradients (4 bytes a parameter in fp32, 4.1 GiB at 1.1B) would live
        through the whole next forward, at the activations' peak. Freed here, the peak holds
        only the gradients the backward has made so far (train/memory_budget.py)."""
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        optimizer.zero_grad(set_to_none=True)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        # clip_grad_norm_ handles FSDP2's sharded DTensor gradients (the norm is all-reduced).
        max_norm = self.config.train.grad_clip or float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self._llama().parameters(), max_norm=max_norm)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        self.log("train/grad_norm", norm, on_step=True)
        self.nonfinite.before_update(optimizer, norm, self.trainer.global_step + 1)

    def on_before_backward(self, loss: torch.Tensor) -> None:
        self.nonfinite.observe_loss(loss)  # the loss backward receives, whatever weighting made it

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        self.nonfinite.before_save(checkpoint)  # every save, weights-only ones included

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.nonfinite.restore(checkpoint)

    def configure_optimizers(self):
        train = self.config.train
        decay = [p for p in self._llama().parameters() if p.dim() >= 2]
        no_decay = [p for p in self._llama().parameters() if p.dim() < 2]
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": train.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=train.lr,
            betas=(0.9, 0.95),
            eps=1e-8,
            fused=True,  # one kernel over all parameters (faster than foreach: docs/benchmarks.md)
        )
        warmup = round(train.warmup_ratio * train.max_steps) if train.warmup_ratio > 0 else train.warmup_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer,
            lambda step: learning_rate(
                step,
                warmup=warmup,
                total=train.max_steps,
                peak=1.0,
                floor=train.min_lr / train.lr,
                shape=train.schedule,
            ),
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
