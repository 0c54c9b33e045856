"""`longctx sft`: supervised fine-tuning with Normal-SFT, PackedSFT-k or SkipAlign rows.

    longctx sft experiments/sft/tiny_skipalign.yaml init=runs/tiny_512/checkpoints/last.ckpt
    torchrun --nproc-per-node 8 -m longctx sft experiments/sft/tiny_skipalign.yaml init=...

Reuses the pretraining machinery (Lightning Trainer, FSDP2/DDP, exact resume, W&B, the
f(i) callback, whose histogram over response-token queries is SkipAlign Figure 2) with
the paper's SFT recipe in the presets (SkipAlign §4: 2 epochs, lr 1e-5, no weight decay,
linear warm-up over 3% of the steps, then linear decay). Rows come from data/sft/ (rows.py); the
order is world-size invariant (GlobalOrderSampler), so resuming at step s starts at row
s x rows_per_step. `train.max_steps` is set from `sft.epochs`.

The model starts from `init` (its config, not the YAML `model` section, defines the
architecture). `sft.rope_extension=ntk` first NTK-scales RoPE from the checkpoint's
max_position to `sft.extended_length` (SkipAlign extends LLaMA-2 this way before SFT), for
any variant: Normal SFT with the same scaling separates SkipAlign's rows from its RoPE.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import lightning as L
import torch

from longctx.config import ExperimentConfig
from longctx.config.model import ModelConfig
from longctx.data.packing import GlobalOrderSampler
from longctx.data.sft import SFTRows, load_sft_samples
from longctx.data.tokenizer import Tokenizer
from longctx.errors import ConfigError
from longctx.model.checkpoint import load_model
from longctx.model.rope import RopeScaling
from longctx.train.callbacks.frequency import HostBatchDataModule
from longctx.train.callbacks.training import METRICS_FILE, append_metrics
from longctx.train.loggers import log_scalars, logger_step
from longctx.train.trainer import batch_plan, fit, world_size_from_environment


def build_rows(config: ExperimentConfig, tokenizer: Tokenizer) -> SFTRows:
    sft = config.sft
    samples, report = load_sft_samples(
        sft.data,
        tokenizer,
        max_sample_length=sft.max_sample_length,
        on_bad_sample=sft.on_bad_sample,
        embedded_samples=sft.embedded_samples,
        seed=config.data.seed,
    )
    print(f"sft: {len(samples)} samples from {sft.data}; {report.summary()}")
    return SFTRows(
        samples,
        variant=sft.variant,
        window=config.data.window,
        pad_id=tokenizer.pad_id,
        seed=config.data.seed,
        pack=sft.pack,
        strategy=sft.strategy,
        extended_length=sft.extended_length,
        p=sft.p,
        p_scope=sft.p_scope,
    )


def extended_model_config(model: ModelConfig, position_limit: int, rope_extension: str) -> ModelConfig:
    """The checkpoint's architecture, with RoPE NTK-extended to `position_limit` if asked."""
    if rope_extension == "none" or position_limit <= model.max_position:
        return model
    factor = position_limit / model.max_position
    return dataclasses.replace(model, max_position=position_limit, rope_scaling=RopeScaling("ntk", factor=factor))


class SFTDataModule(HostBatchDataModule):
    def __init__(self, config: ExperimentConfig, rows: SFTRows, rows_per_step: int):
        super().__init__()
        self.config, self.rows, self.rows_per_step = config, rows, rows_per_step

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        trainer = self.trainer
        assert trainer is not None  # Lightning attaches the trainer before it asks for data
        context = self.config.train.context_parallel  # a group's adjacent ranks share rows
        sampler = GlobalOrderSampler(
            len(self.rows),
            seed=self.config.data.seed,
            rank=trainer.global_rank // context,
            world_size=trainer.world_size // context,
            start_row=trainer.global_step * self.rows_per_step,
        )
        return torch.utils.data.DataLoader(self.rows, batch_size=self.config.train.micro_batch_size, sampler=sampler)


def check_sft_config(config: ExperimentConfig) -> None:
    """The settings SFT refuses, checked before any model or tokenizer is read."""
    if not config.init:
        raise ConfigError("init", "SFT starts from a trained model; pass init=CHECKPOINT")
    if config.data.position_transform != "none":
        raise ConfigError(
            "data.position_transform",
            "applies to pretraining rows; SFT positions come from "
            "sft.variant (skipalign spreads them over sft.extended_length)",
        )
    if config.train.loss_weighting != "none":
        raise ConfigError("train.loss_weighting", "weights pretraining rows by position; SFT uses the plain loss")


