"""Held-out answer loss during training: when does a run leave chance?

The miniature replication needs models that retrieve; NIAH's substring score is 0 both
before the model learns the answer format and while it writes the format with wrong
digits. Every `probe.answer_every_steps` optimizer steps this probe runs
`probes/retrieval_answers.answer_metrics` (teacher-forced, `probe.answer_documents`
held-out documents that fit the window) on every `kind: retrieval` source of `data.mixture`
but the `template: repeat` copying drills, and appends to metrics.jsonl

    answers/loss          mean cross-entropy over the value tokens of all answers, pooled
                          over the sources by answer count; chance for a digit is ln 10
    answers/value_exact   share of answers copied exactly
    answers/loss_s<i>     the same loss for source i alone

A run "leaves chance" at the first probe with answers/loss below 2.0 nats
(longctx_replication.seed_verdicts.LEAVES_CHANCE_NATS). Every rank measures (under FSDP each
forward is a collective over the shards, so all ranks must take part; the held-out documents
are the same on every rank) and rank 0 logs. With `probe.answer_stop_below` > 0 the
run ends at the first probe below it: a recipe-tuning run needs only the step at which it
left chance (sweeps/replicate_tuning.yaml), and a run that has left it would spend the
rest of its steps on a question already answered. Every rank then joins one boolean
all-reduce at that step, so they all stop together.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L

from longctx.config import ExperimentConfig
from longctx.data.tokenizer import Tokenizer
from longctx.model.llama import Llama
from longctx.probes.retrieval_answers import answer_metrics
from longctx.train.callbacks.training import METRICS_FILE, StepCallback, append_metrics
from longctx.train.loggers import log_scalars, logger_step


class AnswerLossCallback(StepCallback):
    def __init__(self, config: ExperimentConfig, tokenizer: Tokenizer, out_dir: Path):
        self.config, self.tokenizer, self.out_dir = config, tokenizer, out_dir
        self.sources = [
            (i, s.retrieval)
            for i, s in enumerate(config.data.mixture)
            if s.kind == "retrieval" and s.retrieval.template != "repeat"  # a copying drill, not a NIAH answer
        ]

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args) -> None:
        if not self.step_completed(trainer) or trainer.global_step % self.config.probe.answer_every_steps:
            return
        loss = self._measure(trainer, pl_module, trainer.global_step)
        threshold = self.config.probe.answer_stop_below
        if threshold:  # every rank reaches this step: one boolean collective, rank 0 decides
            left = trainer.is_global_zero and loss < threshold
            if trainer.strategy.reduce_boolean_decision(left, all=False):
                trainer.should_stop = True

    def _measure(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int) -> float:
        model = pl_module.model
        assert isinstance(model, Llama)  # LanguageModelModule holds the Llama as `model`
        was_training = model.training
        metrics: dict[str, float] = {}
        loss_sum = exact_sum = answers = 0.0
        for index, retrieval in self.sources:
            result = answer_metrics(
                model, self.tokenizer, retrieval, self.config.data.window, documents=self.config.probe.answer_documents
            )
            metrics[f"answers/loss_s{index}"] = result["answer_loss"]
            loss_sum += result["answer_loss"] * result["answers"]
            exact_sum += result["value_exact"] * result["answers"]
            answers += result["answers"]
        model.train(was_training)
        metrics["answers/loss"] = loss_sum / answers
        metrics["answers/value_exact"] = exact_sum / answers
        if trainer.is_global_zero:
            append_metrics(self.out_dir / METRICS_FILE, step, metrics)
            log_scalars(trainer, metrics, logger_step(trainer))
        return metrics["answers/loss"]
