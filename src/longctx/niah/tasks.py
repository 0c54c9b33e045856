"""Needle-in-a-haystack prompts of an exact token length (STRING §3 and Table 5, docs/design.md §7.2).

This module owns the samples of the effective-length probe: the haystack, the needles, the
prompt templates and the scoring of an answer. A prompt is assembled in token space,

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

Tasks (`TASKS`; a test passes when at least `min_found` answers appear in the output):

- `paper`: STRING Table 5. Four distinct 6-digit numbers, " One of the magic numbers is
  {n}. ", depths uniform in [0, 1) (the paper does not say how it draws them), pass with
  >= 2 of 4 found.
- `string-repo`: the authors' script (HKUNLP/STRING niah test): " One of the magic number
  is: {n}. ", the prefix ends in one newline, needle j uniform inside the j-th quarter of
  [0, 0.99). Unlike the script, each test draws fresh needles (the script reuses one set of
  four numbers for all 500 tests) and never draws a 7-digit 1000000.
- `ruler-multikey` / `ruler-multivalue` / `ruler-multiquery` (RULER, Hsieh et al. 2024,
  niah.py): "One of the special magic {kind} for {key} is: {value}." with 4 keys x 1 value
  (1 queried: the other 3 are distractors), 1 key x 4 values, 4 keys x 1 value (all 4
  queried). Keys are words (adjective-noun) or UUIDs, values 7-digit numbers, words or
  UUIDs (`ruler_task`). Pass when every queried value is found (RULER scores the mean).
- `helmet-json-kv` (HELMET's JSON KV recall, after Liu et al. 2023's kv_retrieval): the
  haystack is a JSON object of random UUID pairs drawn per sample; one pair is queried.
  HELMET's wording is kept, "the JSON object below" although the object comes first.

Answer detection (the authors' rule): case-insensitive substring of the output with
whitespace runs collapsed, so "... 144231." and "x144231y" count and "144 231" does not.
For number values the tokenizer must spell a number by the same ids inside the needle as
alone (`NeedleTokenizationError` otherwise), which the digit-splitting `bpe-N` tokenizers
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
from pathlib import Path
from typing import Protocol

import numpy as np

from longctx.data.sentences import split_sentences
from longctx.errors import LongctxError
from longctx.niah.chat import BARE, PromptFrame
from longctx.niah.haystack import paul_graham_text
from longctx.niah.words import ADJECTIVES, NOUNS

PLACEMENTS = ("uniform", "quarters")
VALUE_TYPES = ("numbers", "words", "uuids")
_JSON_UNITS_PER_DRAW = 16


class NiahError(LongctxError, ValueError):
    """A sample cannot be built from these arguments."""


class PromptTooShortError(NiahError):
    """The requested length cannot hold the prefix, question and needles."""


class NeedleTokenizationError(NiahError):
    """The tokenizer spells a number differently inside a needle than on its own."""


class TextTokenizer(Protocol):
    """What this module needs of `longctx.data.tokenizer.Tokenizer`."""

    name: str

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


# --------------------------------------------------------------------------- tasks


@dataclass(frozen=True)
class NeedleTask:
    """A prompt template and how its needles are drawn and scored."""

    name: str
    prefix: str
    """Instruction before the haystack."""
    needle: str
    """One needle; `{key}` and `{value}` are filled in."""
    question: str
    """After the haystack; `{query}` is the queried key(s) joined as "a, b, and c"."""
    answer_prefix: str
    """Start of the answer, which the model continues."""
    num_keys: int = 1
    """Distinct keys; each gets `values_per_key` needles."""
    values_per_key: int = 4
    num_queries: int = 1
    """Keys asked for; their values are the answers, the other needles distractors."""
    key_type: str = "words"
    """numbers | words (adjective-noun) | uuids."""
    value_type: str = "numbers"
    """numbers | words | uuids; the answers."""
    number_digits: int = 6
    """Digits of a number key or value (STRING: 6, RULER: 7)."""
    placement: str = "uniform"
    """uniform: each depth uniform in [0, 1); quarters: needle j uniform in the j-th of
    `num_needles` equal parts of [0, 0.99) (the authors' script)."""
    min_found: int = 2
    """A test passes when at least this many answers appear in the output."""
    json_haystack: bool = False
    """Haystack = random UUID pairs formatted like the needle (HELMET JSON KV), not text."""

    def __post_init__(self) -> None:
        for field_name in ("num_keys", "values_per_key", "num_queries", "number_digits", "min_found"):
            if getattr(self, field_name) < 1:
                raise NiahError(f"task {self.name!r}: {field_name} must be >= 1, got {getattr(self, field_name)}")
        if self.num_queries > self.num_keys:
            raise NiahError(f"task {self.name!r}: num_queries={self.num_queries} exceeds num_keys={self.num_keys}")
        if self.min_found > self.num_answers:
            raise NiahError(f"task {self.name!r}: min_found={self.min_found} exceeds its {self.num_answers} answers")
        if self.placement not in PLACEMENTS:
            raise NiahError(f"task {self.name!r}: placement {self.placement!r} is not one of {PLACEMENTS}")
        for field_name in ("key_type", "value_type"):
            if getattr(self, field_name) not in VALUE_TYPES:
                value = getattr(self, field_name)
                raise NiahError(f"task {self.name!r}: {field_name} {value!r} is not one of {VALUE_TYPES}")

    @property
    def num_needles(self) -> int:
        return self.num_keys * self.values_per_key

    @property
    def num_answers(self) -> int:
        return self.num_queries * self.values_per_key


_NIAH_PREFIX = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
    "I will quiz you about the important information there."
)
_NIAH_QUESTION = "\n\nWhat are the magic numbers mentioned in the provided text?"
_NIAH_ANSWER = "\nThe numbers are"


