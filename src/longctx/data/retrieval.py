"""Retrieval documents for the training mixture: key->value facts, then questions about them.

STRING's effect needs a model that retrieves at all (docs/design.md §13): natural text does not
teach a tiny model to copy a number from far back within a CPU budget, so this source adds
documents whose only hard-to-predict tokens are values stated earlier in the same document.
One document:

    Inventory of the Pelor depot.
    <filler sentence> <filler sentence> The crate tovamek holds 48213 units. <filler> ...
    How many units does the crate tovamek hold? It holds 48213 units.
    ...
    Which counts were listed? The counts were 48213, 90317, 55102 and 71840.

`facts` facts sit at uniformly random sentence slots among `filler` sentences drawn from
the embedded pydoc prose; `queries` of them are asked at the end in random order, then
(with `list_query`) all values are asked for at once, in order of appearance. Nothing is
hand-placed: a fact's distance to its question is the number of tokens after it in its
document, so the distance distribution follows from the document lengths (the filler
count is log-uniform in [filler_min, filler_max], a left-skewed length distribution like
natural corpora's, STRING §2.2; with `filler_tail` alpha > 0, n + 1 is a truncated Pareto
with P(n + 1 > x) ~ x^-alpha: most documents short, long distances rare; `filler_count`) and, once packed, from where row boundaries cut documents
(a fact and its question in different rows of a document-masked batch cannot be linked).

Disjoint from the NIAH evaluation (eval/niah/generator.py) by construction, checked in tests:
values have `value_digits` digits (NIAH: 6 for STRING's task, 7 for RULER's); keys are
generated consonant-vowel pseudo-words (NIAH: adjective-noun words, UUIDs, none for the
paper task); the wording never says "magic", "special", "needle" or "number"; the filler
is Python's help text (NIAH: Paul Graham's essays). What transfers to NIAH is the skill of
copying digits seen earlier when asked to list them, not the text.

Randomness: document k draws from numpy's generator seeded with [seed, k], so a document
never depends on how many others were generated.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from longctx.config.data import NIAH_DIGITS, RetrievalConfig
from longctx.data.corpus import Document, embedded_documents
from longctx.errors import DataError

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_PLACES = ("Pelor", "Quinta", "Marrow", "Tessel", "Obrin", "Valda", "Corvi", "Heddon")
_HEADER = "Inventory of the {place} depot.\n"
_FACT = " The crate {key} holds {value} units."
_QUESTION = "\nHow many units does the crate {key} hold? It holds {value} units."
_LIST_QUESTION = "\nWhich counts were listed? The counts were "
RETRIEVAL_PHRASES = (_HEADER, _FACT, _QUESTION, _LIST_QUESTION)
"""Every `inventory` template; tests check none shares wording with a NIAH task."""

NIAH_NEEDLE = " One of the magic numbers is {value}."
NIAH_LIST_QUESTION = "\n\nWhat are the magic numbers mentioned in the provided text?\nThe numbers are "
"""The `niah` template: STRING's NIAH needle, question and answer prefix (Table 5), the same
strings as eval/niah/needles.py's `paper` task (checked in tests; data/ may not import eval/)."""
REPEAT_FIRST = "Sequence:"
REPEAT_AGAIN = "\nSequence again:"
"""The `repeat` template: `facts` numbers after REPEAT_FIRST, the same after REPEAT_AGAIN."""
FILLER_MIN_CHARS = 20
"""Filler sentences shorter than this (headings, stray fragments) are not used."""


@lru_cache(maxsize=1)
def filler_sentences() -> tuple[str, ...]:
    """Sentences of the embedded prose (Python's pydoc help topics), whitespace collapsed."""
    from longctx.data.sentences import split_sentences

    sentences = []
    for document in embedded_documents(("prose",)):
        for sentence in split_sentences(" ".join(document.text.split())):
            if len(sentence.strip()) >= FILLER_MIN_CHARS:
                sentences.append(" " + sentence.strip())
    return tuple(sentences)


def _pseudo_word(rng: np.random.Generator) -> str:
    syllables = int(rng.integers(2, 4))
    return (
        "".join(
            _CONSONANTS[rng.integers(len(_CONSONANTS))] + _VOWELS[rng.integers(len(_VOWELS))] for _ in range(syllables)
        )
        + _CONSONANTS[rng.integers(len(_CONSONANTS))]
    )


