"""Needle-in-a-haystack prompts of an exact token length (STRING §3 and Table 5, docs/design.md §7.2).

This module owns the samples of the effective-length probe, prompts of an exact length
(their scoring: eval/niah/scoring.py). A prompt is assembled in token space,

    prefix | haystack[: d_1 H] | needle_1 | haystack[d_1 H : d_2 H] | needle_2 | ... | question + answer prefix

so it has exactly `length` tokens: H = length - |prefix| - |question + answer prefix| -
sum |needle_j| haystack tokens are taken from the haystack (whole sentences, the last one
cut), and needle j goes in at the sentence start at or before token round(d_j H) (d_j is
its depth, a fraction of the haystack region). Its token positions are recorded
(`Needle.token_span`, `Needle.value_span`), so tests and the depth x length heatmap
(STRING Figure 4) see where it really sits. The haystack is tokenised once, sentence by
sentence, and sliced for every length: re-tokenising a growing text per length (as
gkamradt's and the authors' scripts do) costs O(L) encodes per sample; the slice is O(H).
Because pieces are tokenised separately, the ids may differ from tokenising the decoded
prompt at the seams (a handful of tokens); the model reads the ids, which are what we count.

The tasks, their wording and how their needles are drawn: eval/niah/needles.py; the haystack
and its tokenisation: eval/niah/haystack.py.

For number values the tokenizer must spell a number by the same ids inside the needle as alone
(`NeedleTokenizationError` otherwise), which the digit-splitting `bpe-N` tokenizers
guarantee; a GPT-2-style BPE merging " 14" does not.

Randomness: sample (seed, length, index) draws from numpy's generator seeded with
[seed, length, index], so a sample never depends on which others were drawn or in which
order. The haystack starts at its first sentence (as in the paper) unless
`random_start=True`.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from longctx.eval.niah.haystack import Haystack
from longctx.eval.niah.needles import NeedleTask, NeedleTokenizationError, NiahError, NiahPromptTooShortError, get_task
from longctx.eval.prompt_frame import BARE, PromptFrame, TextTokenizer
from longctx.eval.prompt_pieces import spoken_list

_JSON_UNITS_PER_DRAW = 16
SLOT_DRAWS = 50
"""Each of a slot key's two integers is below this (NeedleTask.key_type)."""


@dataclass(frozen=True)
class Needle:
    key: str
    value: str
    depth: float
    """Where it went in: haystack tokens before it / haystack tokens (0 = right after the prefix)."""
    token_span: tuple[int, int]
    """[start, end) of the needle's ids in `Sample.input_ids`."""
    value_span: tuple[int, int]
    """[start, end) of the ids that spell `value`."""
    queried: bool
    """Its value is an answer (else a distractor)."""


@dataclass(frozen=True)
class Sample:
    task: str
    length: int
    seed: int
    index: int
    input_ids: np.ndarray
    """int64 [length]."""
    needles: tuple[Needle, ...]
    """In prompt order."""
    answers: tuple[str, ...]
    """Values to find, in query order."""

    @property
    def needle_token_spans(self) -> tuple[tuple[int, int], ...]:
        return tuple(n.token_span for n in self.needles)

    @property
    def answer_needles(self) -> tuple[Needle, ...]:
        """The needle holding each answer (same order as `answers`)."""
        by_value = {n.value: n for n in self.needles if n.queried}
        return tuple(by_value[a] for a in self.answers)


def _random_value(kind: str, rng: np.random.Generator, digits: int) -> str:
    if kind == "numbers":
        return str(rng.integers(10 ** (digits - 1), 10**digits))
    if kind == "slots":
        return f"slot-{rng.integers(SLOT_DRAWS)}-{rng.integers(SLOT_DRAWS)}"
    return str(uuid.UUID(bytes=rng.bytes(16), version=4))