DERIVED_KEYS = {"train.max_steps": "sft.epochs"}
"""Keys `longctx sft` computes from another (key -> the key it comes from): a value the
user sets for one would be replaced silently, so setting it is an error (cli)."""


def check_not_derived(set_at: dict[str, str]) -> None:
    """`set_at` (dotted key -> where the config set it) sets no key SFT derives."""
    for key, source in DERIVED_KEYS.items():
        if key in set_at:
            raise ConfigError(
                key,
                f"is set ({set_at[key]}), but `longctx sft` computes it from {source} "
                f"(steps = ceil({source} x rows / rows per step)); set {source} instead and remove {key}",
            )


def finetune(config: ExperimentConfig, tokenizer: Tokenizer) -> L.Trainer:
    check_sft_config(config)
    base = load_model(config.init)
    if tokenizer.vocab_size > base.config.vocab_size:
        raise ConfigError(
            "data.tokenizer",
            f"{tokenizer.name} has {tokenizer.vocab_size} tokens, the model at {config.init} {base.config.vocab_size}",
        )
    rows = build_rows(config, tokenizer)
    # NTK reaches sft.extended_length for every variant, so a Normal SFT arm can carry
    # exactly SkipAlign's RoPE scaling (the confound-free control of docs/replication.md)
    scaled_to = rows.position_limit
    if config.sft.rope_extension == "ntk":
        scaled_to = max(rows.position_limit, config.sft.extended_length)
    model_config = extended_model_config(base.config, scaled_to, config.sft.rope_extension)
    if rows.position_limit > model_config.max_position:
        raise ConfigError(
            "sft.extended_length",
            f"{config.sft.variant} rows use positions up to {rows.position_limit - 1}, beyond the model's "
            f"max_position={model_config.max_position}; set sft.rope_extension=ntk or lower sft.extended_length",
        )
    world = world_size_from_environment(config)
    _, rows_per_step = batch_plan(config, world)
    steps = math.ceil(config.sft.epochs * len(rows) / rows_per_step)
    config = dataclasses.replace(
        config,
        model=model_config,
        train=dataclasses.replace(config.train, max_steps=steps),
    )
    print(f"sft: {len(rows)} rows of {config.data.window} tokens, {rows_per_step} per step -> {steps} steps")

    def after(trainer: L.Trainer) -> None:
        if trainer.global_step < steps:  # stopped early (SIGTERM: a lease or time budget ran out)
            print(f"sft: stopped at step {trainer.global_step} of {steps}; the NIAH check runs when a resumed run ends")
            return
        effective = niah_after_sft(config, tokenizer, base.config.max_position)
        metrics = {"niah_after/effective_length": float(effective)}
        append_metrics(Path(config.train.out_dir) / METRICS_FILE, trainer.global_step, metrics)
        log_scalars(trainer, metrics, logger_step(trainer))

    return fit(
        config,
        SFTDataModule(config, rows, rows_per_step),
        fi_window=rows.position_limit,
        initial_state=base.state_dict(),
        tokenizer=tokenizer,
        after=after if config.sft.niah_after else None,
    )


def niah_after_sft(config: ExperimentConfig, tokenizer: Tokenizer, original_window: int) -> int:
    """The effective-length search of the fine-tuned model within and beyond the base
    model's window (SkipAlign Figure 3); rank 0, from the final checkpoint. Writes
    `<out_dir>/niah_after_sft/` and returns the effective length, which `finetune` logs as
    `niah_after/effective_length` (metrics.jsonl and the run's loggers) at the last step."""
    from longctx.eval.niah import evaluation

    out_dir = Path(config.train.out_dir)
    # On eval.device (auto: the GPU when there is one), as `longctx niah` runs: the checkpoint
    # loads on the CPU, and a search decoded there would leave the GPU idle.
    model = load_model(out_dir / "checkpoints" / "last.ckpt").to(evaluation.evaluation_device(config))
    settings = evaluation.search_settings(config, model, max_length=config.sft.niah_max_length or 2 * original_window)
    settings = dataclasses.replace(settings, stop_at_first_failure=False)  # the whole curve, beyond the window too
    haystack = evaluation.load_haystack(config, tokenizer)
    out = out_dir / "niah_after_sft"
    result = evaluation.evaluate(model, config, tokenizer, haystack, settings=settings, cells_dir=out / "cells")
    print(evaluation.format_search(result))
    evaluation.write_result(result, out, f"after SFT ({config.sft.variant})")
    return result.effective_length
