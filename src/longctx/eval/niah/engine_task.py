"""The needle-in-a-haystack test as a task of the evaluation engine (eval/task.py).

A sample is eval/niah/generator.py's prompt of exactly `length` tokens for (seed, length, index),
inside the configured frame (BOS or a chat turn, eval/prompt_frame.py); the model decodes up to
`eval.niah.max_new_tokens` tokens greedily and stops at the tokenizer's EOS. The score is
1 when at least `min_found` answers (the task's default, 2 of 4 for `paper`) appear in the
output (case-insensitive, whitespace collapsed: eval/niah/scoring.py), else 0; the record keeps
which answer was found and its needle's depth, from which eval/niah/table.py draws the
depth band where a model fails most (STRING Table 4) and the effective-length search
(eval/effective_length.py) its depth x length heatmap. `longctx niah`, the training probe
and `niah-table` all run this task, so a table cell's pass rate is the search's at that
length.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from longctx.config import NiahConfig
from longctx.errors import ConfigError
from longctx.eval.niah.generator import make_samples
from longctx.eval.niah.haystack import Haystack
from longctx.eval.niah.needles import get_task
from longctx.eval.niah.scoring import found_answers
from longctx.eval.prompt_frame import TextTokenizer, prompt_frame
from longctx.eval.task import Sample, Task, stop_at_eos
from longctx.model.inference.generation import Generation


def check_task_settings(config: NiahConfig) -> None:
    """Raise ConfigError naming the key when the task or its `min_found` is not usable."""
    try:
        task = get_task(config.task)
    except ValueError as error:
        raise ConfigError("eval.niah.task", str(error)) from None
    if config.min_found is not None and not 1 <= config.min_found <= task.num_answers:
        raise ConfigError(
            "eval.niah.min_found", f"must be in [1, {task.num_answers}] for task {task.name!r}, got {config.min_found}"
        )


class NiahTask(Task):
    """`eval.niah` as a task: name `niah-<eval.niah.task>`."""

    def __init__(self, settings: NiahConfig, haystack: Haystack | None):
        check_task_settings(settings)
        self.config = settings
        self.haystack = haystack
        self.needles = get_task(settings.task)
        self.min_found = settings.min_found or self.needles.min_found
        self.name = f"niah-{self.needles.name}"

    def samples(self, seed: int, length: int, count: int, tokenizer: TextTokenizer) -> list[Sample]:
        stop = stop_at_eos(tokenizer)
        drawn = make_samples(
            tokenizer,
            self.haystack,
            length,
            count,
            task=self.needles,
            seed=seed,
            snap_to_sentence=self.config.snap_to_sentence,
            random_start=self.config.random_start,
            frame=prompt_frame(tokenizer, self.config.chat_template),
        )
        return [
            Sample(
                index=needles.index,
                prompt_ids=tuple(needles.input_ids.tolist()),
                max_new_tokens=self.config.max_new_tokens,
                stop=stop,
                references=needles.answers,
                metadata={"niah": needles},
            )
            for needles in drawn
        ]

    def score(self, sample: Sample, generation: Generation) -> float:
        return float(sum(found_answers(sample.metadata["niah"], generation.text or "")) >= self.min_found)

    def details(self, sample: Sample, generation: Generation) -> dict[str, Any]:
        needles = sample.metadata["niah"]
        return {
            "answers": list(needles.answers),
            "found": found_answers(needles, generation.text or ""),
            "depths": [needle.depth for needle in needles.answer_needles],
        }

    def settings(self) -> dict[str, Any]:
        """The eval.niah keys that fix prompts and scores (not the decoding batch sizes)."""
        keys = ("task", "haystack", "max_new_tokens", "min_found", "snap_to_sentence", "random_start", "chat_template")
        values = asdict(self.config)
        return {**{key: values[key] for key in keys}, "min_found": self.min_found}