def _distinct_values(kind: str, count: int, rng: np.random.Generator, digits: int, taken: set[str]) -> list[str]:
    values: list[str] = []
    while len(values) < count:
        value = _random_value(kind, rng, digits)
        if value not in taken:
            taken.add(value)
            values.append(value)
    return values


def _depths(task: NeedleTask, rng: np.random.Generator) -> np.ndarray:
    n = task.num_needles
    if task.placement == "quarters":
        part = 0.99 / n
        return np.arange(n) * part + rng.uniform(0, part, n)
    return np.sort(rng.uniform(0, 1, n))


def _value_span(tokenizer: TextTokenizer, ids: list[int], value: str, is_number: bool, task: str) -> tuple[int, int]:
    """Tokens of `ids` covering the last occurrence of `value` in their decoded text."""
    text = tokenizer.decode(ids)
    first_char = text.rfind(value)
    if first_char < 0:
        raise NiahError(f"task {task!r}: value {value!r} is not in the decoded needle {text!r}")
    ends = [len(tokenizer.decode(ids[:i])) for i in range(len(ids) + 1)]
    start = max(i for i, end in enumerate(ends) if end <= first_char)
    stop = min(i for i, end in enumerate(ends) if end >= first_char + len(value))
    if is_number and ids[start:stop] != tokenizer.encode(value):
        raise NeedleTokenizationError(
            f"tokenizer {tokenizer.name!r} spells the number {value} as {ids[start:stop]} inside the needle "
            f"{text!r} but as {tokenizer.encode(value)} on its own; number needles need a tokenizer whose digits do "
            "not merge with their neighbours (such as the digit-splitting bpe-8192)"
        )
    return start, stop


def _json_haystack(tokenizer: TextTokenizer, task: NeedleTask, num_tokens: int, rng, taken: set[str]) -> Haystack:
    """Random key-value pairs in the needle's format, at least `num_tokens` of them."""
    pairs: list[str] = []
    tokens = 0
    while not pairs or tokens < num_tokens:
        keys = _distinct_values(task.key_type, _JSON_UNITS_PER_DRAW, rng, task.number_digits, taken)
        values = _distinct_values(task.value_type, _JSON_UNITS_PER_DRAW, rng, task.number_digits, taken)
        drawn = [task.needle.format(key=k, value=v) for k, v in zip(keys, values, strict=True)]
        tokens += sum(map(len, tokenizer.encode_batch(drawn)))
        pairs += drawn
    return Haystack.from_pieces(tokenizer, pairs, "json-pairs")


