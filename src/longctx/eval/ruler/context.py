"""What every RULER generator shares for one tokenizer: the piece cache, the chat frame,
the essay's words tokenised once, the word lists, the options and the random streams.

Randomness: sample (seed, task, length, index) draws from numpy's generator seeded with
[seed, crc32(task), length, index], so a sample never depends on which others were drawn.
Where RULER shuffles with a fresh `random.Random(random_seed)` (the same permutation for
every sample whose list has the same size: cwe's and fwe's word lists, qa's documents, the
needles), `fixed_permutation(size)` is seeded with [seed, size] only, as that is.
"""

from __future__ import annotations

import functools
import uuid
import zlib

import numpy as np

from longctx.eval.prompt_frame import BARE, PromptFrame, TextTokenizer
from longctx.eval.prompt_pieces import PieceEncoder, Ragged
from longctx.eval.ruler.constants import RulerOptions
from longctx.eval.ruler.sources import Essay, paul_graham_essay, wonderwords_lists


class RulerContext:
    def __init__(
        self,
        tokenizer: TextTokenizer,
        frame: PromptFrame = BARE,
        options: RulerOptions | None = None,
        seed: int = 0,
        essay: Essay | None = None,
    ):
        self.tokenizer = tokenizer
        self.encoder = PieceEncoder(tokenizer)
        self.frame = frame
        self.options = options or RulerOptions()
        self.seed = seed
        self._essay = essay
        self._numbered: Ragged | None = None
        self.memo: dict[object, object] = {}
        """Per-context results computed once (vt's example, qa's datasets and their ids)."""

    def rng(self, task: str, length: int, index: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, zlib.crc32(task.encode()), length, index])

    def fixed_permutation(self, size: int) -> np.ndarray:
        return np.random.default_rng([self.seed, size]).permutation(size)

    # ------------------------------------------------------------------ essay

    @functools.cached_property
    def essay(self) -> Essay:
        return self._essay or paul_graham_essay()

    @functools.cached_property
    def essay_words(self) -> Ragged:
        """Ids of " " + word for every essay word."""
        return self.encoder.ragged([" " + word for word in self.essay.words])

    @functools.cached_property
    def essay_first_word(self) -> np.ndarray:
        return self.encoder.ids(self.essay.words[0])

    def essay_run(self, start: int, stop: int, first: bool) -> tuple[np.ndarray, str]:
        """Words [start, stop) of the (repeated) essay joined by spaces; `first`: no space before the first."""
        count = len(self.essay.words)
        indices = np.arange(start, stop) % count
        ids = self.essay_words.gather(indices)
        words = self.essay.words
        text = self.essay.span(start, stop)
        if not first:
            return ids, " " + text
        if not len(indices):
            return ids, text
        head = self.essay_first_word if indices[0] == 0 else self.encoder.ids(words[indices[0]])
        return np.concatenate([head, ids[self.essay_words.lengths[indices[0]] :]]), text

    def essay_tokens(self, num_words: int) -> int:
        """Tokens of the first `num_words` words (spaced; the first word's own spelling may differ by a token)."""
        full, rest = divmod(num_words, len(self.essay.words))
        offsets = self.essay_words.offsets
        return int(full * offsets[-1] + offsets[rest])

    # ------------------------------------------------------------------ words

    @functools.cached_property
    def key_words(self) -> tuple[list[str], list[str]]:
        """Adjectives and nouns (distinct, sorted): RULER's keys are 'adjective-noun'."""
        lists = wonderwords_lists()
        return sorted(set(lists["adjectives"])), sorted(set(lists["nouns"]))

    @functools.cached_property
    def cwe_word_ids(self) -> Ragged:
        """Ids of " " + word for every word of `cwe_words`."""
        return self.encoder.ragged([" " + word for word in self.cwe_words])

    @functools.cached_property
    def cwe_words(self) -> list[str]:
        """Nouns + adjectives + verbs, distinct and sorted, in RULER's shuffled order."""
        lists = wonderwords_lists()
        words = sorted(set(lists["nouns"] + lists["adjectives"] + lists["verbs"]))
        return [words[i] for i in self.fixed_permutation(len(words))]

    def random_value(self, kind: str, rng: np.random.Generator) -> str:
        """RULER's numbers (7 digits), words (adjective-noun) and uuids (version 4)."""
        if kind == "numbers":
            return str(int(rng.integers(10**6, 10**7)))
        if kind == "words":
            adjectives, nouns = self.key_words
            return f"{adjectives[rng.integers(len(adjectives))]}-{nouns[rng.integers(len(nouns))]}"
        if kind == "uuids":
            return str(uuid.UUID(int=int.from_bytes(rng.bytes(16), "big"), version=4))
        raise ValueError(f"unknown needle type {kind!r}")

    def numbered(self, count: int) -> Ragged:
        """Ids of " {i}." for i = 1..count (cwe's list numbers), extended on demand."""
        if self._numbered is None or len(self._numbered) < count:
            size = max(count, 2 * len(self._numbered) if self._numbered else 4096)
            self._numbered = self.encoder.ragged([f" {i}." for i in range(1, size + 1)])
        return self._numbered
