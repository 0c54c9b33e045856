"""NIAH's scorer: whether each answer of a sample appears in the model's output (the
authors' rule, STRING §3 and their script): a case-insensitive substring of the output with
whitespace runs collapsed, so "... 144231." and "x144231y" count and "144 231" does not. A
test passes when at least `min_found` answers are found (eval/niah/engine_task.py).
"""

from __future__ import annotations

from longctx.eval.niah.generator import Sample


def answer_found(answer: str, output: str) -> bool:
    """The answer appears in the output: case-insensitive, whitespace runs collapsed to one space."""
    return answer.lower() in " ".join(output.split()).lower()


def found_answers(sample: Sample, output: str) -> list[bool]:
    """Per answer of `sample` (in `answers` order): does it appear in `output`?"""
    return [answer_found(a, output) for a in sample.answers]