def _distinct(draw, count: int) -> list[str]:
    values: list[str] = []
    while len(values) < count:
        value = draw()
        if value not in values:
            values.append(value)
    return values


@dataclass(frozen=True)
class RetrievalDocument:
    """One generated document and where its facts and answers are (character offsets)."""

    text: str
    keys: tuple[str, ...]
    values: tuple[str, ...]
    fact_offsets: tuple[int, ...]
    """Character offset of each fact's value in `text`, in order of appearance."""
    answer_offsets: tuple[tuple[int, int], ...]
    """(fact index, character offset of the value in an answer), for every answer."""


def make_document(config: RetrievalConfig, index: int, filler: Sequence[str] | None = None) -> RetrievalDocument:
    """Document `index` of the source (deterministic in (config.seed, index))."""
    filler = filler_sentences() if filler is None else filler
    rng = np.random.default_rng([config.seed, index])
    if config.template == "repeat":
        return _repeat_document(config, rng)
    n_filler = filler_count(config, rng)
    keys = _distinct(lambda: _pseudo_word(rng), config.facts) if config.template == "inventory" else []
    lengths = value_lengths(config)
    values = _distinct(lambda: _random_number(rng, lengths), config.facts)
    slots = np.sort(rng.integers(0, n_filler + 1, size=config.facts))
    sentences = [filler[i] for i in rng.integers(0, len(filler), size=n_filler)]

    niah = config.template == "niah"
    text = "" if niah else _HEADER.format(place=_PLACES[rng.integers(len(_PLACES))])
    fact_offsets = []
    fact = 0
    for slot in range(n_filler + 1):
        while fact < config.facts and slots[fact] == slot:
            if niah:
                piece = NIAH_NEEDLE.format(value=values[fact])
                fact_offsets.append(len(text) + piece.rindex(values[fact]))
            else:
                piece = _FACT.format(key=keys[fact], value=values[fact])
                fact_offsets.append(len(text) + piece.index(values[fact] + " units"))
            text += piece
            fact += 1
        if slot < n_filler:
            text += sentences[slot]
    answers = []
    for asked in rng.permutation(config.facts)[: config.queries]:
        piece = _QUESTION.format(key=keys[asked], value=values[asked])
        answers.append((int(asked), len(text) + piece.rindex(values[asked])))
        text += piece
    if config.list_query:
        piece = NIAH_LIST_QUESTION if niah else _LIST_QUESTION
        for i, value in enumerate(values):
            piece += "" if i == 0 else (" and " if i == len(values) - 1 else ", ")
            answers.append((i, len(text) + len(piece)))
            piece += value
        piece += "."
        text += piece
    return RetrievalDocument(text, tuple(keys), tuple(values), tuple(fact_offsets), tuple(answers))


def filler_count(config: RetrievalConfig, rng: np.random.Generator) -> int:
    """The filler sentences of one document: n = floor(x) - 1, x in [a, b) with a =
    filler_min + 1, b = filler_max + 1 and one uniform draw u. filler_tail = 0: x = a (b/a)^u,
    log-uniform. filler_tail = alpha > 0: x = a (1 - u (1 - (a/b)^alpha))^(-1/alpha), the
    inverse CDF of a Pareto(alpha) truncated to [a, b): P(x >= t) = (t^-alpha - b^-alpha) /
    (a^-alpha - b^-alpha)."""
    low, high = math.log(config.filler_min + 1), math.log(config.filler_max + 1)
    if high <= low:
        return config.filler_min
    if config.filler_tail > 0:
        a, b, alpha = config.filler_min + 1, config.filler_max + 1, config.filler_tail
        x = a * (1 - rng.uniform() * (1 - (a / b) ** alpha)) ** (-1 / alpha)
    else:
        x = math.exp(rng.uniform(low, high))
    return min(max(math.floor(x) - 1, config.filler_min), config.filler_max)