def make_sample(
    tokenizer: TextTokenizer,
    haystack: Haystack | None,
    length: int,
    *,
    task: str | NeedleTask = "paper",
    seed: int = 0,
    index: int = 0,
    depths: Sequence[float] | None = None,
    snap_to_sentence: bool = True,
    random_start: bool = False,
    frame: PromptFrame = BARE,
) -> Sample:
    """One prompt of exactly `length` tokens (see the module docstring), inside `frame`
    (BOS, or an instruct model's chat turn: eval/prompt_frame.py), whose tokens count in `length`.

    depths: one per needle in [0, 1] (default: drawn by the task's placement), sorted; the
    (randomly ordered) needles take them in prompt order. snap_to_sentence: move each
    needle back to a sentence start (a JSON haystack always snaps to a pair). haystack:
    None only for a JSON-haystack task.
    """
    task = get_task(task)
    if task.json_haystack == (haystack is not None):
        need = "no haystack (it draws its own JSON pairs)" if task.json_haystack else "a Haystack"
        raise NiahError(f"task {task.name!r} takes {need}")
    if haystack is not None and haystack.tokenizer_name != tokenizer.name:
        raise NiahError(
            f"haystack {haystack.name!r} was tokenised by {haystack.tokenizer_name!r}, not {tokenizer.name!r}"
        )
    given_depths = None if depths is None else np.asarray(depths, dtype=np.float64)
    if given_depths is not None and (
        given_depths.shape != (task.num_needles,) or not np.all((given_depths >= 0) & (given_depths <= 1))
    ):
        raise NiahError(
            f"depths must be {task.num_needles} numbers in [0, 1] for task {task.name!r}, got {given_depths.tolist()}"
        )
    rng = np.random.default_rng([seed, length, index])

    taken: set[str] = set()
    keys = _distinct_values(task.key_type, task.num_keys, rng, task.number_digits, taken)
    values = [_distinct_values(task.value_type, task.values_per_key, rng, task.number_digits, taken) for _ in keys]
    queried = [int(i) for i in rng.choice(task.num_keys, task.num_queries, replace=False)]
    order = rng.permutation(task.num_needles)
    pairs = [(k, v, i in queried) for i, k in enumerate(keys) for v in values[i]]
    pairs = [pairs[j] for j in order]
    needle_depths = _depths(task, rng) if given_depths is None else np.sort(given_depths)

    query = spoken_list([keys[i] for i in queried])
    prefix_ids = [*frame.head, *tokenizer.encode(task.prefix)]
    question, answer_prefix = task.question.format(query=query), task.answer_prefix.format(query=query)
    if frame.tail:
        tail_ids = [*tokenizer.encode(question), *frame.tail, *tokenizer.encode(answer_prefix)]
    else:
        tail_ids = tokenizer.encode(question + answer_prefix)
    needle_ids = [tokenizer.encode(task.needle.format(key=k, value=v)) for k, v, _ in pairs]
    overhead = len(prefix_ids) + len(tail_ids) + sum(map(len, needle_ids))
    if length < overhead:
        raise NiahPromptTooShortError(
            f"length={length} is below the {overhead} tokens of task {task.name!r}'s frame, prefix, question and "
            f"{task.num_needles} needles under tokenizer {tokenizer.name!r}"
        )
    budget = length - overhead
    if task.json_haystack:
        filler, starts = _json_haystack(tokenizer, task, budget, rng, taken).region(0, budget)
    else:
        assert haystack is not None  # checked above: only JSON-haystack tasks come without one
        start_sentence = int(rng.integers(len(haystack.sentence_starts))) if random_start else 0
        filler, starts = haystack.region(start_sentence, budget)

    points = np.rint(needle_depths * budget).astype(np.int64)
    if snap_to_sentence or task.json_haystack:
        points = starts[np.searchsorted(starts, points, side="right") - 1]

    pieces: list[np.ndarray] = [np.asarray(prefix_ids, dtype=np.int64)]
    needles: list[Needle] = []
    cursor, position = 0, len(prefix_ids)
    for (key, value, is_answer), ids, point in zip(pairs, needle_ids, points.tolist(), strict=True):
        pieces.append(filler[cursor:point])
        position += point - cursor
        first, stop = _value_span(tokenizer, ids, value, task.value_type == "numbers", task.name)
        needles.append(
            Needle(
                key=key,
                value=value,
                depth=point / budget if budget else 0.0,
                token_span=(position, position + len(ids)),
                value_span=(position + first, position + stop),
                queried=is_answer,
            )
        )
        pieces.append(np.asarray(ids, dtype=np.int64))
        position += len(ids)
        cursor = point
    pieces += [filler[cursor:], np.asarray(tail_ids, dtype=np.int64)]
    input_ids = np.concatenate(pieces)
    assert len(input_ids) == length, (len(input_ids), length)  # by construction
    answers = tuple(v for i in queried for v in values[i])
    return Sample(task.name, length, seed, index, input_ids, tuple(needles), answers)


def make_samples(
    tokenizer: TextTokenizer, haystack: Haystack | None, length: int, count: int, **options
) -> list[Sample]:
    """Samples index 0..count-1 of one length (options as for `make_sample`)."""
    return [make_sample(tokenizer, haystack, length, index=i, **options) for i in range(count)]
