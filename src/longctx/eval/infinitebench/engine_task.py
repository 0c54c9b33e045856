"""InfiniteBench's tasks as tasks of the evaluation engine (eval/task.py): one
`InfiniteBenchTask` per task (`infinitebench-passkey` ...). A cell's samples are
eval/infinitebench/generator.py's samples for (eval.benchmarks.seed, task, length, index)
in the model's own tokenizer and chat frame; each is decoded greedily for the task's tokens
to generate (stopping at EOS) and scored by STRING's compute_scores
(eval/infinitebench/scoring.py). Every record keeps `pred` and `outputs` (the answer first),
so a cell's samples.jsonl is a prediction file `longctx eval-score` reads.
"""

from __future__ import annotations

from typing import Any

from longctx.config.eval import BenchmarkConfig
from longctx.eval.infinitebench.generator import TASKS, InfiniteBenchError, InfiniteBenchGenerator
from longctx.eval.infinitebench.scoring import sample_score
from longctx.eval.prompt_frame import BENCHMARKS_TEMPLATE_KEY, TextTokenizer, prompt_frame
from longctx.eval.task import Sample, Task, stop_at_eos
from longctx.model.inference.generation import Generation


class InfiniteBenchTask(Task):
    def __init__(self, task: str, settings: BenchmarkConfig):
        if task not in TASKS:
            raise InfiniteBenchError(f"InfiniteBench task {task!r} is not one of {list(TASKS)}")
        self.task = task
        self.config = settings
        self.name = f"infinitebench-{task}"
        self._generators: dict[int, InfiniteBenchGenerator] = {}

    def _generator(self, tokenizer: TextTokenizer) -> InfiniteBenchGenerator:
        if id(tokenizer) not in self._generators:
            frame = prompt_frame(tokenizer, self.config.chat_template, BENCHMARKS_TEMPLATE_KEY)
            self._generators[id(tokenizer)] = InfiniteBenchGenerator(tokenizer, frame, self.config.seed)
        return self._generators[id(tokenizer)]

    def samples(self, seed: int, length: int, count: int, tokenizer: TextTokenizer) -> list[Sample]:
        generator = self._generator(tokenizer)
        stop = stop_at_eos(tokenizer)
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
        return sample_score(
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