def _repeat_document(config: RetrievalConfig, rng: np.random.Generator) -> RetrievalDocument:
    """`facts` distinct numbers, then the same numbers in the same order: each number of the
    second half is an answer whose fact is its first occurrence."""
    lengths = value_lengths(config)
    values = _distinct(lambda: _random_number(rng, lengths), config.facts)
    text, offsets = "", []
    for prefix in (REPEAT_FIRST, REPEAT_AGAIN):
        text += prefix
        for value in values:
            text += " "
            offsets.append(len(text))
            text += value
    facts = tuple(offsets[: len(values)])
    answers = tuple(enumerate(offsets[len(values) :]))
    return RetrievalDocument(text + ".", (), tuple(values), facts, answers)


def value_lengths(config: RetrievalConfig) -> list[int]:
    """The digit counts a value may have: [value_digits, value_digits_max] minus NIAH's {6, 7}."""
    top = max(config.value_digits, config.value_digits_max)
    return [digits for digits in range(config.value_digits, top + 1) if digits not in NIAH_DIGITS]


def _random_number(rng: np.random.Generator, lengths: Sequence[int]) -> str:
    # One length draws nothing for it, so configs without value_digits_max generate the
    # same documents (and prepared-data cache key) whether or not the key is set.
    digits = lengths[int(rng.integers(len(lengths)))] if len(lengths) > 1 else lengths[0]
    return str(rng.integers(10 ** (digits - 1), 10**digits))


def retrieval_documents(config: RetrievalConfig) -> Iterator[Document]:
    """The source as corpus `Document`s (domain 'retrieval'), for `longctx prepare`."""
    config.validate()
    filler = filler_sentences()
    for index in range(config.documents):
        yield Document(f"retrieval:{config.seed}:{index}", make_document(config, index, filler).text, "retrieval")


def answer_distances(tokenizer, config: RetrievalConfig, count: int = 2000) -> np.ndarray:
    """Token distance from each fact's value to each answer copying it, over `count` documents.

    A distance is len(encode(text[:answer])) - len(encode(text[:fact])): exact up to a
    token where a BPE merge straddles the cut. This is the needle-question distance whose
    distribution, weighted by how often packing keeps both ends in one row, is the f(i)
    of the retrieval skill (see `retrieval_report`).
    """
    config.validate()
    filler = filler_sentences()
    distances = []
    for index in range(min(count, config.documents)):
        doc = make_document(config, index, filler)
        prefixes = [doc.text[:offset] for offset in doc.fact_offsets]
        prefixes += [doc.text[:offset] for _, offset in doc.answer_offsets]
        lengths = [len(ids) for ids in tokenizer.encode_batch(prefixes)]
        facts, answers = lengths[: len(doc.fact_offsets)], lengths[len(doc.fact_offsets) :]
        distances += [answers[j] - facts[fact] for j, (fact, _) in enumerate(doc.answer_offsets)]
    return np.asarray(distances, dtype=np.int64)


def retrieval_report(distances: np.ndarray, windows: Sequence[int]) -> dict[str, float]:
    """Summary of needle-question distances and the share a window of L can train.

    In a packed stream a document starts at a uniformly random offset of its row, so a
    pair d tokens apart lands in one row with probability max(0, 1 - d / L) (docs/design.md §13:
    distance density in a window is proportional to L - d). `trainable_{L}` is the mean of
    that probability over all pairs; `median`/`p90`/`max` describe the raw distances.
    """
    if len(distances) == 0:
        raise DataError("no needle-question pairs to report on (queries=0 and list_query=false?)")
    distances = np.asarray(distances, dtype=np.float64)
    report = {
        "pairs": len(distances),
        "median": float(np.median(distances)),
        "p90": float(np.percentile(distances, 90)),
        "max": float(distances.max()),
    }
    for window in windows:
        report[f"trainable_{window}"] = float(np.clip(1 - distances / window, 0, 1).mean())
    return report


def distance_frequency(distances: np.ndarray, window: int) -> np.ndarray:
    """Expected trained retrieval pairs per relative distance i < window: count(d=i) x (1 - i/L)."""
    counts = np.bincount(np.clip(np.asarray(distances, dtype=np.int64), 0, window), minlength=window + 1)[:window]
    return counts * (1 - np.arange(window) / window)
