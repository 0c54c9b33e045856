"""Effective length during training, next to f(i) (STRING Figure 2a/2b from one run).

Every `probe.niah_every_steps` optimizer steps the NIAH effective-length search
(eval/niah/evaluation.py, `eval.*` settings, `probe.niah_tests_per_length` tests per
length, a fixed seed so every evaluation sees the same tests) runs on the model being
trained, one engine cell per length under `<out>/niah/step-N/cells/` (rank 0; a rerun of
a step starts its cells afresh, the weights being those of this run), and logs

    niah/effective_length           Figure 2a: effective length vs tokens seen
    niah/f_at_effective_length      Figure 2b: effective length vs f(effective length)
    niah/pass_rate                  a table: length, pass rate, Wilson 95% interval
    niah/heatmap                    the depth x length recall heatmap (Figure 4)

through every configured logger (tables and images where it holds them, files otherwise:
train/loggers.py), at the logger step of Lightning's metrics for that optimizer step.

The search runs identically on every rank (under FSDP each forward is a collective over
the shards, so all ranks must take part); rank 0 logs. Cost: tests x lengths prompts of
up to the training window (the target length under a `data.position_transform`) plus ~48
decoded tokens each; keep the test count small.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import lightning as L

from longctx.config import ExperimentConfig
from longctx.config.eval import NiahConfig
from longctx.data.tokenizer import Tokenizer
from longctx.eval.niah.evaluation import evaluate, search_settings, write_result
from longctx.eval.niah.haystack import Haystack
from longctx.model.llama import Llama
from longctx.train.callbacks.frequency import PositionFrequencyCallback
from longctx.train.callbacks.training import METRICS_FILE, StepCallback, append_metrics
from longctx.train.loggers import log_image, log_scalars, log_table, logger_step


def probe_settings(config: ExperimentConfig, model: Llama) -> NiahConfig:
    """The search this probe runs: `eval.niah` with `probe.niah_tests_per_length` tests,
    up to the longest position trained (the window, or the target length L_t that a
    `data.position_transform` spreads the ids over)."""
    settings = search_settings(config, model, tests_per_length=config.probe.niah_tests_per_length)
    data = config.data
    trained = data.window if data.position_transform == "none" else data.target_length
    return dataclasses.replace(settings, max_length=min(settings.max_length, trained))


class EffectiveLengthCallback(StepCallback):
    def __init__(self, config: ExperimentConfig, tokenizer: Tokenizer, haystack: Haystack | None, out_dir: Path):
        self.config, self.tokenizer, self.haystack, self.out_dir = config, tokenizer, haystack, out_dir
        self.every_steps = config.probe.niah_every_steps

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args) -> None:
        step = trainer.global_step
        if not self.step_completed(trainer) or step % self.every_steps:
            return
        model = pl_module.model
        assert isinstance(model, Llama)  # LanguageModelModule holds the Llama as `model`
        settings = probe_settings(self.config, model)
        out = self.out_dir / "niah" / f"step-{step:07d}"
        cells = None  # the other ranks take part in every forward but keep nothing
        if trainer.is_global_zero:
            cells = out / "cells"
            shutil.rmtree(cells, ignore_errors=True)
        result = evaluate(model, self.config, self.tokenizer, self.haystack, settings=settings, cells_dir=cells)
        callbacks: list[L.Callback] = trainer.callbacks  # type: ignore[attr-defined]  # set by Lightning's connector
        frequency = next((c for c in callbacks if isinstance(c, PositionFrequencyCallback)), None)
        total = frequency.counts.all_reduce() if frequency is not None else None  # collective
        if not trainer.is_global_zero:
            return
        metrics = {"niah/effective_length": float(result.effective_length)}
        if total is not None and 0 < result.effective_length <= len(total.relative):
            metrics["niah/f_at_effective_length"] = float(total.relative[result.effective_length - 1])
        append_metrics(self.out_dir / METRICS_FILE, step, metrics)
        _, heatmap = write_result(result, out, f"step {step}")
        at = logger_step(trainer)  # the step of Lightning's metrics for this optimizer step
        log_scalars(trainer, metrics, at)
        log_table(
            trainer,
            "niah/pass_rate",
            ["length", "tests", "passed", "rate", "wilson_low", "wilson_high"],
            [[r.length, r.tests, r.passed, r.rate, r.wilson_low, r.wilson_high] for r in result.per_length],
            at,
        )
        log_image(trainer, "niah/heatmap", heatmap, at)
