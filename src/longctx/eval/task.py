"""What a benchmark gives the evaluation engine: a `Task` that draws `Sample`s and scores them.

    class MyBenchmark(Task):
        name = "my-benchmark"
        def samples(self, seed, length, count, tokenizer) -> list[Sample]: ...
        def score(self, sample, generation) -> float: ...

A cell of an evaluation (eval/cells.py) is (model, position method, task, length); the
engine asks the task for the cell's `count` samples once, before any decoding, decodes
each with `model.inference.generation.generate` under the sample's `max_new_tokens` and `stop`, and
records `score(sample, generation)` (1.0 / 0.0 for pass / fail, or a fraction) plus
`details(sample, generation)` (anything JSON a table needs later, NIAH: which answer was
found at which depth). A cell's score is the mean over its samples.

Determinism: `samples(seed, length, count, tokenizer)[i]` must depend on (seed, task,
length, i) only, never on `count` or on other samples (seed a generator with
[seed, length, i], as eval/niah/generator.py does), so a killed run that resumes, or a rerun with
more samples, sees the same prompts. The engine checks it: every record keeps a hash of
its prompt, and a resumed cell whose prompts changed is refused.

A length too short for a task's fixed part (template, question, needles) is refused by
raising eval/errors.py's `PromptTooShortError` from `samples`: the effective-length search skips that length
and a table leaves its cell out, whichever benchmark the task belongs to.

Each benchmark's tasks: the engine_task.py of its folder, found through eval/registry.py.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from longctx.eval.prompt_frame import TextTokenizer
from longctx.model.inference.generation import Generation, StopRule


def stop_at_eos(tokenizer: TextTokenizer) -> StopRule:
    """Stop a row at the tokenizer's EOS (none for a test double without one): the stop rule
    of every benchmark's samples."""
    eos_id = getattr(tokenizer, "eos_id", None)
    return StopRule(eos_ids=frozenset() if eos_id is None else frozenset({eos_id}))


@dataclass(frozen=True)
class Sample:
    """One prompt of a task and what answers it."""

    index: int
    """Position in the cell: samples(seed, length, count)[index]."""
    prompt_ids: tuple[int, ...]
    """The tokens the model reads."""
    max_new_tokens: int
    """Most tokens to decode."""
    stop: StopRule = field(default_factory=StopRule)
    """When to stop before that (the model's EOS ids, stop strings)."""
    references: tuple[str, ...] = ()
    """The reference answers the score compares against."""
    metadata: dict[str, Any] = field(default_factory=dict, compare=False)
    """What the task's `score`/`details` need beyond the references (JSON-able or not;
    never written)."""

    @property
    def prompt_hash(self) -> str:
        """sha1 of the prompt ids: a resumed cell checks its prompts by it."""
        return hashlib.sha1(",".join(map(str, self.prompt_ids)).encode()).hexdigest()


class Task(ABC):
    """A benchmark on the engine (module docstring)."""

    name: str
    """Its name in cell paths and tables ([a-z0-9_.-]+)."""

    @abstractmethod
    def samples(self, seed: int, length: int, count: int, tokenizer: TextTokenizer) -> list[Sample]:
        """Samples 0..count-1 at context `length` (each a function of seed, length, index)."""

    @abstractmethod
    def score(self, sample: Sample, generation: Generation) -> float:
        """The sample's score in [0, 1]."""

    def details(self, sample: Sample, generation: Generation) -> dict[str, Any]:
        """Extra JSON fields of the sample's record (default none)."""
        return {}

    def settings(self) -> dict[str, Any]:
        """What else fixes its samples and scores (templates, thresholds): written with every
        cell, and a cell on disk with other settings is not reused."""
        return {}
