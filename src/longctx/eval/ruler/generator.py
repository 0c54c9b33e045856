"""RULER samples: `make_sample(ctx, task, length, index)` for any of the 13 tasks.

    ctx = RulerContext(tokenizer, frame=prompt_frame(tokenizer, "auto"))
    sample = make_sample(ctx, "niah_multikey_2", 131072, index=0)
    sample.input_ids        # what the model reads: frame + task text + answer prefix
    sample.outputs          # the references the metric looks for in the generated text

Length rule (every task): len(input_ids) + tokens_to_generate <= length, with the haystack
as large as that allows (RULER's binary search, counted with the model's own tokenizer, the
chat frame and the answer prefix included).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from longctx.eval.ruler.constants import TASKS
from longctx.eval.ruler.context import RulerContext
from longctx.eval.ruler.niah import niah_sample
from longctx.eval.ruler.qa import qa_sample
from longctx.eval.ruler.tokens import RulerError
from longctx.eval.ruler.variable_tracking import vt_sample
from longctx.eval.ruler.words import cwe_sample, fwe_sample

_FAMILY_SAMPLERS = {
    "niah": niah_sample,
    "variable_tracking": vt_sample,
    "common_words_extraction": cwe_sample,
    "freq_words_extraction": fwe_sample,
    "qa": qa_sample,
}


@dataclass(frozen=True)
class RulerSample:
    task: str
    length: int
    index: int
    input_ids: np.ndarray
    """int64: chat frame head, task text, frame tail, answer prefix."""
    text: str
    """The task text and answer prefix, without the chat frame."""
    answer_prefix: str
    outputs: tuple[str, ...]
    tokens_to_generate: int
    metric: str
    info: dict = field(default_factory=dict)
    """Generator details (haystack size, needle depths) for tests and plots."""


def make_sample(ctx: RulerContext, task: str, length: int, index: int) -> RulerSample:
    if task not in TASKS:
        raise RulerError(f"RULER task {task!r} is not one of {list(TASKS)}")
    spec = TASKS[task]
    prompt, outputs, info = _FAMILY_SAMPLERS[spec.family](ctx, spec, length, index)
    family = spec.spec
    return RulerSample(
        task=task,
        length=length,
        index=index,
        input_ids=prompt.input_ids,
        text=prompt.text,
        answer_prefix=prompt.answer_prefix,
        outputs=tuple(outputs),
        tokens_to_generate=family.tokens_to_generate,
        metric=family.metric,
        info=info,
    )


def make_samples(ctx: RulerContext, task: str, length: int, count: int, start: int = 0) -> list[RulerSample]:
    return [make_sample(ctx, task, length, index) for index in range(start, start + count)]
