"""RULER's tasks as tasks of the evaluation engine (eval/task.py): one `RulerTask` per RULER
task (`ruler-niah_single_1` ... `ruler-qa_2`). A cell's samples are eval/ruler/generator.py's
samples for (eval.benchmarks.seed, task, length, index) in the model's own tokenizer and
chat frame; each is decoded greedily for the task's tokens to generate (stopping at EOS)
and scored by RULER's metric (string_match_all / _part after its post-processing:
eval/ruler/scoring.py). Every record keeps `pred` and `outputs`, so a cell's samples.jsonl
is a RULER prediction file (`longctx eval-score`).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from longctx.config.eval import BenchmarkConfig
from longctx.eval.prompt_frame import BENCHMARKS_TEMPLATE_KEY, TextTokenizer, prompt_frame
from longctx.eval.ruler.constants import TASKS, RulerOptions
from longctx.eval.ruler.context import RulerContext
from longctx.eval.ruler.generator import make_sample
from longctx.eval.ruler.scoring import sample_score
from longctx.eval.ruler.tokens import RulerError
from longctx.eval.task import Sample, Task, stop_at_eos
from longctx.model.inference.generation import Generation


class RulerContexts:
    """One RulerContext per tokenizer, shared by the RULER tasks of a grid (the essay is
    tokenised once)."""

    def __init__(self, settings: BenchmarkConfig):
        self.settings = settings
        self._contexts: dict[int, RulerContext] = {}

    def get(self, tokenizer: TextTokenizer) -> RulerContext:
        if id(tokenizer) not in self._contexts:
            options = RulerOptions(
                copy=self.settings.ruler_copy,
                squad_path=self.settings.squad_path or None,
                hotpotqa_path=self.settings.hotpotqa_path or None,
            )
            frame = prompt_frame(tokenizer, self.settings.chat_template, BENCHMARKS_TEMPLATE_KEY)
            self._contexts[id(tokenizer)] = RulerContext(tokenizer, frame, options, seed=self.settings.seed)
        return self._contexts[id(tokenizer)]


class RulerTask(Task):
    def __init__(self, task: str, contexts: RulerContexts):
        if task not in TASKS:
            raise RulerError(f"RULER task {task!r} is not one of {list(TASKS)}")
        self.task = task
        self.contexts = contexts
        self.name = f"ruler-{task}"

    def samples(self, seed: int, length: int, count: int, tokenizer: TextTokenizer) -> list[Sample]:
        ctx = self.contexts.get(tokenizer)
        stop = stop_at_eos(tokenizer)
        drawn = [make_sample(ctx, self.task, length, index) for index in range(count)]
        return [
            Sample(
                index=s.index,
                prompt_ids=tuple(s.input_ids.tolist()),
                max_new_tokens=s.tokens_to_generate,
                stop=stop,
                references=s.outputs,
            )
            for s in drawn
        ]

    def score(self, sample: Sample, generation: Generation) -> float:
        return sample_score(self.task, generation.text or "", sample.references)

    def details(self, sample: Sample, generation: Generation) -> dict[str, Any]:
        return {"pred": generation.text or "", "outputs": list(sample.references)}

    def settings(self) -> dict[str, Any]:
        keys = ("seed", "chat_template", "ruler_copy", "squad_path", "hotpotqa_path")
        values = asdict(self.contexts.settings)
        return {"task": self.task, **{key: values[key] for key in keys}}
