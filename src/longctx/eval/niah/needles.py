"""NIAH task templates: each task's wording, how its needles are drawn and when a test passes
(STRING Table 5, RULER, HELMET; docs/design.md §7.2). eval/niah/samples.py builds the prompts.

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
"""

from __future__ import annotations

from dataclasses import dataclass

from longctx.errors import LongctxError

PLACEMENTS = ("uniform", "quarters")
VALUE_TYPES = ("numbers", "words", "uuids")


class NiahError(LongctxError, ValueError):
    """A sample cannot be built from these arguments."""


class PromptTooShortError(NiahError):
    """The requested length cannot hold the prefix, question and needles."""


class NeedleTokenizationError(NiahError):
    """The tokenizer spells a number differently inside a needle than on its own."""


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