def ruler_task(variant: str, key_type: str = "words", value_type: str = "numbers") -> NeedleTask:
    """RULER's NIAH `multikey`, `multivalue` or `multiquery` with the given key/value types."""
    shapes = {"multikey": (4, 1, 1), "multivalue": (1, 4, 1), "multiquery": (4, 1, 4)}
    if variant not in shapes:
        raise NiahError(f"RULER variant {variant!r} is not one of {sorted(shapes)}")
    num_keys, values_per_key, num_queries = shapes[variant]
    plural = values_per_key * num_queries > 1
    kind = value_type if plural else value_type[:-1]
    some, are_all, are = ("Some", "are all", "are") if plural else ("A", "is", "is")
    return NeedleTask(
        name=f"ruler-{variant}",
        prefix=f"{some} special magic {kind} {are} hidden within the following text. Make sure to memorize it. "
        f"I will quiz you about the {kind} afterwards.\n",
        needle=f" One of the special magic {value_type} for {{key}} is: {{value}}.",
        question=f"\nWhat {are_all} the special magic {kind} for {{query}} mentioned in the provided text?",
        answer_prefix=f" The special magic {kind} for {{query}} mentioned in the provided text {are}",
        num_keys=num_keys,
        values_per_key=values_per_key,
        num_queries=num_queries,
        key_type=key_type,
        value_type=value_type,
        number_digits=7,
        min_found=values_per_key * num_queries,
    )


TASKS: dict[str, NeedleTask] = {
    "paper": NeedleTask(
        name="paper",
        prefix=_NIAH_PREFIX + "\n\n",
        needle=" One of the magic numbers is {value}. ",
        question=_NIAH_QUESTION,
        answer_prefix=_NIAH_ANSWER,
    ),
    "string-repo": NeedleTask(
        name="string-repo",
        prefix=_NIAH_PREFIX + "\n",
        needle=" One of the magic number is: {value}. ",
        question=_NIAH_QUESTION,
        answer_prefix=_NIAH_ANSWER,
        placement="quarters",
    ),
    **{f"ruler-{v}": ruler_task(v) for v in ("multikey", "multivalue", "multiquery")},
    "helmet-json-kv": NeedleTask(
        name="helmet-json-kv",
        prefix="JSON data:\n{",
        needle='"{key}": "{value}",\n ',
        question="}}\n\nExtract the value corresponding to the specified key in the JSON object below."
        '\n\nKey: "{query}"',
        answer_prefix="\nCorresponding value:",
        values_per_key=1,
        key_type="uuids",
        value_type="uuids",
        min_found=1,
        json_haystack=True,
    ),
}


