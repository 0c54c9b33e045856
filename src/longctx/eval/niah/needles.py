"""NIAH task templates: each task's wording, how its needles are drawn and when a test passes
(STRING Table 5, RULER, HELMET; docs/design.md §7.2). eval/niah/generator.py builds the prompts.

Tasks (`TASKS`; a test passes when at least `min_found` answers appear in the output):

- `paper`: STRING Table 5. Four distinct 6-digit numbers, " One of the magic numbers is
  {n}. ", depths uniform in [0, 1) (the paper does not say how it draws them), pass with
  >= 2 of 4 found.
- `string-repo`: the authors' script (HKUNLP/STRING niah test): " One of the magic number
  is: {n}. ", the prefix ends in one newline, needle j uniform inside the j-th quarter of
  [0, 0.99). Unlike the script, each test draws fresh needles (the script reuses one set of
  four numbers for all 500 tests) and never draws a 7-digit 1000000.
- RULER's NIAH variants are RULER's own tasks on the engine (eval/ruler/,
  `eval.niah.task=ruler-niah_multikey_1` and the like; config/eval.py names the
  replacement of each former `ruler-*` variant).
- `helmet-json-kv` (HELMET's JSON KV recall, after Liu et al. 2023's kv_retrieval): the
  haystack is a JSON object of random UUID pairs drawn per sample; one pair is queried.
  HELMET's wording is kept, "the JSON object below" although the object comes first.
"""

from __future__ import annotations

from dataclasses import dataclass

from longctx.errors import LongctxError
from longctx.eval.errors import PromptTooShortError

PLACEMENTS = ("uniform", "quarters")
VALUE_TYPES = ("numbers", "slots", "uuids")


class NiahError(LongctxError, ValueError):
    """A sample cannot be built from these arguments."""


class NiahPromptTooShortError(NiahError, PromptTooShortError):
    """The requested length cannot hold the prefix, question and needles: a NiahError like
    every NIAH refusal, and the engine's PromptTooShortError the search and tables skip."""


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
    key_type: str = "slots"
    """numbers | slots | uuids. `slots`: keys the prompt never names (the 4-needle tasks ask
    for "the magic numbers"), each drawn as two integers below 50 from the sample's
    generator, which fixes where its stream stands when the values are drawn."""
    value_type: str = "numbers"
    """numbers | uuids; the answers."""
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
