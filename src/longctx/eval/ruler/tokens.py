"""RULER's prompts in token space and its length rule.

A prompt is built from pieces tokenised once (eval/prompt_pieces.py: `Piece`, `Segment`,
`PieceEncoder`, and why), the haystack size is found from the pieces' token counts
(`largest_fitting`), and the length rule is applied to the concatenated ids, which are what
the model reads (`fit_prompt`): prompt + tokens to generate <= length.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from longctx.errors import LongctxError
from longctx.eval.errors import PromptTooShortError
from longctx.eval.prompt_frame import PromptFrame
from longctx.eval.prompt_pieces import PieceEncoder, Segment


class RulerError(LongctxError, ValueError):
    """A RULER sample cannot be built from these arguments."""


class RulerPromptTooShortError(RulerError, PromptTooShortError):
    """The length cannot hold the task's template, needles and tokens to generate: the
    engine's PromptTooShortError, so the suite and the effective-length search skip that
    (task, length) with a line instead of stopping."""


@dataclass(frozen=True)
class Prompt:
    """A built prompt: the task text in the frame, then the answer prefix."""

    input_ids: np.ndarray
    text: str
    """Task text + answer prefix, without the chat frame (RULER's `input` + `answer_prefix`)."""
    answer_prefix: str


def frame_prompt(encoder: PieceEncoder, frame: PromptFrame, segments: Sequence[Segment], answer_prefix: str) -> Prompt:
    """frame head | task segments | frame tail | answer prefix (RULER: the model template
    wraps the task template, the answer prefix follows it)."""
    task_ids, task_text = encoder.assemble(segments)
    head, tail = np.asarray(frame.head, dtype=np.int64), np.asarray(frame.tail, dtype=np.int64)
    ids = np.concatenate([head, task_ids, tail, encoder.ids(answer_prefix)])
    return Prompt(ids, task_text + answer_prefix, answer_prefix)


def largest_fitting(tokens_of: Callable[[int], int], budget: int, upper: int) -> int:
    """The largest n in [0, upper] with tokens_of(n) <= budget (tokens_of non-decreasing);
    -1 when even n = 0 does not fit."""
    if tokens_of(0) > budget:
        return -1
    low, high = 0, upper
    while low < high:
        middle = (low + high + 1) // 2
        if tokens_of(middle) <= budget:
            low = middle
        else:
            high = middle - 1
    return low


def fit_prompt(
    build: Callable[[int], Prompt], tokens_of: Callable[[int], int], length: int, reserve: int, upper: int, task: str
) -> tuple[int, Prompt]:
    """The prompt with the largest haystack size n such that its ids + `reserve` tokens to
    generate fit `length`. `tokens_of(n)` predicts len(build(n).input_ids) from the pieces;
    the built prompt is measured and n lowered until it fits."""
    budget = length - reserve
    size = largest_fitting(tokens_of, budget, upper)
    while size >= 0:
        prompt = build(size)
        if len(prompt.input_ids) <= budget:
            return size, prompt
        size -= max(1, (len(prompt.input_ids) - budget) // 4)
    raise RulerPromptTooShortError(
        f"task {task!r}: length={length} cannot hold the template, needles and {reserve} tokens to generate"
    )