def get_task(task: str | NeedleTask) -> NeedleTask:
    if isinstance(task, NeedleTask):
        return task
    if task not in TASKS:
        raise NiahError(f"NIAH task {task!r} is not one of {sorted(TASKS)}")
    return TASKS[task]


# --------------------------------------------------------------------------- haystack


@dataclass(frozen=True)
class Haystack:
    """A text tokenised once, sentence by sentence: `ids` and the token index of every sentence start."""

    name: str
    tokenizer_name: str
    ids: np.ndarray
    """int64 [N]: all sentences' ids, concatenated."""
    sentence_starts: np.ndarray
    """int64 [S]: index in `ids` where each sentence starts (ascending, the first is 0)."""

    @classmethod
    def from_pieces(cls, tokenizer: TextTokenizer, pieces: Sequence[str], name: str) -> Haystack:
        """Each piece (sentence, JSON pair) tokenised on its own, then concatenated."""
        token_lists = [ids for ids in tokenizer.encode_batch(pieces) if ids]
        if not token_lists:
            raise NiahError(f"haystack {name!r} has no tokens")
        lengths = np.array([len(ids) for ids in token_lists], dtype=np.int64)
        ids = np.fromiter((i for ids in token_lists for i in ids), dtype=np.int64, count=int(lengths.sum()))
        return cls(name, tokenizer.name, ids, np.concatenate([[0], np.cumsum(lengths)[:-1]]))

    @classmethod
    def from_text(cls, tokenizer: TextTokenizer, text: str, name: str = "text") -> Haystack:
        return cls.from_pieces(tokenizer, split_sentences(text), name)

    @classmethod
    def from_file(cls, tokenizer: TextTokenizer, path: str | Path) -> Haystack:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"haystack file {path} does not exist")
        return cls.from_text(tokenizer, path.read_text(encoding="utf-8"), name=path.name)

    @classmethod
    def paul_graham(cls, tokenizer: TextTokenizer) -> Haystack:
        return cls.from_text(tokenizer, paul_graham_text(), name="paul-graham-essays")

    def region(self, start_sentence: int, num_tokens: int) -> tuple[np.ndarray, np.ndarray]:
        """`num_tokens` ids from sentence `start_sentence` on, wrapping around at the end, and
        the sentence starts inside them (relative, ascending, the first is 0)."""
        total = len(self.ids)
        offset = int(self.sentence_starts[start_sentence])
        ids = self.ids[(offset + np.arange(num_tokens)) % total]
        laps = (offset + num_tokens) // total + 1
        starts = (self.sentence_starts[None, :] + total * np.arange(laps)[:, None]).ravel() - offset
        return ids, starts[(starts >= 0) & (starts < max(num_tokens, 1))]


# --------------------------------------------------------------------------- samples


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
    if kind == "words":
        return f"{ADJECTIVES[rng.integers(len(ADJECTIVES))]}-{NOUNS[rng.integers(len(NOUNS))]}"
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


def _join(keys: list[str]) -> str:
    return keys[0] if len(keys) == 1 else ", ".join(keys[:-1]) + ", and " + keys[-1]


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
    (BOS, or an instruct model's chat turn: niah/chat.py), whose tokens count in `length`.

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

    query = _join([keys[i] for i in queried])
    prefix_ids = [*frame.head, *tokenizer.encode(task.prefix)]
    question, answer_prefix = task.question.format(query=query), task.answer_prefix.format(query=query)
    if frame.tail:
        tail_ids = [*tokenizer.encode(question), *frame.tail, *tokenizer.encode(answer_prefix)]
    else:
        tail_ids = tokenizer.encode(question + answer_prefix)
    needle_ids = [tokenizer.encode(task.needle.format(key=k, value=v)) for k, v, _ in pairs]
    overhead = len(prefix_ids) + len(tail_ids) + sum(map(len, needle_ids))
    if length < overhead:
        raise PromptTooShortError(
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


# --------------------------------------------------------------------------- scoring


def answer_found(answer: str, output: str) -> bool:
    """The answer appears in the output: case-insensitive, whitespace runs collapsed to one space."""
    return answer.lower() in " ".join(output.split()).lower()


def found_answers(sample: Sample, output: str) -> list[bool]:
    """Per answer of `sample` (in `answers` order): does it appear in `output`?"""
    return [answer_found(a, output) for a in sample.answers]
