"""RULER's and InfiniteBench's tasks as tasks of the evaluation engine (eval/task.py).

One `RulerTask` per RULER task (`ruler-niah_single_1` ... `ruler-qa_2`) and one
`InfiniteBenchTask` per InfiniteBench task (`infinitebench-passkey` ...): a cell's samples
are the generators' samples for (eval.benchmarks.seed, task, length, index) in the model's
own tokenizer and chat frame; each is decoded greedily for the task's tokens to generate
(stopping at EOS) and scored by the reference metric (RULER: string_match_all / _part after
RULER's post-processing; InfiniteBench: STRING's compute_scores). Every record keeps `pred`
and `outputs`, so a cell's samples.jsonl is a RULER prediction file (`longctx eval-score`).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from longctx.config.eval import BenchmarkConfig
from longctx.eval import infinitebench
from longctx.eval.generation import Generation, StopRule
from longctx.eval.prompt_frame import TextTokenizer, prompt_frame
from longctx.eval.ruler import RulerContext, RulerOptions, make_sample
from longctx.eval.ruler.constants import TASKS as RULER_TASKS
from longctx.eval.ruler.scoring import sample_score
from longctx.eval.task import Sample, Task

BENCHMARKS_TEMPLATE_KEY = "eval.benchmarks.chat_template"
"""The key that sets RULER's and InfiniteBench's prompt frame (named in its errors)."""


def _stop(tokenizer: TextTokenizer) -> StopRule:
    eos_id = getattr(tokenizer, "eos_id", None)
    return StopRule(eos_ids=frozenset() if eos_id is None else frozenset({eos_id}))


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
        if task not in RULER_TASKS:
            from longctx.eval.ruler import RulerError

            raise RulerError(f"RULER task {task!r} is not one of {list(RULER_TASKS)}")
        self.task = task
        self.contexts = contexts
        self.name = f"ruler-{task}"

    def samples(self, seed: int, length: int, count: int, tokenizer: TextTokenizer) -> list[Sample]:
        ctx = self.contexts.get(tokenizer)
        stop = _stop(tokenizer)
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


class InfiniteBenchTask(Task):
    def __init__(self, task: str, settings: BenchmarkConfig):
        if task not in infinitebench.TASKS:
            from longctx.eval.ruler import RulerError

            raise RulerError(f"InfiniteBench task {task!r} is not one of {list(infinitebench.TASKS)}")
        self.task = task
        self.config = settings
        self.name = f"infinitebench-{task}"
        self._generators: dict[int, infinitebench.InfiniteBenchGenerator] = {}

    def _generator(self, tokenizer: TextTokenizer) -> infinitebench.InfiniteBenchGenerator:
        if id(tokenizer) not in self._generators:
            frame = prompt_frame(tokenizer, self.config.chat_template, BENCHMARKS_TEMPLATE_KEY)
            self._generators[id(tokenizer)] = infinitebench.InfiniteBenchGenerator(tokenizer, frame, self.config.seed)
        return self._generators[id(tokenizer)]

    def samples(self, seed: int, length: int, count: int, tokenizer: TextTokenizer) -> list[Sample]:
        generator = self._generator(tokenizer)
        stop = _stop(tokenizer)
        samples = []
        for index in range(count):
            drawn = generator.sample(self.task, length, index)
            samples.append(
                Sample(
                    index=index,
                    prompt_ids=tuple(drawn.input_ids.tolist()),
                    max_new_tokens=drawn.tokens_to_generate,
                    stop=stop,
                    references=(str(drawn.answer),),
                    metadata={"answer": drawn.answer},
                )
            )
        return samples

    def score(self, sample: Sample, generation: Generation) -> float:
        return infinitebench.sample_score(
            self.task, generation.text or "", sample.metadata["answer"], self.config.infinitebench_math_compat
        )

    def details(self, sample: Sample, generation: Generation) -> dict[str, Any]:
        return {"pred": generation.text or "", "outputs": [sample.metadata["answer"]]}

    def settings(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "seed": self.config.seed,
            "chat_template": self.config.chat_template,
            "math_compat": self.config.infinitebench_math_compat,
        }
