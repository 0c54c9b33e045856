"""What any benchmark's task raises that the generic code catches: the effective-length
search (eval/effective_length.py) skips a length whose prompt cannot fit and a table
(eval/niah/table.py) leaves its cell out, whichever benchmark refused it. Below every
benchmark folder and free of torch, so a benchmark's torch-free modules (its names and
generator) can raise it."""

from __future__ import annotations

from longctx.errors import LongctxError


class PromptTooShortError(LongctxError, ValueError):
    """The requested length cannot hold the task's fixed part (template, question, needles)."""
