"""RULER's task table (Hsieh et al. 2024, NVIDIA/RULER `scripts/synthetic.yaml`,
`scripts/data/synthetic/constants.py`, `scripts/eval/synthetic/constants.py`).

Thirteen tasks in five families. Each family has one prompt template (the context and query
go in it), one answer prefix (the start of the model's answer, after the chat turn when
there is one), a number of tokens to generate (the length rule reserves them) and a metric.
The 13 tasks are the families with RULER's arguments. `REFERENCE_COPIES` names the two
copies of the generator whose rules differ (NVIDIA/RULER today and the older copy HKUNLP/
STRING ships under `ruler/`); `RulerOptions.copy` picks one where they disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

DEPTHS = tuple(int(d) for d in np.round(np.linspace(0, 100, num=40, endpoint=True)).astype(int))
"""The 40 needle depths (percent of the essay's sentences) RULER samples without replacement."""

NIAH_NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."


@dataclass(frozen=True)
class Family:
    """One of RULER's generators (`scripts/data/synthetic/<name>.py`)."""

    name: str
    template: str
    answer_prefix: str
    tokens_to_generate: int
    metric: str
    """string_match_all | string_match_part (scoring.py)."""


FAMILIES: dict[str, Family] = {
    "niah": Family(
        "niah",
        "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
        "I will quiz you about the {type_needle_v} afterwards.\n{context}\n"
        "What are all the special magic {type_needle_v} for {query} mentioned in the provided text?",
        " The special magic {type_needle_v} for {query} mentioned in the provided text are",
        128,
        "string_match_all",
    ),
    "variable_tracking": Family(
        "variable_tracking",
        "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
        "Question: Find all variables that are assigned the value {query} in the text above.",
        " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
        "assigned the value {query}, they are: ",
        30,
        "string_match_all",
    ),
    "common_words_extraction": Family(
        "common_words_extraction",
        "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones "
        "that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?",
        " Answer: The top 10 words that appear most often in the list are:",
        120,
        "string_match_all",
    ),
    "freq_words_extraction": Family(
        "freq_words_extraction",
        "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
        "appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the dots '....'. "
        "What are the three most frequently appeared words in the above coded text?",
        " Answer: According to the coded text above, the three most frequently appeared words are:",
        50,
        "string_match_all",
    ),
    "qa": Family(
        "qa",
        "Answer the question based on the given documents. Only give me the answer and do not output any other "
        "words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given "
        "documents. Only give me the answer and do not output any other words.\n\nQuestion: {query}",
        " Answer:",
        32,
        "string_match_part",
    ),
}

STRING_VT_ANSWER_PREFIX = FAMILIES["variable_tracking"].answer_prefix.replace(
    "assigned the value", "assgined the value"
)
"""The STRING copy's vt answer prefix (its constants.py spells "assgined")."""


@dataclass(frozen=True)
class Task:
    """A row of RULER's synthetic.yaml."""

    name: str
    family: str
    args: dict = field(default_factory=dict)

    @property
    def spec(self) -> Family:
        return FAMILIES[self.family]


def _niah(name: str, haystack: str, key: str, value: str, k: int = 1, v: int = 1, q: int = 1) -> Task:
    args = dict(type_haystack=haystack, type_needle_k=key, type_needle_v=value, num_needle_k=max(k, q))
    return Task(name, "niah", {**args, "num_needle_v": v, "num_needle_q": q})


TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        _niah("niah_single_1", "noise", "words", "numbers"),
        _niah("niah_single_2", "essay", "words", "numbers"),
        _niah("niah_single_3", "essay", "words", "uuids"),
        _niah("niah_multikey_1", "essay", "words", "numbers", k=4),
        _niah("niah_multikey_2", "needle", "words", "numbers"),
        _niah("niah_multikey_3", "needle", "uuids", "uuids"),
        _niah("niah_multivalue", "essay", "words", "numbers", v=4),
        _niah("niah_multiquery", "essay", "words", "numbers", q=4),
        Task("vt", "variable_tracking", {"num_chains": 1, "num_hops": 4}),
        Task("cwe", "common_words_extraction", {"freq_cw": 30, "freq_ucw": 3, "num_cw": 10}),
        Task("fwe", "freq_words_extraction", {"alpha": 2.0, "coded_wordlen": 6}),
        Task("qa_1", "qa", {"dataset": "squad"}),
        Task("qa_2", "qa", {"dataset": "hotpotqa"}),
    )
}
"""RULER's 13 tasks in its order (scripts/config_tasks.sh)."""

QA_TASKS = ("qa_1", "qa_2")
SYNTHETIC_TASKS = tuple(name for name in TASKS if name not in QA_TASKS)
"""The 11 tasks that need no dataset; their mean is reported as "RULER-11", never "RULER"."""

EFFECTIVE_THRESHOLD = 85.6
"""RULER's threshold (Llama-2-7B's score at 4K): the effective length is the largest tested
length whose mean score exceeds it."""

REFERENCE_COPIES = ("ruler", "string")


@dataclass(frozen=True)
class RulerOptions:
    """Where the reference copies disagree, and the QA files.

    copy: ruler -- NVIDIA/RULER as of 2025 (the default); string -- the copy in HKUNLP/STRING
    `ruler/` (RULER at 5973c2a): vt's answer prefix "assgined" and its prompt layout (lines
    joined by " ", a blank line before the question, one in-context example with collapsed
    whitespace shared by all samples, "\n\n" + "\n\n" after it; variable_tracking.py), the
    cwe example's answer glued to its prefix (no space). Its other differences (a linear
    length search counting the answer, no essay repetition) are not followed.
    """

    copy: str = "ruler"
    squad_path: str | None = None
    """SQuAD v2 dev JSON (qa_1); without it qa_1 cannot be generated."""
    hotpotqa_path: str | None = None
    """HotpotQA dev (distractor) JSON (qa_2)."""

    def __post_init__(self) -> None:
        if self.copy not in REFERENCE_COPIES:
            from longctx.errors import ConfigError

            raise ConfigError("eval.ruler.copy", f"{self.copy!r} is not one of {REFERENCE_COPIES}")
